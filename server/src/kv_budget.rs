//! How much KV cache to allocate, and the context that results: the context asked for (`-c`,
//! else the model's trained context) always fits, and more sequences' worth where memory allows.
//!
//! The rules (README, "Context and KV cache"):
//! - `--kv-cache MiB` is the budget. If it cannot hold an explicit `-c`, start-up fails and
//!   says which figure to change: both were the user's own, and serving a smaller context would
//!   only turn into HTTP 400s later. Without `-c`, the trained context is lowered to what fits.
//! - Without `--kv-cache`, the budget is `--parallel` full contexts (at least 256 MiB, for the
//!   prefix cache), but no more than half the available memory. An explicit `-c` may use up to
//!   all of the available memory for its one context; beyond that start-up fails. The trained
//!   context is lowered, with a message naming the numbers, when one of it does not fit in half.
//!
//! Host memory pages are committed as they are written, so a budget larger than what a workload
//! fills costs address space, not resident memory.

/// The smallest default budget: room for the prefix cache of a few agent sessions.
const MIN_DEFAULT_BUDGET: usize = 256 << 20;

/// What the sizing starts from.
#[derive(Debug, Clone, Copy)]
pub struct KvRequest {
    /// KV bytes one token takes (all layers, K and V).
    pub token_bytes: usize,
    /// Tokens per page: a sequence of `context` tokens needs one page more for its next token.
    pub page_size: usize,
    /// The model's trained context.
    pub trained_context: usize,
    /// `-c`, if given.
    pub ctx_size: Option<usize>,
    /// `--kv-cache` in MiB, if given.
    pub kv_cache_mib: Option<usize>,
    /// `--parallel`.
    pub parallel: usize,
    /// Memory the budget may come from (host memory for the CPU path); `None` when unknown
    /// (a GPU): then the default budget is one context.
    pub available_bytes: Option<usize>,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSizing {
    /// Bytes to allocate for the KV pool.
    pub budget_bytes: usize,
    /// What start-up should tell the user (a lowered context, a large share of memory).
    pub notes: Vec<String>,
}

fn mib(bytes: usize) -> usize {
    bytes.div_ceil(1 << 20)
}

impl KvRequest {
    fn bytes_for(&self, context: usize) -> usize {
        (context + self.page_size) * self.token_bytes
    }

    /// The context a pool of `bytes` holds: its whole pages, less the one kept for the next token.
    fn tokens_in(&self, bytes: usize) -> usize {
        let page = self.page_size.max(1);
        (bytes / (self.token_bytes * page).max(1) * page).saturating_sub(page)
    }

    /// The budget, or an error naming the figures that conflict.
    pub fn size(&self) -> Result<KvSizing, String> {
        let context = self.ctx_size.unwrap_or(self.trained_context);
        let one = self.bytes_for(context);
        let per_token = self.token_bytes;
        let mut notes = Vec::new();
        if let Some(given) = self.kv_cache_mib {
            let budget = given << 20;
            if budget < one {
                let holds = self.tokens_in(budget);
                if self.ctx_size.is_some() {
                    return Err(format!(
                        "-c {context} needs {} MiB of KV cache ({per_token} bytes a token), but --kv-cache is {given} \
                         MiB, which holds {holds} tokens: raise --kv-cache to {} or more, or lower -c to {holds} or less",
                        mib(one),
                        mib(one)
                    ));
                }
                notes.push(format!(
                    "--kv-cache {given} MiB holds {holds} tokens, less than the trained context of {context}: the \
                     context is {holds}; --kv-cache {} holds all of it",
                    mib(one)
                ));
            }
            return Ok(KvSizing { budget_bytes: budget, notes });
        }
        let Some(available) = self.available_bytes else {
            return Ok(KvSizing { budget_bytes: one.max(MIN_DEFAULT_BUDGET), notes });
        };
        let wanted = one.saturating_mul(self.parallel.max(1)).max(MIN_DEFAULT_BUDGET);
        let half = available / 2;
        if one <= half {
            return Ok(KvSizing { budget_bytes: wanted.min(half.max(MIN_DEFAULT_BUDGET.min(available))), notes });
        }
        if self.ctx_size.is_some() {
            if one > available {
                return Err(format!(
                    "-c {context} needs {} MiB of KV cache ({per_token} bytes a token), more than the {} MiB of memory \
                     available: lower -c to {} or less",
                    mib(one),
                    available >> 20,
                    self.tokens_in(available)
                ));
            }
            notes.push(format!(
                "-c {context} takes {} MiB of KV cache, more than half of the {} MiB of memory available",
                mib(one),
                available >> 20
            ));
            return Ok(KvSizing { budget_bytes: one, notes });
        }
        let holds = self.tokens_in(half);
        notes.push(format!(
            "the trained context of {context} tokens needs {} MiB of KV cache ({per_token} bytes a token); half of the \
             {} MiB of memory available holds {holds}, so the context is {holds}; -c or --kv-cache set it",
            mib(one),
            available >> 20
        ));
        Ok(KvSizing { budget_bytes: half, notes })
    }
}

/// The host memory available for new allocations (Linux's `MemAvailable`), if known.
pub fn available_host_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    /// Qwen3-0.6B: 28 layers, 8 KV heads of 128, f16: 112 KiB a token.
    fn qwen3(ctx_size: Option<usize>, kv_cache_mib: Option<usize>, available: Option<usize>) -> KvRequest {
        KvRequest {
            token_bytes: 2 * 28 * 8 * 128 * 2,
            page_size: 1,
            trained_context: 40960,
            ctx_size,
            kv_cache_mib,
            parallel: 4,
            available_bytes: available,
        }
    }

