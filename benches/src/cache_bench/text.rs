//! Deterministic filler text for the workloads: prose, code and listings built from our own word
//! lists (no third-party prompts), sized in approximate tokens.
//!
//! Sizes are estimates (about 1.3 tokens per word of this vocabulary with the Qwen3 and SmolLM2
//! tokenizers); the report uses the token counts the servers return, never these estimates.

use radix_models::SplitMix64;

/// The workspace's seeded generator ([`SplitMix64`]) with the draws the workloads use: the
/// workloads must be identical for a seed on every machine and every version of any crate.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }

    /// A generator derived from this seed and a label, so that adding a draw in one place does not
    /// shift every later piece of text.
    pub fn fork(&self, label: &str) -> Rng {
        let mut h = self.0.state() ^ 0x9e37_79b9_7f4a_7c15;
        for b in label.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Rng::new(h)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        debug_assert!(lo <= hi);
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// Log-uniform in `lo..=hi`: most values small, a few large, as tool results are.
    pub fn log_range(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo.max(1) as f64).ln(), (hi.max(1) as f64).ln());
        let u = self.0.next_f64();
        ((a + u * (b - a)).exp().round() as usize).clamp(lo, hi)
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.range(0, items.len() - 1)]
    }
}

const WORDS: &[&str] = &[
    "the",
    "a",
    "file",
    "function",
    "module",
    "test",
    "build",
    "error",
    "value",
    "request",
    "server",
    "cache",
    "token",
    "change",
    "before",
    "after",
    "when",
    "always",
    "never",
    "check",
    "update",
    "return",
    "result",
    "config",
    "path",
    "user",
    "project",
    "code",
    "line",
    "call",
    "read",
    "write",
    "run",
    "command",
    "output",
    "input",
    "should",
    "must",
    "can",
    "only",
    "each",
    "every",
    "new",
    "old",
    "small",
    "large",
    "first",
    "last",
    "next",
    "with",
    "without",
    "from",
    "into",
    "over",
    "under",
    "and",
    "or",
    "but",
    "not",
    "is",
    "are",
    "was",
    "be",
    "keep",
    "use",
    "make",
    "prefer",
    "avoid",
    "explain",
    "edit",
    "commit",
    "branch",
    "review",
    "style",
    "format",
    "type",
    "struct",
    "field",
    "method",
    "loop",
    "index",
    "buffer",
    "queue",
    "thread",
    "lock",
    "page",
    "memory",
    "disk",
    "network",
    "timeout",
    "retry",
    "log",
    "message",
    "reply",
    "tool",
    "task",
    "step",
    "plan",
    "goal",
    "reason",
    "answer",
    "question",
    "short",
    "clear",
    "exact",
    "simple",
    "careful",
    "safe",
    "fast",
    "slow",
    "correct",
    "broken",
    "missing",
    "unused",
    "public",
    "private",
    "local",
    "remote",
    "default",
    "option",
    "flag",
    "argument",
    "parameter",
    "schema",
    "object",
    "list",
    "string",
    "number",
    "boolean",
    "directory",
    "search",
    "pattern",
    "match",
    "replace",
    "insert",
    "delete",
    "create",
    "open",
    "close",
    "start",
    "stop",
    "wait",
    "send",
    "receive",
    "parse",
    "render",
    "load",
    "save",
    "count",
    "limit",
];

const IDENTS: &[&str] = &[
    "config", "request", "cache", "page", "token", "batch", "queue", "state", "handle", "event", "stream", "parser",
    "buffer", "index", "node", "entry", "record", "session", "client", "router", "worker", "task", "span", "limit",
];

const TYPES: &[&str] = &["usize", "u32", "bool", "String", "Vec<u8>", "Option<u64>", "&str", "f32"];

fn capitalize(word: &str) -> String {
    let mut c = word.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

fn ident_word(rng: &mut Rng) -> &'static str {
    IDENTS[rng.range(0, IDENTS.len() - 1)]
}

fn ident(rng: &mut Rng) -> String {
    format!("{}_{}", rng.pick(IDENTS), rng.pick(IDENTS))
}

/// One sentence of 6-18 words.
pub fn sentence(rng: &mut Rng) -> String {
    let n = rng.range(6, 18);
    let words: Vec<&str> = (0..n).map(|_| *rng.pick(WORDS)).collect();
    format!("{}.", capitalize(&words.join(" ")))
}

