//! Rotary position embeddings at arbitrary per-token positions, applied in place.
//!
//! Tokens of a batch belong to different sequences at different positions, so the cos/sin rows
//! are computed per token once per forward call and shared by every layer: applied in place to
//! host rows on the CPU path, or uploaded once ([`RopeTensors`]) for candle's rotary kernels on
//! the tensor path.

use candle_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::error::Result;

/// How a head's dimensions pair up for rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Dimension `i` pairs with `i + head_dim/2` (Hugging Face's `rotate_half`; Qwen in GGUF).
    Neox,
    /// Dimension `2i` pairs with `2i + 1` (Llama in GGUF, whose converter permuted q and k).
    Interleaved,
}

/// Inverse frequencies of a model's RoPE, scaling included.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    position_scale: f32,
    layout: RopeLayout,
}

/// cos/sin of every token of a batch: `[tokens, rotary_dim/2]` each.
#[derive(Debug, Clone, Default)]
pub struct RopeAngles {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RopeAngles {
    /// cos and sin, `[tokens, rotary_dim/2]` row-major each, and rotary_dim/2.
    pub fn cos_sin(&self) -> (&[f32], &[f32], usize) {
        (&self.cos, &self.sin, self.half)
    }
}

impl Rope {
    /// Builds the frequencies as transformers does (f32 `inv_freq`), with Llama 3 scaling from the
    /// config or llama.cpp's per-frequency divisors (`rope_freqs.weight`) when given.
    pub fn new(config: &ModelConfig, layout: RopeLayout, freq_divisors: Option<&[f32]>) -> Self {
        // Partial rotary embeddings (Qwen3.5) rotate the leading `rotary_dim` dimensions of each
        // head with frequencies of that width, and pass the rest through.
        let dim = config.rotary_dim;
        let mut inv_freq: Vec<f32> =
            (0..dim / 2).map(|i| (1.0 / config.rope_theta.powf((2 * i) as f64 / dim as f64)) as f32).collect();
        if let Some(s) = &config.rope_llama3 {
            let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
            let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
            for f in inv_freq.iter_mut() {
                let freq = *f as f64;
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                *f = if wavelen < high_wavelen {
                    freq
                } else if wavelen > low_wavelen {
                    freq / s.factor
                } else {
                    let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * freq / s.factor + smooth * freq
                } as f32;
            }
        }
        if let Some(divisors) = freq_divisors {
            for (f, d) in inv_freq.iter_mut().zip(divisors) {
                *f /= d;
            }
        }
        Rope { inv_freq, position_scale: (1.0 / config.rope_linear_factor) as f32, layout }
    }

    /// cos/sin rows for the given positions.
    pub fn angles(&self, positions: impl Iterator<Item = usize>) -> RopeAngles {
        let half = self.inv_freq.len();
        let mut angles = RopeAngles { cos: Vec::new(), sin: Vec::new(), half };
        for p in positions {
            let p = p as f32 * self.position_scale;
            for f in &self.inv_freq {
                // f32 product as transformers computes it, then cos/sin of that f32 angle.
                let theta = p * f;
                angles.cos.push(theta.cos());
                angles.sin.push(theta.sin());
            }
        }
        angles
    }

    /// How the model pairs dimensions.
    pub fn layout(&self) -> RopeLayout {
        self.layout
    }

    /// Rotates the leading rotary dimensions of each head of `x` (`[tokens, heads, head_dim]`,
    /// row-major) in place.
    pub fn apply(&self, angles: &RopeAngles, x: &mut [f32], heads: usize) {
        let half = angles.half;
        let tokens = angles.cos.len() / half.max(1);
        if tokens == 0 || half == 0 {
            return;
        }
        let head_dim = x.len() / (tokens * heads);
        debug_assert_eq!(x.len(), tokens * heads * head_dim);
        debug_assert!(2 * half <= head_dim);
        for (t, token) in x.chunks_exact_mut(heads * head_dim).enumerate() {
            let cos = &angles.cos[t * half..(t + 1) * half];
            let sin = &angles.sin[t * half..(t + 1) * half];
            for head in token.chunks_exact_mut(head_dim) {
                let head = &mut head[..2 * half];
                match self.layout {
                    RopeLayout::Neox => {
                        let (a, b) = head.split_at_mut(half);
                        for i in 0..half {
                            let (x0, x1) = (a[i], b[i]);
                            a[i] = x0 * cos[i] - x1 * sin[i];
                            b[i] = x1 * cos[i] + x0 * sin[i];
                        }
                    }
                    RopeLayout::Interleaved => {
                        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                            let (x0, x1) = (pair[0], pair[1]);
                            pair[0] = x0 * cos[i] - x1 * sin[i];
                            pair[1] = x1 * cos[i] + x0 * sin[i];
                        }
                    }
                }
            }
        }
    }
}

/// A batch's angles on a device, for candle's rotary kernels (the tensor path).
#[derive(Debug, Clone)]
pub(crate) struct RopeTensors {
    /// `[tokens, 1, head_dim/2]`: candle's kernels take one row of angles per batch entry, and
    /// each token is its own batch entry at its own position.
    cos: Tensor,
    sin: Tensor,
    layout: RopeLayout,
}

impl RopeTensors {
    /// Uploads `angles` to `device`.
    pub(crate) fn new(angles: &RopeAngles, layout: RopeLayout, device: &Device) -> Result<Self> {
        let (cos, sin, half) = angles.cos_sin();
        let n = cos.len() / half.max(1);
        let cos = Tensor::from_slice(cos, (n, 1, half), device)?;
        let sin = Tensor::from_slice(sin, (n, 1, half), device)?;
        Ok(RopeTensors { cos, sin, layout })
    }

    /// Rotates the leading rotary dimensions of `[tokens, heads, head_dim]` by each token's
    /// angles.
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let (n, heads, d) = x.dims3()?;
        let rotary = 2 * self.cos.dim(2)?;
        let (x, pass) = if rotary < d {
            (x.narrow(2, 0, rotary)?, Some(x.narrow(2, rotary, d - rotary)?))
        } else {
            (x.clone(), None)
        };
        let x = x.contiguous()?.reshape((n, heads, 1, rotary))?;
        let rotated = match self.layout {
            RopeLayout::Neox => candle_nn::rotary_emb::rope(&x, &self.cos, &self.sin)?,
            RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&x, &self.cos, &self.sin)?,
        };
        let rotated = rotated.reshape((n, heads, rotary))?;
        Ok(match pass {
            Some(pass) => Tensor::cat(&[&rotated, &pass], 2)?,
            None => rotated,
        })
    }
}
