//! The multi-token-prediction head of Qwen3.5/3.6 (GGUF `nextn` layers, transformers
//! checkpoints' `mtp.*`; llama.cpp's `graph_mtp`): one more gated full-attention decoder layer
//! whose input at position `p` is `eh_proj(concat(enorm(embed(x_p)), hnorm(h_{p-1})))`,
//! `h_{p-1}` being the decoder's normed hidden row at the position before (the one that
//! predicted `x_p`); its output, normed by `shared_head_norm`, goes through the model's output
//! head and guesses the token after `x_p`, a step further than the decoder has come. It drafts
//! for speculative decoding.
//!
//! Its attention has a KV pool layer of its own (the pool's last), which the decoder's every
//! pass fills for its rows ([`MtpHead::write_kv`]: K/V only, nothing else of the layer), so
//! the head's K/V at a position is a function of the prefix alone and is cached, shared and
//! evicted with the decoder's pages. The row the next pass pairs with its first token travels
//! in the sequence's state slot ([`crate::StatePool`]).

use candle_core::{DType, Tensor};

use super::backend::ForwardContext;
use super::decoder_layer::{DecoderLayer, LayerCache};
use super::{LoadOptions, Model};
use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv_pool::{KvPool, LayerKv};
use crate::layers::{Linear, RmsNorm};
use crate::state_pool::StatePool;
use crate::weights::{TensorName, Weights};

/// Why the file's multi-token-prediction head is not loaded: `None` to load it, `Some(None)`
/// when there is nothing to say (the file has none), else the load note.
pub(super) fn skip_reason(
    config: &ModelConfig,
    options: &LoadOptions,
    tensor_path: bool,
    w: &Weights,
) -> Option<Option<String>> {
    if config.mtp_layers == 0 {
        return Some(None);
    }
    let skipped = |why: &str| {
        Some(Some(format!("skipped the multi-token-prediction head's {} layer(s): {why}", config.mtp_layers)))
    };
    let head = |gguf: &str, hf: &str| TensorName::layer(config.num_layers, gguf, hf).weight();
    if !options.mtp {
        skipped("speculative decoding with `--spec-type draft-mtp` runs it")
    } else if config.hybrid.is_none() {
        skipped("it runs for Qwen3.5/3.6 models only, not yet for this architecture")
    } else if tensor_path {
        skipped("it runs on the CPU path only")
    } else if w.contains(&head("nextn.embed_tokens", "embed_tokens"), false)
        || w.contains(&head("nextn.shared_head_head", "shared_head.head"), false)
    {
        skipped("its own embedding or output head is not supported yet")
    } else {
        None
    }
}

/// A sequence the multi-token-prediction head drafts for ([`Model::draft_mtp`]).
#[derive(Debug, Clone)]
pub struct MtpDraftRequest<'a> {
    /// The sequence's last token: sampled, not yet computed, at position `position`.
    pub token: u32,
    /// Its position: the sequence's computed tokens.
    pub position: usize,
    /// Pages covering positions `0..position + max_tokens`: each drafting step writes the
    /// head's K/V at the position of the token it reads.
    pub page_table: &'a [u32],
    /// The sequence's state slot, carrying the decoder's hidden row at `position - 1`.
    pub state_slot: u32,
    /// Most tokens to draft.
    pub max_tokens: usize,
}

/// The first multi-token-prediction head.
pub(crate) struct MtpHead {
    /// `[hidden, 2 * hidden]`: the normed embedding and hidden row to the layer's input.
    eh_proj: Linear,
    enorm: RmsNorm,
    hnorm: RmsNorm,
    layer: DecoderLayer,
    /// The norm before the output head (the model's final norm where the file has none).
    head_norm: RmsNorm,
}

