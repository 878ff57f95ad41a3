//! Why a request's prompt was (not) found in the prefix cache, judged on tokens alone.
//!
//! The engine keeps a bounded list of recently computed sequences (prompt plus generated tokens,
//! what the radix tree was given) and compares each new prompt with the most similar one: the
//! "previous version of this conversation". Where reuse stopped before that previous version
//! ended, the report says where and gives a token-level reason; the HTTP side, which knows the
//! messages, refines `changed_content` into `rerendered_history` where the same message was
//! rendered to different text.

use std::collections::VecDeque;
use std::sync::Arc;

/// A client identity for the cache report: a hash of the API key in use and of the request's
/// `cache_salt` or `user`; [`Tenant::default`] is every client that gives neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Tenant(u64);

impl Tenant {
    /// The tenant of a request made with `key` (the API key it carried, if keys are on) and
    /// `salt` (its `cache_salt`, else its `user`).
    pub fn new(key: Option<&str>, salt: Option<&str>) -> Self {
        if key.is_none() && salt.is_none() {
            return Tenant::default();
        }
        // `str` hashes with a terminator, so ("ab", "c") and ("a", "bc") differ; `| 1` keeps
        // every named tenant apart from the default one.
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        (key, salt).hash(&mut hasher);
        Tenant(hasher.finish() | 1)
    }
}

/// Why reuse stopped where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissReason {
    /// The previous version ended there (or there is none): the rest is new.
    NewContent,
    /// The prompt's text differs from the previous version at that token.
    ChangedContent,
    /// The previous version matched further, but its pages had been evicted from the cache.
    Evicted,
    /// The same messages were rendered to different text (e.g. reasoning of earlier turns dropped).
    RerenderedHistory,
    /// The request asked for no reuse (`cache_prompt: false`) or the server runs `--no-prefix-cache`.
    CacheDisabled,
    /// A hybrid model's cached KV matched further, but the nearest recurrent-state snapshot was
    /// earlier: the tokens in between were recomputed (`recomputed_for_snapshot`).
    NoSnapshot,
}

impl MissReason {
    /// The reason's name in reports and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            MissReason::NewContent => "new_content",
            MissReason::ChangedContent => "changed_content",
            MissReason::Evicted => "evicted",
            MissReason::RerenderedHistory => "rerendered_history",
            MissReason::CacheDisabled => "cache_disabled",
            MissReason::NoSnapshot => "no_snapshot",
        }
    }
}

/// The most similar recent sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousVersion {
    /// Its tokens: prompt, then what was generated.
    pub tokens: Arc<[u32]>,
    /// How many of `tokens` were its prompt.
    pub prompt_len: usize,
    /// Leading tokens it shares with the new prompt.
    pub common_prefix: usize,
}

/// The token-level cache report of one request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CacheReport {
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Prompt tokens found in the cache.
    pub cached_tokens: usize,
    /// The most similar recent sequence, if any shares a token with this prompt.
    pub previous: Option<PreviousVersion>,
    /// Token index where reuse stopped, when it stopped before the prompt's last page.
    pub divergence: Option<usize>,
    /// Why, when it stopped early.
    pub reason: Option<MissReason>,
    /// [`MissReason::NoSnapshot`]: cached tokens computed again to reach the snapshot.
    pub recomputed_for_snapshot: Option<usize>,
    /// Of `cached_tokens`, those whose K/V were read back from the disk tier (`--cache-dir`).
    pub restored_from_disk: usize,
}

impl CacheReport {
    /// Judges a prompt of which `cached` tokens were found, against the most similar recent
    /// sequence. `cache_on` is false when reuse was off for this request; `page_size` is the
    /// granularity of reuse (a match shorter than a page is not a miss).
    pub fn judge(
        prompt: &[u32],
        cached: usize,
        cache_on: bool,
        page_size: usize,
        previous: Option<PreviousVersion>,
    ) -> Self {
        let mut report =
            CacheReport { prompt_tokens: prompt.len(), cached_tokens: cached, previous, ..Self::default() };
        if !cache_on {
            report.divergence = Some(0);
            report.reason = Some(MissReason::CacheDisabled);
            return report;
        }
        // The last prompt token is always computed (its logits are needed), so it is never a miss.
        let reusable = prompt.len().saturating_sub(1);
        if reusable.saturating_sub(cached) < page_size.max(1) {
            return report;
        }
        let (common, prompt_len, total) =
            report.previous.as_ref().map_or((0, 0, 0), |p| (p.common_prefix, p.prompt_len, p.tokens.len()));
        if common.min(reusable) >= cached + page_size.max(1) {
            report.divergence = Some(cached);
            report.reason = Some(MissReason::Evicted);
            return report;
        }
        let at = common.max(cached);
        report.divergence = Some(at);
        report.reason =
            Some(if total == 0 || at >= prompt_len { MissReason::NewContent } else { MissReason::ChangedContent });
        report
    }