    fn capacity(request: &KvRequest, sizing: &KvSizing) -> usize {
        request.tokens_in(sizing.budget_bytes)
    }

    #[test]
    fn the_context_asked_for_fits_by_default() {
        let request = qwen3(Some(16384), None, Some(20 * GIB));
        let sizing = request.size().unwrap();
        assert!(capacity(&request, &sizing) >= 16384 * 4, "four sequences' worth: {sizing:?}");
        assert!(sizing.notes.is_empty());
    }

    #[test]
    fn the_default_stays_within_half_the_memory() {
        let request = qwen3(Some(16384), None, Some(8 * GIB));
        let sizing = request.size().unwrap();
        assert_eq!(sizing.budget_bytes, 4 * GIB);
        assert!(capacity(&request, &sizing) >= 16384);
    }

    #[test]
    fn the_trained_context_is_lowered_with_the_numbers_when_memory_is_short() {
        let request = qwen3(None, None, Some(6 * GIB));
        let sizing = request.size().unwrap();
        assert_eq!(sizing.budget_bytes, 3 * GIB);
        let note = &sizing.notes[0];
        assert!(note.contains("40960") && note.contains("6144 MiB") && note.contains("28085"), "{note}");
    }

    #[test]
    fn an_explicit_context_may_use_more_than_half_but_not_more_than_all() {
        let sizing = qwen3(Some(40960), None, Some(6 * GIB)).size().unwrap();
        assert_eq!(sizing.budget_bytes, (40960 + 1) * 114_688);
        assert!(sizing.notes[0].contains("more than half"), "{:?}", sizing.notes);
        let err = qwen3(Some(40960), None, Some(3 * GIB)).size().unwrap_err();
        assert!(err.contains("lower -c to 28085"), "{err}");
    }

    #[test]
    fn conflicting_explicit_figures_are_an_error_naming_both() {
        let err = qwen3(Some(16384), Some(256), Some(20 * GIB)).size().unwrap_err();
        assert!(err.contains("-c 16384 needs 1793 MiB") && err.contains("--kv-cache is 256 MiB"), "{err}");
        assert!(err.contains("holds 2339 tokens"), "the figure the issue saw: {err}");
        let sizing = qwen3(None, Some(256), None).size().unwrap();
        assert_eq!(sizing.budget_bytes, 256 << 20, "without -c, --kv-cache is taken and the context lowered");
        assert!(sizing.notes[0].contains("the context is 2339"), "{:?}", sizing.notes);
    }

    #[test]
    fn small_models_get_the_minimum_for_the_prefix_cache() {
        let smollm2 = KvRequest {
            token_bytes: 2 * 30 * 3 * 64 * 2,
            page_size: 1,
            trained_context: 2048,
            ctx_size: None,
            kv_cache_mib: None,
            parallel: 1,
            available_bytes: Some(20 * GIB),
        };
        assert_eq!(smollm2.size().unwrap().budget_bytes, MIN_DEFAULT_BUDGET);
        let gpu = KvRequest { available_bytes: None, ..qwen3(Some(16384), None, None) };
        assert_eq!(gpu.size().unwrap().budget_bytes, (16384 + 1) * 114_688, "one context where memory is unknown");
    }
}
