//! The cache's shape as the page draws it: the sequences the engine computed last (those
//! `/v1/cache` lists, prompt plus reply, up to 32) as a tree of the prefixes they share. A
//! branch is a run of tokens; its sequences are those that go through it, so a system prompt
//! and tools that every session repeats is one long branch shared by all, and each session's
//! history a branch below it. The radix tree holds these prefixes unless they were evicted.

use crate::api::response::radix::Branch as Shown;

/// Levels of the tree served.
const MAX_DEPTH: usize = 6;
/// Branches served under one parent (the longest).
const MAX_CHILDREN: usize = 8;
/// Tokens of a branch's head shown to the admin key.
const HEAD_TOKENS: usize = 24;

/// Turns a branch's first tokens into text (the admin key's view).
pub(crate) type Head<'a> = &'a dyn Fn(&[u32]) -> String;

/// A run of tokens shared by `sequences` of the remembered sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Branch {
    /// Tokens before it.
    pub(crate) start: usize,
    /// Its length in tokens.
    pub(crate) tokens: usize,
    /// How many sequences go through it.
    pub(crate) sequences: usize,
    /// How often later prompts reused them (the sum of their use counts).
    pub(crate) uses: u64,
    /// Where the sequences part ways after it, longest first.
    pub(crate) children: Vec<Branch>,
    /// One sequence through it (an index into the input), to read its tokens.
    member: usize,
}

/// The tree of `sequences` (each with its use count): the top-level branches, longest first.
pub(crate) fn tree(sequences: &[(&[u32], u64)]) -> Vec<Branch> {
    let mut order: Vec<usize> = (0..sequences.len()).filter(|&i| !sequences[i].0.is_empty()).collect();
    order.sort_by(|&a, &b| sequences[a].0.cmp(sequences[b].0));
    build(sequences, &order, 0)
}

/// The branches below `depth` of the sequences `order` (sorted, all longer than `depth`).
fn build(sequences: &[(&[u32], u64)], order: &[usize], depth: usize) -> Vec<Branch> {
    let tokens = |i: usize| sequences[i].0;
    let mut out = Vec::new();
    let mut i = 0;
    while i < order.len() {
        let first = tokens(order[i])[depth];
        let j = i + order[i..].iter().take_while(|&&k| tokens(k)[depth] == first).count();
        let group = &order[i..j];
        // Sorted, so what the group shares is what each neighbour shares with the next.
        let mut end = group.iter().map(|&k| tokens(k).len()).min().unwrap_or(depth);
        for pair in group.windows(2) {
            let (a, b) = (&tokens(pair[0])[depth..], &tokens(pair[1])[depth..]);
            end = end.min(depth + a.iter().zip(b).take_while(|(x, y)| x == y).count());
        }
        let longer: Vec<usize> = group.iter().copied().filter(|&k| tokens(k).len() > end).collect();
        let mut children = build(sequences, &longer, end);
        children.sort_by_key(|b| std::cmp::Reverse(b.tokens));
        out.push(Branch {
            start: depth,
            tokens: end - depth,
            sequences: group.len(),
            uses: group.iter().map(|&k| sequences[k].1).sum(),
            children,
            member: group[0],
        });
        i = j;
    }
    out.sort_by_key(|b| std::cmp::Reverse(b.tokens));
    out
}

/// The branches as served, [`MAX_DEPTH`] levels of at most [`MAX_CHILDREN`] each; `head` (the
/// admin key's) turns a branch's first tokens into text.
pub(crate) fn shown(branches: &[Branch], sequences: &[(&[u32], u64)], head: Option<Head>, depth: usize) -> Vec<Shown> {
    let deeper = depth + 1 < MAX_DEPTH;
    let shown = branches.iter().take(MAX_CHILDREN).map(|b| Shown {
        start: b.start,
        tokens: b.tokens,
        end: b.start + b.tokens,
        sequences: b.sequences,
        uses: b.uses,
        children: if deeper { shown(&b.children, sequences, head, depth + 1) } else { Vec::new() },
        more_children: b.children.len().saturating_sub(if deeper { MAX_CHILDREN } else { 0 }),
        head: head.map(|head| head(&sequences[b.member].0[b.start..b.start + b.tokens.min(HEAD_TOKENS)])),
    });
    shown.collect()
}

#[cfg(test)]
mod tests {
    use serde_json::Value as Json;

    use super::*;
    use crate::api::response::to_json;

    fn json(branches: &[Branch], sequences: &[(&[u32], u64)], head: Option<Head>, depth: usize) -> Json {
        to_json(&shown(branches, sequences, head, depth))
    }

    fn seq(parts: &[&[u32]]) -> Vec<u32> {
        parts.concat()
    }

    #[test]
    fn shared_prefixes_become_branches() {
        let system: Vec<u32> = (1..=10).collect();
        let a1 = seq(&[&system, &[20, 21, 22]]);
        let a2 = seq(&[&system, &[20, 21, 22, 23, 24]]);
        let b = seq(&[&system, &[30, 31]]);
        let other = [99, 98];
        let sequences = [(&a1[..], 1), (&a2[..], 2), (&b[..], 0), (&other[..], 5), (&[][..], 7)];
        let found = tree(&sequences);
        assert_eq!(found.len(), 2, "{found:#?}");
        let top = &found[0];
        assert_eq!((top.start, top.tokens, top.sequences, top.uses), (0, 10, 3, 3));
        assert_eq!(top.children.len(), 2);
        let a = &top.children[0];
        assert_eq!((a.start, a.tokens, a.sequences, a.uses), (10, 3, 2, 3), "a1 ends where a2 goes on");
        assert_eq!(a.children.len(), 1);
        assert_eq!((a.children[0].start, a.children[0].tokens, a.children[0].sequences), (13, 2, 1));
        assert_eq!((top.children[1].tokens, top.children[1].sequences), (2, 1));
        assert_eq!((found[1].tokens, found[1].sequences, found[1].uses), (2, 1, 5));
        // Every sequence's length is the sum of the branches on its path.
        let decode = |t: &[u32]| format!("{t:?}");
        let json = json(&found, &sequences, Some(&decode), 0);
        assert_eq!(json[0]["end"], 10);
        assert_eq!(json[0]["children"][0]["children"][0]["end"], 15);
        assert_eq!(json[0]["children"][0]["head"], "[20, 21, 22]");
        assert!(tree(&[]).is_empty());
    }

    #[test]
    fn identical_sequences_share_one_branch() {
        let a = [1, 2, 3];
        let found = tree(&[(&a[..], 1), (&a[..], 1)]);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].tokens, found[0].sequences, found[0].children.len()), (3, 2, 0));
    }
}