    /// A hybrid model's KV matched `kv_matched` tokens but the sequence resumed from the nearest
    /// snapshot at `cached_tokens`: when that lost at least a page, that is the reason reuse
    /// stopped where it did.
    pub fn no_snapshot(&mut self, kv_matched: usize, page_size: usize) {
        if kv_matched >= self.cached_tokens + page_size.max(1) && self.reason != Some(MissReason::CacheDisabled) {
            self.divergence = Some(self.cached_tokens);
            self.reason = Some(MissReason::NoSnapshot);
            self.recomputed_for_snapshot = Some(kv_matched - self.cached_tokens);
        }
    }
}

/// One remembered sequence.
#[derive(Debug, Clone)]
struct Entry {
    tenant: Tenant,
    tokens: Arc<[u32]>,
    prompt_len: usize,
    uses: u64,
}

/// A recently computed sequence, for `/v1/cache`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentPrefix {
    /// Its tokens (prompt then generated).
    pub tokens: Arc<[u32]>,
    /// How many later prompts reused part of it.
    pub uses: u64,
}

/// A bounded, most-recent-first list of computed sequences.
#[derive(Debug, Clone)]
pub struct RecentSequences {
    entries: VecDeque<Entry>,
    capacity: usize,
}

impl RecentSequences {
    /// Remembers at most `capacity` sequences.
    pub fn new(capacity: usize) -> Self {
        RecentSequences { entries: VecDeque::new(), capacity: capacity.max(1) }
    }

    /// The remembered sequence sharing the longest token prefix with `prompt` (the most recent
    /// on a tie), counted as used when it shares at least `min_shared` tokens.
    pub fn most_similar(&mut self, prompt: &[u32], min_shared: usize, tenant: Tenant) -> Option<PreviousVersion> {
        let mut best: Option<(usize, usize)> = None;
        for (i, entry) in self.entries.iter().enumerate().filter(|(_, e)| e.tenant == tenant) {
            let common = common_prefix(&entry.tokens, prompt);
            if common > 0 && best.is_none_or(|(_, b)| common > b) {
                best = Some((i, common));
            }
        }
        let (index, common) = best?;
        let entry = &mut self.entries[index];
        if common >= min_shared.max(1) {
            entry.uses += 1;
        }
        Some(PreviousVersion { tokens: Arc::clone(&entry.tokens), prompt_len: entry.prompt_len, common_prefix: common })
    }

    /// Remembers a computed sequence as the newest; sequences it extends are dropped, since it
    /// is their newer version.
    pub fn record(&mut self, tokens: &[u32], prompt_len: usize, tenant: Tenant) {
        if tokens.is_empty() {
            return;
        }
        let mut uses = 0;
        self.entries.retain(|e| {
            let extended =
                e.tenant == tenant && e.tokens.len() <= tokens.len() && tokens[..e.tokens.len()] == e.tokens[..];
            if extended {
                uses += e.uses;
            }
            !extended
        });
        self.entries.push_front(Entry {
            tenant,
            tokens: tokens.into(),
            prompt_len: prompt_len.min(tokens.len()),
            uses,
        });
        self.entries.truncate(self.capacity);
    }

    /// The remembered sequences, most used first.
    pub fn by_use(&self) -> Vec<RecentPrefix> {
        let mut out: Vec<RecentPrefix> =
            self.entries.iter().map(|e| RecentPrefix { tokens: Arc::clone(&e.tokens), uses: e.uses }).collect();
        out.sort_by_key(|p| std::cmp::Reverse(p.uses));
        out
    }
}

