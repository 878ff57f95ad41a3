//! Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, and a
//! seedable random draw (same seed, same output). Temperature 0 is greedy.

use radix_models::SplitMix64;
use std::collections::HashMap;

/// Sampling settings of one request (OpenAI and llama.cpp names).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches this (1 = off).
    pub top_p: f32,
    /// Keep this many most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens less likely than this fraction of the most likely one (0 = off).
    pub min_p: f32,
    /// Subtracted from the logit of every token already generated.
    pub presence_penalty: f32,
    /// Subtracted once per time a token was generated.
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or output (1 = off).
    pub repetition_penalty: f32,
    /// Seed of the random draw; `None` draws one.
    pub seed: Option<u64>,
    /// Report each generated token's log-probability with this many most likely alternatives
    /// (OpenAI's `top_logprobs`, llama.cpp's `n_probs`), taken from the model's own
    /// distribution before penalties and masks; `None` reports nothing.
    pub logprobs: Option<usize>,
    /// Never pick a stop token (EOS, end of turn), so the reply runs to its token limit
    /// (llama.cpp's `ignore_eos`, for measurements of a fixed length).
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            logprobs: None,
            ignore_eos: false,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the message names the field, for an HTTP 400.
    pub fn validate(&self) -> Result<(), String> {
        let finite = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
            ("repetition_penalty", self.repetition_penalty),
        ];
        if let Some((name, _)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return Err(format!("'{name}' must be a finite number"));
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(format!("'temperature' must be between 0 and 2, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("'top_p' must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("'min_p' must be in [0, 1], got {}", self.min_p));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) || !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err("'presence_penalty' and 'frequency_penalty' must be between -2 and 2".into());
        }
        if self.repetition_penalty <= 0.0 {
            return Err(format!("'repetition_penalty' must be positive, got {}", self.repetition_penalty));
        }
        Ok(())
    }
}

/// Temperatures below this sample greedily: the distribution is one-hot long before, and dividing
/// logits by a smaller one overflows f32 to infinity and the softmax to NaN (vLLM's threshold).
pub const GREEDY_BELOW_TEMPERATURE: f32 = 1e-5;

