//! Both ends of the decoder: the token embedding in, the final norm and output head out. They
//! load together because a tied head multiplies by the embedding's own matrix, kept once.

use candle_core::{DType, Tensor};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::{Embedding, Linear, RmsNorm};
use crate::weights::{Embedded, TensorName, Weights};

/// The final norm and the output head.
pub(crate) struct Head {
    norm: RmsNorm,
    lm_head: Linear,
    vocab_size: usize,
}

impl Head {
    /// Loads the embedding and the head. A file without an output matrix ties its head to the
    /// embedding whatever the config says, as llama.cpp does; made-up weights follow the config.
    pub(crate) fn load(config: &ModelConfig, w: &mut Weights) -> Result<(Embedding, Head)> {
        let shape = [config.vocab_size, config.hidden_size];
        let output = TensorName::model("output", "lm_head");
        let tied = !w.contains(&output.weight(), !config.tie_word_embeddings);
        let Embedded { embedding, tied_head } =
            w.embedding(&TensorName::model("token_embd", "model.embed_tokens"), shape, tied)?;
        embedding.check_shape(config)?;
        let lm_head = match tied_head {
            Some(head) => head,
            None => w.linear(&output, shape, false)?,
        };
        let norm =
            w.rms_norm(&TensorName::model("output_norm", "model.norm"), config.hidden_size, config.rms_norm_eps)?;
        Ok((embedding, Head { norm, lm_head, vocab_size: config.vocab_size }))
    }

    /// The final norm of rows `rows` of `[rows, hidden]`: `[rows.len(), hidden]`.
    pub(crate) fn norm_rows(&self, x: &Tensor, rows: &[u32]) -> Result<Tensor> {
        if rows.is_empty() {
            return Ok(Tensor::zeros((0, x.dim(1)?), DType::F32, x.device())?);
        }
        let rows = Tensor::from_slice(rows, rows.len(), x.device())?;
        self.norm.forward(&x.index_select(&rows, 0)?)
    }

    /// The final norm of every row of `[rows, hidden]`: what the output head reads, and the
    /// hidden rows a multi-token-prediction head pairs with the next tokens.
    pub(crate) fn norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// `[rows, vocab]` f32 logits of rows already normed.
    pub(crate) fn logits(&self, normed: &Tensor) -> Result<Tensor> {
        if normed.dim(0)? == 0 {
            return Ok(Tensor::zeros((0, self.vocab_size), DType::F32, normed.device())?);
        }
        self.lm_head.forward(normed)
    }
}