/// Leading tokens `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: u32) -> Vec<u32> {
        (0..n).collect()
    }

    #[test]
    fn a_full_hit_is_no_miss() {
        let mut recent = RecentSequences::new(4);
        recent.record(&seq(10), 8, Tenant::default());
        let prompt = seq(12);
        let report = CacheReport::judge(&prompt, 10, true, 1, recent.most_similar(&prompt, 1, Tenant::default()));
        assert_eq!((report.divergence, report.reason), (Some(10), Some(MissReason::NewContent)));
        let report = CacheReport::judge(&prompt, 11, true, 1, recent.most_similar(&prompt, 1, Tenant::default()));
        assert_eq!((report.divergence, report.reason), (None, None));
        // With pages of 4 tokens, 8 of 11 reusable tokens is as good as it gets.
        let report = CacheReport::judge(&prompt, 8, true, 4, None);
        assert_eq!(report.reason, None);
    }

    #[test]
    fn reasons_follow_where_the_previous_version_ended() {
        let mut recent = RecentSequences::new(4);
        // Prompt of 8 tokens, 2 generated.
        recent.record(&seq(10), 8, Tenant::default());
        let mut changed = seq(20);
        changed[5] = 99;
        let report = CacheReport::judge(&changed, 5, true, 1, recent.most_similar(&changed, 1, Tenant::default()));
        assert_eq!((report.divergence, report.reason), (Some(5), Some(MissReason::ChangedContent)));
        // Diverging inside the generated reply, or after it: the previous prompt was reused whole.
        let mut reply_edited = seq(20);
        reply_edited[9] = 99;
        let report =
            CacheReport::judge(&reply_edited, 9, true, 1, recent.most_similar(&reply_edited, 1, Tenant::default()));
        assert_eq!((report.divergence, report.reason), (Some(9), Some(MissReason::NewContent)));
        // The previous version matched 10 tokens but only 3 were still cached.
        let appended = seq(20);
        let report = CacheReport::judge(&appended, 3, true, 1, recent.most_similar(&appended, 1, Tenant::default()));
        assert_eq!((report.divergence, report.reason), (Some(3), Some(MissReason::Evicted)));
        // Page granularity: 8 cached of 10 matched with pages of 4 is not an eviction.
        let report = CacheReport::judge(&appended, 8, true, 4, recent.most_similar(&appended, 1, Tenant::default()));
        assert_eq!((report.divergence, report.reason), (Some(10), Some(MissReason::NewContent)));
        let report = CacheReport::judge(&appended, 0, false, 1, recent.most_similar(&appended, 1, Tenant::default()));
        assert_eq!((report.divergence, report.reason), (Some(0), Some(MissReason::CacheDisabled)));
        let report = CacheReport::judge(&[7, 7, 7], 0, true, 1, recent.most_similar(&[7, 7, 7], 1, Tenant::default()));
        assert_eq!((report.previous, report.reason), (None, Some(MissReason::NewContent)));
    }

    #[test]
    fn a_newer_version_replaces_the_one_it_extends_and_the_list_is_bounded() {
        let mut recent = RecentSequences::new(2);
        recent.record(&seq(4), 4, Tenant::default());
        assert!(recent.most_similar(&seq(6), 1, Tenant::default()).is_some());
        recent.record(&seq(8), 6, Tenant::default());
        let by_use = recent.by_use();
        assert_eq!(by_use.len(), 1, "the extended sequence is dropped");
        assert_eq!((by_use[0].tokens.len(), by_use[0].uses), (8, 1));
        recent.record(&[50, 51], 2, Tenant::default());
        recent.record(&[60, 61], 2, Tenant::default());
        assert_eq!(recent.by_use().len(), 2);
        assert!(recent.most_similar(&seq(8), 1, Tenant::default()).is_none(), "the oldest was forgotten");
        let best = recent.most_similar(&[60, 61, 62], 1, Tenant::default()).unwrap();
        assert_eq!((best.common_prefix, best.prompt_len), (2, 2));
    }

    #[test]
    fn a_prompt_is_compared_only_with_its_own_tenants_sequences() {
        let (alice, mallory) = (Tenant::new(None, Some("alice")), Tenant::new(None, Some("mallory")));
        assert_ne!(alice, mallory);
        assert_ne!(alice, Tenant::default());
        assert_ne!(Tenant::new(Some("ab"), Some("c")), Tenant::new(Some("a"), Some("bc")));
        let mut recent = RecentSequences::new(8);
        recent.record(&seq(10), 8, alice);
        assert!(recent.most_similar(&seq(6), 1, mallory).is_none(), "another tenant's text stays hidden");
        assert!(recent.most_similar(&seq(6), 1, Tenant::default()).is_none());
        assert_eq!(recent.most_similar(&seq(6), 1, alice).map(|p| p.common_prefix), Some(6));
        // A newer sequence of one tenant does not replace another tenant's older one.
        recent.record(&seq(12), 10, mallory);
        assert_eq!(recent.most_similar(&seq(11), 1, alice).map(|p| p.tokens.len()), Some(10));
    }
}