/// The sampler of one sequence: it remembers what was generated, for the penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    generated: HashMap<u32, u32>,
    seen: std::collections::HashSet<u32>,
    scratch: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt` (the repetition penalty covers it).
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
            );
            h.finish()
        });
        let seen = if params.repetition_penalty != 1.0 { prompt.iter().copied().collect() } else { Default::default() };
        Sampler { params, rng: SplitMix64::new(seed), generated: HashMap::new(), seen, scratch: Vec::new() }
    }

    /// Records a generated token (whoever picked it).
    pub fn accept(&mut self, token: u32) {
        *self.generated.entry(token).or_insert(0) += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token);
        }
    }

    /// Draws from where `other`'s random stream is: a sampler rebuilt after a truncation goes
    /// on with the stream instead of starting it again.
    pub(crate) fn continue_stream_of(&mut self, other: &Sampler) {
        self.rng = other.rng.clone();
    }

    /// Whether [`sample`](Self::sample) is a bare argmax: greedy and no penalty, so the
    /// largest logit can be found where the logits are (on a GPU) without copying them back.
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        self.is_greedy()
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && !p.ignore_eos
    }

    fn is_greedy(&self) -> bool {
        self.params.temperature < GREEDY_BELOW_TEMPERATURE
    }

    /// Picks the next token from `logits` (modified in place by the penalties).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        if self.is_greedy() {
            return argmax(logits);
        }
        let p = &self.params;
        let candidates = &mut self.scratch;
        candidates.clear();
        // Tokens a grammar ruled out (negative infinity) must not come back through the rounding
        // fallback of the draw below, so they never become candidates.
        candidates.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| **l > f32::NEG_INFINITY)
                .map(|(i, &l)| (i as u32, l / p.temperature)),
        );
        if candidates.is_empty() {
            return argmax(logits);
        }
        candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        if p.top_k > 0 {
            candidates.truncate(p.top_k);
        }
        // Softmax over what is left, in f64 for stable sums.
        let max = candidates[0].1 as f64;
        let mut probs: Vec<f64> = candidates.iter().map(|c| (c.1 as f64 - max).exp()).collect();
        let total: f64 = probs.iter().sum();
        if !total.is_finite() {
            // Scaled logits beyond f32 (a tiny temperature over huge logits): the top one wins.
            return candidates[0].0;
        }
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            keep = probs
                .iter()
                .position(|x| {
                    acc += x;
                    acc >= p.top_p as f64
                })
                .map_or(keep, |i| i + 1);
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&x| x >= floor).count().max(1));
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut draw = self.rng.next_f64() * total;
        for (i, x) in probs[..keep].iter().enumerate() {
            draw -= x;
            if draw < 0.0 {
                return candidates[i].0;
            }
        }
        candidates[keep - 1].0
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            for &t in &self.seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&t, &count) in &self.generated {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
    }
}

/// Index of the largest logit (the first one on ties, as transformers' argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams { temperature, seed: Some(7), ..Default::default() }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(params(0.0), &[]);
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn temperatures_below_the_floor_are_greedy() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.77).cos() * 30.0).collect();
        let best = argmax(&logits);
        for temperature in [1e-38, 1e-30, 1e-6, f32::MIN_POSITIVE] {
            let mut s = Sampler::new(SamplingParams { seed: Some(3), ..params(temperature) }, &[]);
            assert!(s.is_plain_greedy(), "{temperature}");
            assert!((0..50).all(|_| s.sample(&mut logits.clone()) == best), "{temperature}");
        }
        // Just above the floor, logits near f32's limit still give the top token, not NaN's pick.
        let mut huge = vec![-3.0e38f32, 3.0e38, 1.0e38];
        let mut s = Sampler::new(params(GREEDY_BELOW_TEMPERATURE), &[]);
        assert_eq!(s.sample(&mut huge), 1);
    }

    #[test]
    fn same_seed_same_draws_and_different_seeds_differ() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams { seed: Some(seed), ..params(1.0) }, &[]);
            (0..40).map(|_| s.sample(&mut logits.clone())).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn top_k_top_p_and_min_p_restrict_the_draw() {
        let logits = [5.0f32, 4.0, 1.0, 0.0, -3.0];
        let mut s = Sampler::new(SamplingParams { top_k: 2, ..params(1.0) }, &[]);
        assert!((0..200).all(|_| s.sample(&mut logits.clone()) < 2));
        let mut s = Sampler::new(SamplingParams { top_p: 0.5, ..params(1.0) }, &[]);
        assert!((0..200).all(|_| s.sample(&mut logits.clone()) == 0));
        let mut s = Sampler::new(SamplingParams { min_p: 0.3, ..params(1.0) }, &[]);
        assert!((0..200).all(|_| s.sample(&mut logits.clone()) < 2));
    }

    #[test]
    fn penalties_follow_openai_and_llama_cpp_semantics() {
        let mut s = Sampler::new(
            SamplingParams { presence_penalty: 1.0, frequency_penalty: 0.5, repetition_penalty: 2.0, ..params(0.0) },
            &[0],
        );
        s.accept(1);
        s.accept(1);
        let mut logits = [4.0f32, 4.0, -1.0];
        s.sample(&mut logits);
        // token 0: in prompt, 4/2; token 1: generated twice, 4/2 - 1 - 0.5*2.
        assert_eq!(logits, [2.0, 0.0, -1.0]);
    }

    #[test]
    fn masked_tokens_are_never_drawn_whatever_the_settings() {
        // Only 3 and 7 allowed, with the masked tokens much more likely before masking.
        let mut logits: Vec<f32> = (0..10).map(|i| if i == 3 || i == 7 { -5.0 } else { f32::NEG_INFINITY }).collect();
        logits[3] = -9.0;
        for p in [
            params(1.0),
            params(2.0),
            SamplingParams { top_k: 5, ..params(1.5) },
            SamplingParams { top_p: 0.999, ..params(2.0) },
            SamplingParams { min_p: 0.01, repetition_penalty: 1.3, presence_penalty: 2.0, ..params(2.0) },
        ] {
            let mut s = Sampler::new(p, &[3, 4]);
            s.accept(7);
            let drawn: std::collections::HashSet<u32> = (0..300).map(|_| s.sample(&mut logits.clone())).collect();
            assert!(drawn.iter().all(|t| *t == 3 || *t == 7), "{drawn:?}");
        }
        let mut s = Sampler::new(params(0.0), &[]);
        assert_eq!(s.sample(&mut logits.clone()), 7);
    }

    #[test]
    fn out_of_range_settings_are_named() {
        assert!(
            SamplingParams { temperature: 3.0, ..Default::default() }.validate().unwrap_err().contains("temperature")
        );
        assert!(SamplingParams { top_p: 0.0, ..Default::default() }.validate().unwrap_err().contains("top_p"));
        assert!(SamplingParams { min_p: f32::NAN, ..Default::default() }.validate().unwrap_err().contains("min_p"));
        assert!(SamplingParams::default().validate().is_ok());
    }
}
