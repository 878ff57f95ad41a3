//! glibc malloc settings for a process that runs the model's CPU path.

/// Tunes glibc's allocator for a forward pass that allocates and frees buffers of megabytes
/// per operation (activations of candle ops, 8-bit copies of matmul inputs):
///
/// - one arena: every thread of ours allocating in an arena of its own kept ~37 MiB more
///   resident at peak while serving SmolLM2 (540 against 503 MiB, same requests);
/// - buffers up to 32 MiB (glibc's largest allowed threshold) come from the heap rather than a
///   fresh `mmap`, and up to 256 MiB of freed heap is kept rather than returned: otherwise
///   each such buffer is mapped, zero-filled page by page on first touch and unmapped again,
///   every operation of every forward. Prefill of the Qwen3-0.6B-shaped Q4_K_M model rose
///   from 435-455 to 486 tok/s at 512 tokens and from 318-320 to 350 at 2048 with it
///   (`model-bench`, A/B/A/B; benches/README.md); SmolLM2 moved within noise (pp512 equal,
///   decode at depth 2048 0-4% slower in six alternating runs). Peak memory does not grow:
///   the heap is kept at the size the largest forward already needed.
///
/// Call it first thing in `main`, before other threads exist. No-op off glibc.
pub fn configure_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; the caller runs this before other threads
    // exist (documented above).
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Hands the heap pages freed since start-up back to the system. The GGUF header's metadata
/// (the vocabulary and merges as hundreds of thousands of small strings: 8-30 MiB on the
/// models we bench) is freed once the model is built, but glibc keeps freed heap resident
/// (up to the 256 MiB `M_TRIM_THRESHOLD` above), so the process held it as if it were
/// weights: `model-bench`'s load added 101.8 MiB for SmolLM2's 93.8 MiB file and 400.6 for the
/// Qwen3-0.6B shape's 378.3; 93.9 and 374.3 with this. `Model`'s GGUF load calls it; a
/// program that parses the header again afterwards (a tokenizer, a template) calls it once
/// more when it has. No-op off glibc.
pub fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free heap memory to the system; it touches no live
    // allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