impl MtpHead {
    /// Loads the head stored as decoder layer `config.num_layers` (the first after the
    /// decoder's own), as llama.cpp's converter writes it (a transformers checkpoint's `mtp.*`
    /// are found under those names by the safetensors source).
    pub(crate) fn load(config: &ModelConfig, w: &mut Weights) -> Result<Self> {
        let (il, hidden, eps) = (config.num_layers, config.hidden_size, config.rms_norm_eps);
        let name = |gguf: &str, hf: &str| TensorName::layer(il, gguf, hf);
        let head_norm = match w.contains(&name("nextn.shared_head_norm", "shared_head.norm").weight(), false) {
            true => name("nextn.shared_head_norm", "shared_head.norm"),
            false => TensorName::model("output_norm", "model.norm"),
        };
        Ok(MtpHead {
            eh_proj: w.linear(&name("nextn.eh_proj", "eh_proj"), [hidden, 2 * hidden], false)?,
            enorm: w.rms_norm(&name("nextn.enorm", "enorm"), hidden, eps)?,
            hnorm: w.rms_norm(&name("nextn.hnorm", "hnorm"), hidden, eps)?,
            layer: DecoderLayer::load(config, il, w)?,
            head_norm: w.rms_norm(&head_norm, hidden, eps)?,
        })
    }

    /// The layer's input rows from the embedded tokens and the hidden rows they pair with
    /// (both `[rows, hidden]`).
    fn input(&self, embedded: &Tensor, hidden: &Tensor) -> Result<Tensor> {
        let both = Tensor::cat(&[self.enorm.forward(embedded)?, self.hnorm.forward(hidden)?], 1)?;
        self.eh_proj.forward(&both)
    }

    /// Writes the rows' K/V into the head's pool layer `kv` and computes nothing else: what
    /// the decoder's pass does for every row, so later drafts attend over the whole prefix.
    pub(crate) fn write_kv(
        &self,
        embedded: &Tensor,
        hidden: &Tensor,
        ctx: &ForwardContext,
        kv: &mut LayerKv,
    ) -> Result<()> {
        self.layer.write_kv(&self.input(embedded, hidden)?, ctx, kv)
    }

    /// The rows through the head, attending over their contexts in `kv` (their own K/V written
    /// there first): `[rows, hidden]` normed for the output head, which is also the hidden row
    /// the next drafting step pairs with its token.
    pub(crate) fn forward(
        &self,
        embedded: &Tensor,
        hidden: &Tensor,
        ctx: &ForwardContext,
        kv: &mut LayerKv,
    ) -> Result<Tensor> {
        let x = self.layer.forward(&self.input(embedded, hidden)?, ctx, LayerCache::Kv(kv))?;
        self.head_norm.forward(&x)
    }
}

impl Model {
    /// Whether the multi-token-prediction head is loaded ([`LoadOptions::mtp`]).
    pub fn has_mtp_head(&self) -> bool {
        self.mtp.is_some()
    }

