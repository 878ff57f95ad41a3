//! The recurrent state of hybrid models, beside the KV pool: for every sequence slot and every
//! Gated DeltaNet layer, the convolution's last inputs and the delta rule's state matrices, in
//! f32. Allocated once from a budget and owned by the engine as pages are: a forward pass reads
//! and writes the slots its batch names ([`crate::SequenceChunk::state_slot`]) and keeps
//! nothing. A slot can be copied, so a state can be snapshotted and resumed.
//!
//! With a multi-token-prediction head running ([`ModelConfig::mtp_head`]), a slot also keeps
//! the decoder's last normed hidden row: the head pairs it with the next token, so it belongs to
//! the state at a position as the recurrent layers' state does, and travels with it (copies,
//! snapshots, the disk tier).
//!
//! On a CUDA device the pool is GPU memory (one f32 tensor per layer's conv and SSM state), the
//! Gated DeltaNet kernels read and write it in place, and a slot is copied device to device;
//! elsewhere it is host memory (the CPU path's kernels work on it in place).

use std::collections::HashMap;

use candle_core::{Device, Tensor};

use crate::config::{HybridConfig, ModelConfig};
use crate::error::{ModelError, Result};

/// One state array of every slot: host memory or a flat f32 tensor on a device.
#[derive(Debug, Clone)]
pub(crate) enum StateStorage {
    Host(Vec<f32>),
    Tensor(Tensor),
}

impl StateStorage {
    fn zeros(len: usize, device: Option<&Device>) -> Result<Self> {
        Ok(match device {
            None => StateStorage::Host(vec![0.0; len]),
            Some(d) => StateStorage::Tensor(Tensor::zeros(len, candle_core::DType::F32, d)?),
        })
    }

    /// The host values; `None` for a tensor.
    pub(crate) fn host_mut(&mut self) -> Option<&mut [f32]> {
        match self {
            StateStorage::Host(v) => Some(v),
            StateStorage::Tensor(_) => None,
        }
    }

    /// The tensor; `None` for host values.
    pub(crate) fn tensor(&self) -> Option<&Tensor> {
        match self {
            StateStorage::Host(_) => None,
            StateStorage::Tensor(t) => Some(t),
        }
    }

    /// Copies `len` values from `from` to `to` (device to device for a tensor).
    fn copy_within(&mut self, from: usize, to: usize, len: usize) -> Result<()> {
        match self {
            StateStorage::Host(v) => v.copy_within(from..from + len, to),
            StateStorage::Tensor(t) => {
                // candle refuses a slice_set from its own storage: copy the source out first.
                let part = t.narrow(0, from, len)?.copy()?;
                t.slice_set(&part, 0, to)?;
            }
        }
        Ok(())
    }

    /// The values `start..start + len`, in host memory.
    pub(crate) fn read(&self, start: usize, len: usize) -> Result<Vec<f32>> {
        Ok(match self {
            StateStorage::Host(v) => v[start..start + len].to_vec(),
            StateStorage::Tensor(t) => t.narrow(0, start, len)?.to_vec1::<f32>()?,
        })
    }

    /// Overwrites the values from `start` on with `values`.
    pub(crate) fn write(&mut self, start: usize, values: &[f32]) -> Result<()> {
        match self {
            StateStorage::Host(v) => v[start..start + values.len()].copy_from_slice(values),
            StateStorage::Tensor(t) => t.slice_set(&Tensor::new(values, t.device())?, 0, start)?,
        }
        Ok(())
    }

    /// Zeroes `len` values from `start` on.
    fn clear(&mut self, start: usize, len: usize) -> Result<()> {
        match self {
            StateStorage::Host(v) => v[start..start + len].fill(0.0),
            StateStorage::Tensor(t) => {
                t.slice_set(&Tensor::zeros(len, candle_core::DType::F32, t.device())?, 0, start)?
            }
        }
        Ok(())
    }
}

/// One Gated DeltaNet layer's state of every slot.
#[derive(Debug, Clone)]
pub struct LayerState {
    /// `[slots, conv_kernel - 1, conv_channels]`: the last inputs of the convolution, oldest
    /// first.
    pub(crate) conv: StateStorage,
    /// `[slots, value_heads, key_head_dim, value_head_dim]`: the delta rule's state.
    pub(crate) ssm: StateStorage,
    /// By slot: the last drafted span a pass verified there without advancing the state
    /// ([`crate::SequenceChunk::verify`]), until its accepted rows are applied.
    pub(crate) verified: HashMap<u32, VerifiedSpan>,
}

