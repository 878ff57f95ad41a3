//! Errors of the kernels: every shape or bounds inconsistency of the inputs.

/// A shape or bounds inconsistency found while validating a kernel's inputs.
///
/// Kernels validate everything up front and return this before reading or
/// writing anything, so an `Err` leaves every output untouched.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A [`PagedLayout`](crate::PagedLayout) field is zero or its sizes overflow `usize`.
    #[error("invalid paged layout: {0}")]
    InvalidLayout(&'static str),

    /// `num_heads` is zero or not a multiple of `num_kv_heads`.
    #[error("num_heads ({num_heads}) must be a non-zero multiple of num_kv_heads ({num_kv_heads})")]
    HeadsNotMultiple {
        /// Query heads given.
        num_heads: usize,
        /// KV heads of the layout.
        num_kv_heads: usize,
    },

    /// The softmax scale is NaN or infinite.
    #[error("attention scale must be finite, got {0}")]
    NonFiniteScale(f32),

    /// A slice has the wrong length.
    #[error("{what} has length {actual}, expected {expected}")]
    LengthMismatch {
        /// Which argument.
        what: &'static str,
        /// Length required by the layout and the other arguments.
        expected: usize,
        /// Length given.
        actual: usize,
    },

    /// A head's row is not a whole number of a quantized K/V type's blocks.
    #[error(
        "head_dim {head_dim} is not a multiple of the KV type's block of {block} values: use f16 K/V for this model"
    )]
    HeadNotWholeBlocks {
        /// Values per head.
        head_dim: usize,
        /// Values per block of the K or V type.
        block: usize,
    },

    /// A row-major slice's length is not a whole number of rows.
    #[error("{what} has length {len}, not a multiple of its row length {row_len}")]
    RaggedRows {
        /// Which argument.
        what: &'static str,
        /// Length given.
        len: usize,
        /// Elements per row.
        row_len: usize,
    },

    /// A slot id of [`write_kv`](crate::write_kv) is not below `num_pages * page_size`.
    #[error("slot {slot} of row {row} is out of range: the layout has {num_slots} slots")]
    SlotOutOfRange {
        /// Row of the new K/V whose slot is bad.
        row: usize,
        /// The slot id given.
        slot: u32,
        /// Slots in the layout.
        num_slots: usize,
    },

    /// A page id of a sequence's page table is not below `num_pages`.
    #[error("sequence {seq}: page_table[{index}] = {page} is out of range: the layout has {num_pages} pages")]
    PageOutOfRange {
        /// Index of the sequence in the batch.
        seq: usize,
        /// Index into its page table.
        index: usize,
        /// The page id given.
        page: u32,
        /// Pages in the layout.
        num_pages: usize,
    },

    /// A page table does not cover the sequence's context.
    #[error("sequence {seq}: page_table has {len} pages but context_len {context_len} needs {needed}")]
    PageTableTooShort {
        /// Index of the sequence in the batch.
        seq: usize,
        /// Entries in its page table.
        len: usize,
        /// Entries needed: `ceil(context_len / page_size)`.
        needed: usize,
        /// Its context length.
        context_len: usize,
    },

    /// A sequence has `query_len == 0`.
    #[error("sequence {seq}: query_len must be at least 1")]
    EmptyQuery {
        /// Index of the sequence in the batch.
        seq: usize,
    },

    /// A sequence's context is shorter than its new tokens.
    #[error("sequence {seq}: context_len ({context_len}) is less than query_len ({query_len})")]
    ContextShorterThanQuery {
        /// Index of the sequence in the batch.
        seq: usize,
        /// Its context length.
        context_len: usize,
        /// Its number of new tokens.
        query_len: usize,
    },

    /// A sequence's query rows run past the batch's rows of `q`/`out`.
    #[error("sequence {seq}: query rows {start}..{start}+{len} exceed the batch's {n_rows} rows")]
    QueryRowsOutOfBounds {
        /// Index of the sequence in the batch.
        seq: usize,
        /// Its `query_start`.
        start: usize,
        /// Its `query_len`.
        len: usize,
        /// Rows of `q` and `out`.
        n_rows: usize,
    },

    /// A quantized matrix or its inputs have an unusable shape.
    #[error("quantized matmul: {0}")]
    BadQuantized(String),

    /// A dense matrix or its inputs have an unusable shape.
    #[error("dense matmul: {0}")]
    BadShape(String),

    /// A kernel was asked for an instruction set this CPU lacks.
    #[error("the {0} kernel is not available on this CPU")]
    Unavailable(&'static str),

    /// Two sequences claim the same query rows.
    #[error("sequences {first} and {second} have overlapping query rows")]
    QueryRowsOverlap {
        /// Index of one sequence in the batch.
        first: usize,
        /// Index of the other.
        second: usize,
    },

    /// A GPU kernel could not run: unsupported shape, tensors on the wrong device or of the
    /// wrong type, or an error from the driver.
    #[error("GPU attention: {0}")]
    Device(String),
}