/// Prose of about `tokens` tokens, in paragraphs.
pub fn prose(rng: &mut Rng, tokens: usize) -> String {
    let mut out = String::new();
    let mut in_paragraph = 0;
    while estimate_tokens(&out) < tokens {
        if !out.is_empty() {
            out.push_str(if in_paragraph >= 4 { "\n\n" } else { " " });
        }
        in_paragraph = if in_paragraph >= 4 { 0 } else { in_paragraph + 1 };
        out.push_str(&sentence(rng));
    }
    out
}

/// A bulleted list of rules of about `tokens` tokens.
pub fn rules(rng: &mut Rng, tokens: usize) -> String {
    let mut out = String::new();
    while estimate_tokens(&out) < tokens {
        out.push_str("- ");
        out.push_str(&sentence(rng));
        out.push('\n');
    }
    out
}

/// Rust-like source of about `tokens` tokens, with line numbers as a read-file tool shows them.
pub fn code(rng: &mut Rng, tokens: usize) -> String {
    let mut out = String::new();
    let mut line = 1;
    let mut push = |out: &mut String, text: String| {
        out.push_str(&format!("{line:>5}\t{text}\n"));
        line += 1;
    };
    while estimate_tokens(&out) < tokens {
        let name = ident(rng);
        push(&mut out, format!("/// {}", sentence(rng)));
        push(&mut out, format!("pub fn {name}({}: {}) -> Result<{}> {{", ident(rng), rng.pick(TYPES), rng.pick(TYPES)));
        for _ in 0..rng.range(2, 7) {
            let stmt = match rng.range(0, 3) {
                0 => format!("    let {} = {}.{}()?;", ident(rng), ident(rng), ident(rng)),
                1 => format!(
                    "    if {}.len() > {} {{ return Err(Error::{}); }}",
                    ident(rng),
                    rng.range(1, 4096),
                    capitalize(ident_word(rng))
                ),
                2 => format!("    {}.push({});", ident(rng), ident(rng)),
                _ => format!("    // {}", sentence(rng)),
            };
            push(&mut out, stmt);
        }
        push(&mut out, format!("    Ok({})", ident(rng)));
        push(&mut out, "}".to_owned());
        push(&mut out, String::new());
    }
    out
}

/// Search hits or a directory listing of about `tokens` tokens.
pub fn listing(rng: &mut Rng, tokens: usize) -> String {
    let mut out = String::new();
    while estimate_tokens(&out) < tokens {
        let path = format!("src/{}/{}.rs", rng.pick(IDENTS), ident(rng));
        if rng.range(0, 1) == 0 {
            out.push_str(&format!("{path}:{}:    let {} = {};\n", rng.range(1, 900), ident(rng), ident(rng)));
        } else {
            out.push_str(&format!("{path}\n"));
        }
    }
    out
}

/// Test or compiler output of about `tokens` tokens.
pub fn command_output(rng: &mut Rng, tokens: usize) -> String {
    let mut out = String::new();
    while estimate_tokens(&out) < tokens {
        match rng.range(0, 2) {
            0 => out.push_str(&format!("test {}::{} ... ok\n", rng.pick(IDENTS), ident(rng))),
            1 => out.push_str(&format!(
                "error[E0{}]: {}\n  --> src/{}.rs:{}:{}\n",
                rng.range(100, 799),
                sentence(rng).to_lowercase(),
                ident(rng),
                rng.range(1, 900),
                rng.range(1, 80)
            )),
            _ => out.push_str(&format!("   Compiling {} v0.{}.{}\n", ident(rng), rng.range(0, 9), rng.range(0, 30))),
        }
    }
    out
}

/// The estimated token count of our generated text: words and punctuation runs, plus a share
/// for long identifiers, which tokenizers split.
pub fn estimate_tokens(text: &str) -> usize {
    let mut tokens = 0;
    for piece in text.split_whitespace() {
        let letters = piece.chars().filter(|c| c.is_alphanumeric()).count();
        let symbols = piece.chars().filter(|c| !c.is_alphanumeric()).count();
        tokens += 1 + letters / 8 + symbols.div_ceil(2);
    }
    tokens + text.matches('\n').count() / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_text_and_sizes_are_close() {
        for tokens in [50, 500, 3000] {
            let a = prose(&mut Rng::new(7), tokens);
            assert_eq!(a, prose(&mut Rng::new(7), tokens));
            assert_ne!(a, prose(&mut Rng::new(8), tokens));
            let estimate = estimate_tokens(&a);
            assert!(estimate >= tokens && estimate < tokens + 40, "{estimate} for {tokens}");
        }
    }

    #[test]
    fn log_range_stays_in_bounds() {
        let mut rng = Rng::new(1);
        for _ in 0..1000 {
            let v = rng.log_range(100, 3000);
            assert!((100..=3000).contains(&v));
        }
    }
}