/// A verified span's recurrent-layer inputs, kept so that the accepted rows can advance the
/// state exactly as a pass computing only them would have.
#[derive(Debug, Clone, Default)]
pub(crate) struct VerifiedSpan {
    /// `[rows, conv channels]`: the convolution's inputs.
    pub(crate) qkv: Vec<f32>,
    /// `[rows, value heads]`: the decay's input (the `a` projection).
    pub(crate) decay_in: Vec<f32>,
    /// `[rows, value heads]`: the delta rule's beta.
    pub(crate) beta: Vec<f32>,
    /// The span began the sequence: its state starts from zero.
    pub(crate) fresh: bool,
    /// Rows applied so far.
    pub(crate) applied: usize,
}

/// The multi-token-prediction head's input carried from one pass to the next.
#[derive(Debug, Clone)]
pub(crate) struct CarriedHidden {
    /// `[slots, hidden]`: the decoder's normed hidden row of each slot's last position.
    pub(crate) rows: Vec<f32>,
    /// By slot: a verified span's hidden rows and how many of them were applied.
    pub(crate) verified: HashMap<u32, (Vec<f32>, usize)>,
}

/// Recurrent state slots for a hybrid model.
#[derive(Debug, Clone)]
pub struct StatePool {
    conv_len: usize,
    ssm_len: usize,
    num_slots: usize,
    /// One per Gated DeltaNet layer, in layer order.
    pub(crate) layers: Vec<LayerState>,
    /// Width of a carried hidden row (0: no multi-token-prediction head runs).
    hidden: usize,
    pub(crate) carried: CarriedHidden,
}

impl StatePool {
    /// `num_slots` zeroed slots for `config`'s recurrent layers, in host memory.
    pub fn new(config: &ModelConfig, num_slots: usize) -> Result<Self> {
        Self::allocate(config, num_slots, None)
    }

    /// Like [`new`](Self::new), as tensors on `device` (GPU memory on CUDA, where the Gated
    /// DeltaNet kernels work on it in place).
    pub fn on_device(config: &ModelConfig, num_slots: usize, device: &Device) -> Result<Self> {
        Self::allocate(config, num_slots, Some(device))
    }

    fn allocate(config: &ModelConfig, num_slots: usize, device: Option<&Device>) -> Result<Self> {
        let hybrid = hybrid_of(config)?;
        let (conv_len, ssm_len) = (hybrid.conv_state_len(), hybrid.ssm_state_len());
        let layers = (0..hybrid.num_recurrent_layers())
            .map(|_| {
                Ok(LayerState {
                    conv: StateStorage::zeros(num_slots * conv_len, device)?,
                    ssm: StateStorage::zeros(num_slots * ssm_len, device)?,
                    verified: HashMap::new(),
                })
            })
            .collect::<Result<_>>()?;
        let hidden = carried_width(config);
        let carried = CarriedHidden { rows: vec![0.0; num_slots * hidden], verified: HashMap::new() };
        Ok(StatePool { conv_len, ssm_len, num_slots, layers, hidden, carried })
    }

    /// Where the pool lives: `None` for host memory.
    pub fn device(&self) -> Option<&Device> {
        self.layers.first().and_then(|l| l.conv.tensor()).map(Tensor::device)
    }

    /// As many slots as fit in `budget_bytes` (at least one must).
    pub fn with_budget(config: &ModelConfig, budget_bytes: usize) -> Result<Self> {
        let per_slot = Self::slot_bytes(config)?;
        let slots = budget_bytes / per_slot.max(1);
        if slots == 0 {
            return Err(ModelError::KvPool(format!(
                "a state budget of {budget_bytes} bytes holds no sequence's recurrent state of {per_slot} bytes"
            )));
        }
        Self::new(config, slots)
    }

    /// Bytes of one sequence's state across all recurrent layers.
    pub fn slot_bytes(config: &ModelConfig) -> Result<usize> {
        let h = hybrid_of(config)?;
        let values = h.num_recurrent_layers() * (h.conv_state_len() + h.ssm_state_len()) + carried_width(config);
        Ok(values * std::mem::size_of::<f32>())
    }

    /// Slots in the pool.
    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Copies slot `from`'s state in every layer into slot `to`.
    pub fn copy_slot(&mut self, from: u32, to: u32) -> Result<()> {
        self.check(from)?;
        self.check(to)?;
        if from == to {
            return Ok(());
        }
        self.discard_verified(to);
        let (from, to) = (from as usize, to as usize);
        for layer in &mut self.layers {
            layer.conv.copy_within(from * self.conv_len, to * self.conv_len, self.conv_len)?;
            layer.ssm.copy_within(from * self.ssm_len, to * self.ssm_len, self.ssm_len)?;
        }
        let (row, to) = (self.carried_range(from as u32), to * self.hidden);
        self.carried.rows.copy_within(row, to);
        Ok(())
    }

