//! The logits of one forward pass as the engine reads them ([`crate::Model::forward_pass`]): a
//! verified span's rows after its first are computed only when first asked for. The engine reads
//! a span's rows in order and stops at the first rejected draft, so a round whose first draft is
//! rejected pays for one output-head row, not one per drafted token; a row computed later is the
//! same bits, since the CPU path's output head is batch-invariant.

use std::sync::OnceLock;

use candle_core::{Device, Tensor};

use super::head::Head;
use crate::batch::ForwardBatch;
use crate::error::{ModelError, Result};

/// Where one logits row is: among the rows computed with the pass, or in a verified span's rest.
#[derive(Debug, Clone, Copy)]
enum RowAt {
    /// Row `i` of the first rows.
    First(usize),
    /// Row `j` of deferred span `span`.
    Later { span: usize, j: usize },
}

/// The rows of one verified span after its first: normed hidden rows, their logits once asked.
struct Deferred {
    normed: Tensor,
    logits: OnceLock<Tensor>,
}

/// `[rows, vocab]` logits in [`ForwardBatch::logit_rows`] order, some computed lazily.
pub struct PassLogits<'m> {
    head: &'m Head,
    /// The model's pool, which the deferred rows' matmuls run on as the pass's did.
    threads: &'m rayon::ThreadPool,
    device: Device,
    /// Every sequence's first logits row (a plain sequence's only one), `[first rows, vocab]`.
    first: Tensor,
    rows: Vec<RowAt>,
    later: Vec<Deferred>,
}

impl<'m> PassLogits<'m> {
    /// The logits of `batch`'s logits rows from their normed hidden rows (`[logit rows,
    /// hidden]`, in [`ForwardBatch::logit_rows`] order): each sequence's first computed now, the
    /// rest of each verified span deferred.
    pub(crate) fn new(
        head: &'m Head,
        threads: &'m rayon::ThreadPool,
        batch: &ForwardBatch,
        normed: &Tensor,
    ) -> Result<Self> {
        let (mut first_rows, mut rows, mut later) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = 0u32;
        for chunk in &batch.sequences {
            let n = match (chunk.verify, chunk.logits) {
                (true, _) => chunk.len,
                (false, true) => 1,
                (false, false) => 0,
            };
            if n == 0 {
                continue;
            }
            rows.push(RowAt::First(first_rows.len()));
            first_rows.push(at);
            if n > 1 {
                let span = later.len();
                rows.extend((0..n - 1).map(|j| RowAt::Later { span, j }));
                let normed = normed.narrow(0, at as usize + 1, n - 1)?;
                later.push(Deferred { normed, logits: OnceLock::new() });
            }
            at += n as u32;
        }
        if at as usize != normed.dim(0)? {
            return Err(ModelError::Batch(format!("{} normed rows for {at} logits rows", normed.dim(0)?)));
        }
        let device = normed.device().clone();
        // No first rows is no rows at all (`normed` is empty), which the head answers as such.
        let first = match first_rows.is_empty() {
            true => head.logits(normed)?,
            false => {
                head.logits(&normed.index_select(&Tensor::from_slice(&first_rows, first_rows.len(), &device)?, 0)?)?
            }
        };
        Ok(PassLogits { head, threads, device, first, rows, later })
    }

    /// Logits rows of the pass.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the pass has no logits row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Where the logits are.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Row `i`'s logits, read back to the host (a deferred span's rows computed on first use).
    pub fn row(&self, i: usize) -> Result<Vec<f32>> {
        let at = *self.rows.get(i).ok_or_else(|| ModelError::Batch(format!("no logits row {i} of {}", self.len())))?;
        Ok(match at {
            RowAt::First(r) => self.first.get(r)?.to_vec1::<f32>()?,
            RowAt::Later { span, j } => self.deferred(span)?.get(j)?.to_vec1::<f32>()?,
        })
    }

    /// Every row's argmax (the deferred rows computed), in order.
    pub fn argmax(&self) -> Result<Vec<u32>> {
        let first = self.first.argmax(1)?.to_vec1::<u32>()?;
        let later: Vec<Vec<u32>> =
            (0..self.later.len()).map(|s| Ok(self.deferred(s)?.argmax(1)?.to_vec1::<u32>()?)).collect::<Result<_>>()?;
        Ok(self
            .rows
            .iter()
            .map(|&at| match at {
                RowAt::First(r) => first[r],
                RowAt::Later { span, j } => later[span][j],
            })
            .collect())
    }

    /// Every row, `[rows, vocab]`.
    pub fn to_tensor(&self) -> Result<Tensor> {
        if self.rows.is_empty() {
            return Ok(self.first.clone());
        }
        let rows: Vec<Tensor> = self
            .rows
            .iter()
            .map(|&at| match at {
                RowAt::First(r) => Ok(self.first.narrow(0, r, 1)?),
                RowAt::Later { span, j } => Ok(self.deferred(span)?.narrow(0, j, 1)?),
            })
            .collect::<Result<_>>()?;
        Ok(Tensor::cat(&rows, 0)?)
    }

    fn deferred(&self, span: usize) -> Result<&Tensor> {
        let d = &self.later[span];
        if let Some(logits) = d.logits.get() {
            return Ok(logits);
        }
        let (head, normed) = (self.head, &d.normed);
        let logits = self.threads.install(|| head.logits(normed))?;
        Ok(d.logits.get_or_init(|| logits))
    }
}