    /// The end of a decoder pass with the multi-token-prediction head: the final norm of every
    /// row `x`, the head's K/V of every row (each paired with the hidden row before it: a
    /// chunk's first with its slot's carried row, zeros at position 0), each slot's carried row
    /// moved to its chunk's last (a verified span's rows kept until its accepted ones are
    /// known); returns the normed rows that want logits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_pass_with_mtp(
        &self,
        mtp: &MtpHead,
        batch: &ForwardBatch,
        ctx: &ForwardContext,
        embedded: &Tensor,
        x: &Tensor,
        kv: &mut LayerKv,
        state: &mut StatePool,
    ) -> Result<Tensor> {
        let hidden = self.config.hidden_size;
        let normed = self.head.norm(x)?;
        let rows = normed.flatten_all()?.to_vec1::<f32>()?;
        let row = |r: usize| &rows[r * hidden..(r + 1) * hidden];
        let mut previous = Vec::with_capacity(rows.len());
        for chunk in &batch.sequences {
            let slot = chunk.state_slot.ok_or_else(|| ModelError::Batch("a sequence without a state slot".into()))?;
            match chunk.context_len == chunk.len {
                true => previous.resize(previous.len() + hidden, 0.0),
                false => previous.extend_from_slice(state.carried_row(slot)),
            }
            (chunk.start..chunk.start + chunk.len - 1).for_each(|r| previous.extend_from_slice(row(r)));
            let last = chunk.start + chunk.len - 1;
            match chunk.verify {
                true => state.keep_verified_carry(slot, rows[chunk.start * hidden..(last + 1) * hidden].to_vec()),
                false => state.carry(slot, row(last)),
            }
        }
        let previous = Tensor::from_vec(previous, (batch.tokens.len(), hidden), x.device())?;
        mtp.write_kv(embedded, &previous, ctx, kv)?;
        let logit_rows = batch.logit_rows();
        if logit_rows.is_empty() {
            return Ok(Tensor::zeros((0, hidden), DType::F32, x.device())?);
        }
        let logit_rows = Tensor::from_slice(&logit_rows, logit_rows.len(), x.device())?;
        Ok(normed.index_select(&logit_rows, 0)?)
    }

    /// Drafts tokens to follow each request's last token with the multi-token-prediction head,
    /// greedily and step by step (each step one row per sequence still drafting, its token
    /// paired with the head's own output row of the step before, as llama.cpp's `draft-mtp`
    /// does): a sequence stops at `max_tokens` or before the first token whose probability is
    /// below `p_min`. The steps write the head's K/V at the drafted positions, which the pass
    /// verifying the drafts overwrites with the decoder's. Returns each request's draft.
    pub fn draft_mtp(
        &self,
        kv: &mut KvPool,
        state: &StatePool,
        requests: &[MtpDraftRequest],
        p_min: f32,
    ) -> Result<Vec<Vec<u32>>> {
        let mtp = self
            .mtp
            .as_ref()
            .ok_or_else(|| ModelError::Config("the model has no multi-token-prediction head loaded".into()))?;
        let (hidden, layout) = (self.config.hidden_size, *kv.layout());
        let head_kv = kv.layers.last_mut().ok_or_else(|| ModelError::KvPool("a pool without layers".into()))?;
        let mut drafts = vec![Vec::new(); requests.len()];
        // (request, token, the hidden row it pairs with)
        let mut drafting: Vec<(usize, u32, Vec<f32>)> = Vec::new();
        for (i, r) in requests.iter().enumerate().filter(|(_, r)| r.max_tokens > 0) {
            if r.state_slot as usize >= state.num_slots() {
                return Err(ModelError::Batch(format!("state slot {} is outside the pool", r.state_slot)));
            }
            drafting.push((i, r.token, state.carried_row(r.state_slot).to_vec()));
        }
        self.threads.install(|| {
            for step in 0.. {
                if drafting.is_empty() {
                    break;
                }
                let mut batch = ForwardBatch::default();
                for &(i, token, _) in &drafting {
                    let r = &requests[i];
                    batch.push(&[token], r.position + step + 1, r.page_table.to_vec(), true);
                }
                batch.validate(layout.page_size, layout.num_pages, self.config.vocab_size)?;
                let ctx =
                    ForwardContext::new(&self.config, &self.rope, &batch, layout, &self.device, self.tensor_path)?;
                let ids = Tensor::from_slice(&batch.tokens, batch.tokens.len(), &self.device)?;
                let paired: Vec<f32> = drafting.iter().flat_map(|(_, _, h)| h.iter().copied()).collect();
                let paired = Tensor::from_vec(paired, (drafting.len(), hidden), &self.device)?;
                let out = mtp.forward(&self.embedding.forward(&ids)?, &paired, &ctx, head_kv)?;
                let logits = self.head.logits(&out)?.to_vec2::<f32>()?;
                let out = out.to_vec2::<f32>()?;
                let mut next = Vec::new();
                for ((i, _, _), (row, h)) in drafting.drain(..).zip(logits.iter().zip(out)) {
                    let (token, p) = most_likely(row);
                    if p < p_min {
                        continue;
                    }
                    drafts[i].push(token);
                    if drafts[i].len() < requests[i].max_tokens {
                        next.push((i, token, h));
                    }
                }
                drafting = next;
            }
            Ok(drafts)
        })
    }
}

/// The most likely token of a logits row and its probability.
fn most_likely(logits: &[f32]) -> (u32, f32) {
    let (best, max) =
        logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |(b, m), (i, &l)| if l > m { (i, l) } else { (b, m) });
    let total: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (best as u32, 1.0 / total)
}