    /// Zeroes slot `slot`: the state before a sequence's first token.
    pub fn clear_slot(&mut self, slot: u32) -> Result<()> {
        self.check(slot)?;
        self.discard_verified(slot);
        let slot = slot as usize;
        for layer in &mut self.layers {
            layer.conv.clear(slot * self.conv_len, self.conv_len)?;
            layer.ssm.clear(slot * self.ssm_len, self.ssm_len)?;
        }
        let range = self.carried_range(slot as u32);
        self.carried.rows[range].fill(0.0);
        Ok(())
    }

    /// Slot `slot`'s state in every layer, conv then SSM, layer after layer, then its carried
    /// hidden row if any (for tests and snapshots).
    pub fn read_slot(&self, slot: u32) -> Result<Vec<f32>> {
        self.check(slot)?;
        let slot = slot as usize;
        let mut out = Vec::with_capacity(self.slot_len());
        for layer in &self.layers {
            out.extend(layer.conv.read(slot * self.conv_len, self.conv_len)?);
            out.extend(layer.ssm.read(slot * self.ssm_len, self.ssm_len)?);
        }
        out.extend_from_slice(self.carried_row(slot as u32));
        Ok(out)
    }

    /// Values of one slot, as [`read_slot`](Self::read_slot) gives them.
    fn slot_len(&self) -> usize {
        self.layers.len() * (self.conv_len + self.ssm_len) + self.hidden
    }

    /// The hidden row slot `slot` carries for the multi-token-prediction head (empty without
    /// one); the caller has checked the slot.
    pub(crate) fn carried_row(&self, slot: u32) -> &[f32] {
        &self.carried.rows[self.carried_range(slot)]
    }

    /// Where slot `slot`'s carried row lies in `carried.rows`.
    fn carried_range(&self, slot: u32) -> std::ops::Range<usize> {
        slot as usize * self.hidden..(slot as usize + 1) * self.hidden
    }

    /// Sets the hidden row slot `slot` carries.
    pub(crate) fn carry(&mut self, slot: u32, row: &[f32]) {
        let range = self.carried_range(slot);
        self.carried.rows[range].copy_from_slice(row);
    }

    /// Keeps a verified span's hidden rows (`[rows, hidden]`) beside slot `slot`: the one of
    /// the last accepted row becomes the carried row ([`apply_verified_carry`](Self::apply_verified_carry)).
    pub(crate) fn keep_verified_carry(&mut self, slot: u32, rows: Vec<f32>) {
        if self.hidden > 0 {
            self.carried.verified.insert(slot, (rows, 0));
        }
    }

    /// Carries the hidden row of the verified span's row `rows.end - 1`; calls continue one
    /// another from row 0, as the recurrent layers' do, and the span goes with its last row.
    pub(crate) fn apply_verified_carry(&mut self, slot: u32, rows: std::ops::Range<usize>) -> Result<()> {
        if self.hidden == 0 || rows.is_empty() {
            return Ok(());
        }
        let (span, applied) = self
            .carried
            .verified
            .remove(&slot)
            .ok_or_else(|| ModelError::Batch(format!("no verified span on state slot {slot} to carry from")))?;
        let len = span.len() / self.hidden;
        if rows.start != applied || rows.end > len {
            return Err(ModelError::Batch(format!(
                "rows {rows:?} of a verified span of {len} rows, {applied} of them applied"
            )));
        }
        let row = &span[(rows.end - 1) * self.hidden..rows.end * self.hidden];
        let row = row.to_vec();
        self.carry(slot, &row);
        if rows.end < len {
            self.carried.verified.insert(slot, (span, rows.end));
        }
        Ok(())
    }

    /// Sets slot `slot`'s state from `values`, in [`read_slot`](Self::read_slot)'s order (a
    /// snapshot read back from disk).
    pub fn write_slot(&mut self, slot: u32, values: &[f32]) -> Result<()> {
        self.check(slot)?;
        let per_layer = self.conv_len + self.ssm_len;
        if values.len() != self.slot_len() {
            return Err(ModelError::KvPool(format!(
                "a state of {} values for slots of {}",
                values.len(),
                self.slot_len()
            )));
        }
        self.discard_verified(slot);
        let (recurrent, carried) = values.split_at(self.layers.len() * per_layer);
        self.carry(slot, carried);
        let slot = slot as usize;
        for (layer, values) in self.layers.iter_mut().zip(recurrent.chunks_exact(per_layer)) {
            let (conv, ssm) = values.split_at(self.conv_len);
            layer.conv.write(slot * self.conv_len, conv)?;
            layer.ssm.write(slot * self.ssm_len, ssm)?;
        }
        Ok(())
    }

    /// Forgets the drafted span last verified on `slot` (its accepted rows applied, or none
    /// to apply): the inputs it kept are freed.
    pub fn discard_verified(&mut self, slot: u32) {
        for layer in &mut self.layers {
            layer.verified.remove(&slot);
        }
        self.carried.verified.remove(&slot);
    }

    /// Whether the pool was made for `config`'s recurrent layers (this many, of these sizes)
    /// and its multi-token-prediction head, running or not.
    pub(crate) fn fits(&self, config: &ModelConfig) -> bool {
        config.hybrid.as_ref().is_some_and(|hybrid| {
            self.layers.len() == hybrid.num_recurrent_layers()
                && self.conv_len == hybrid.conv_state_len()
                && self.ssm_len == hybrid.ssm_state_len()
        }) && self.hidden == carried_width(config)
    }

    fn check(&self, slot: u32) -> Result<()> {
        if (slot as usize) < self.num_slots {
            Ok(())
        } else {
            Err(ModelError::KvPool(format!("state slot {slot} is outside the pool's {} slots", self.num_slots)))
        }
    }
}

/// Values of the hidden row a slot carries for `config`'s multi-token-prediction head (0
/// without one running).
fn carried_width(config: &ModelConfig) -> usize {
    if config.mtp_head { config.hidden_size } else { 0 }
}

fn hybrid_of(config: &ModelConfig) -> Result<&HybridConfig> {
    config.hybrid.as_ref().ok_or_else(|| {
        ModelError::KvPool(format!(
            "a {} model has no recurrent layers and needs no state pool",
            config.arch.gguf_name()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        ModelConfig::from_hf_json(
            r#"{"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96, "vocab_size": 32,
                "rms_norm_eps": 1e-6, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "linear_key_head_dim": 8, "linear_value_head_dim": 6, "linear_conv_kernel_dim": 4}"#,
        )
        .unwrap()
    }

    /// Copying a slot copies exactly that slot in every layer; clearing zeroes exactly one; a
    /// slot written from values reads them back.
    #[test]
    fn copy_and_clear_touch_exactly_one_slot() {
        let c = config();
        for device in [None, Some(Device::Cpu)] {
            let pool = match &device {
                None => StatePool::new(&c, 3).unwrap(),
                Some(d) => StatePool::on_device(&c, 3, d).unwrap(),
            };
            assert_eq!(pool.device().is_some(), device.is_some());
            one_slot_at_a_time(pool);
        }
        let per_layer = (3 * 56 + 4 * 8 * 6) * 4;
        assert_eq!(StatePool::slot_bytes(&c).unwrap(), 3 * per_layer);
    }

    /// Copy, clear, read and write on `pool` (3 slots of `config()`), whatever its storage.
    fn one_slot_at_a_time(mut pool: StatePool) {
        assert_eq!(pool.layers.len(), 3, "layers 0-2 recurrent, 3 full attention");
        let (conv_len, ssm_len) = (pool.conv_len, pool.ssm_len);
        for (l, layer) in pool.layers.iter_mut().enumerate() {
            let conv: Vec<f32> = (0..3 * conv_len).map(|i| (l * 100_000 + i) as f32).collect();
            let ssm: Vec<f32> = (0..3 * ssm_len).map(|i| (l * 100_000 + 3 * conv_len + i) as f32).collect();
            layer.conv.write(0, &conv).unwrap();
            layer.ssm.write(0, &ssm).unwrap();
        }
        let (s0, s2) = (pool.read_slot(0).unwrap(), pool.read_slot(2).unwrap());
        pool.copy_slot(0, 1).unwrap();
        assert_eq!(pool.read_slot(1).unwrap(), s0);
        assert_eq!(pool.read_slot(2).unwrap(), s2);
        pool.clear_slot(0).unwrap();
        assert!(pool.read_slot(0).unwrap().iter().all(|&v| v == 0.0));
        assert_eq!(pool.read_slot(1).unwrap(), s0);
        assert!(pool.copy_slot(0, 3).is_err() && pool.clear_slot(3).is_err());
        pool.write_slot(2, &s0).unwrap();
        assert_eq!(pool.read_slot(2).unwrap(), s0, "a slot written reads back");
        assert_eq!(pool.read_slot(1).unwrap(), s0);
        assert!(pool.write_slot(2, &s0[1..]).is_err() && pool.write_slot(3, &s0).is_err());
    }
}
