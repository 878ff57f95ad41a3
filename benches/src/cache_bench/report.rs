//! Per-workload figures from the measurements: hit ratio, tokens prefilled (also against what a
//! perfect prefix cache would prefill), TTFT percentiles of cold and warm requests, wall time,
//! errors; printed as tables (one server, or servers side by side with ratios), and llama-server's
//! checkpoint events where it had any.

use serde::Serialize;

use super::checkpoints::CheckpointCounts;
use super::client::Measurement;
use super::workload::RequestKind;

/// The figures of one workload on one server.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The server's label.
    pub server: String,
    /// The workload's name.
    pub workload: String,
    /// Requests sent.
    pub requests: usize,
    /// Requests that failed.
    pub errors: usize,
    /// Sum of prompt tokens the server reported.
    pub prompt_tokens: usize,
    /// Sum of cached prompt tokens the server reported.
    pub cached_tokens: usize,
    /// Prompt tokens computed (prompt minus cached).
    pub prefilled_tokens: usize,
    /// cached / prompt tokens.
    pub hit_ratio: f64,
    /// The most any prefix cache could have reached on this workload (see [`super::ideal`]), when
    /// known for every request.
    pub ideal_hit_ratio: Option<f64>,
    /// What a perfect dense prefix cache would have prefilled on the same requests: the sum of
    /// prompt minus the reuse bound, when the bound is known for every request.
    pub ideal_prefilled_tokens: Option<usize>,
    /// TTFT of cold requests (the first of each agent or subagent conversation), p50 and p95, ms.
    pub ttft_cold_ms: (f64, f64),
    /// TTFT of warm requests (the later ones of agent and subagent conversations), p50 and p95, ms.
    pub ttft_warm_ms: (f64, f64),
    /// Seconds from the first request sent to the last one finished.
    pub wall_s: f64,
    /// Requests whose two cache reports (`usage` and llama.cpp's `timings.cache_n`) disagree.
    pub report_mismatches: usize,
}

impl Summary {
    /// Summarizes one replay.
    pub fn new(server: &str, workload: &str, ms: &[Measurement]) -> Self {
        let ok: Vec<&Measurement> = ms.iter().filter(|m| m.error.is_none()).collect();
        let prompt_tokens = ok.iter().map(|m| m.prompt_tokens).sum();
        let cached_tokens = ok.iter().map(|m| m.cached_tokens).sum();
        let agentic = |m: &&&Measurement| matches!(m.kind, RequestKind::Agent | RequestKind::Subagent);
        let ttfts = |first: bool| -> Vec<f64> {
            ok.iter().filter(agentic).filter(|m| m.first == first).map(|m| m.ttft_ms).collect()
        };
        Summary {
            server: server.to_owned(),
            workload: workload.to_owned(),
            requests: ms.len(),
            errors: ms.len() - ok.len(),
            prompt_tokens,
            cached_tokens,
            prefilled_tokens: ok.iter().map(|m| m.prefilled()).sum(),
            hit_ratio: if prompt_tokens > 0 { cached_tokens as f64 / prompt_tokens as f64 } else { 0.0 },
            ideal_hit_ratio: ok
                .iter()
                .map(|m| m.ideal_cached)
                .sum::<Option<usize>>()
                .filter(|_| prompt_tokens > 0)
                .map(|ideal| ideal as f64 / prompt_tokens as f64),
            // Per request and with the server's own prompt count, as the prefilled figure is.
            ideal_prefilled_tokens: ok.iter().map(|m| m.ideal_cached.map(|i| m.prompt_tokens.saturating_sub(i))).sum(),
            ttft_cold_ms: p50_p95(ttfts(true)),
            ttft_warm_ms: p50_p95(ttfts(false)),
            wall_s: ms.iter().map(|m| m.sent_at_ms + m.total_ms).fold(0.0, f64::max) / 1e3,
            report_mismatches: ok.iter().filter(|m| m.timings_cache_n.is_some_and(|n| n != m.cached_tokens)).count(),
        }
    }

    /// Prefilled tokens over what a perfect dense prefix cache would have prefilled (1 is ideal;
    /// the bar is at most 1.03). Below 1 is possible: radix-serve also caches generated
    /// tokens, which the scripted reply may start like.
    pub fn prefilled_vs_ideal(&self) -> Option<f64> {
        self.ideal_prefilled_tokens.filter(|&i| i > 0).map(|i| self.prefilled_tokens as f64 / i as f64)
    }

    /// Warm TTFT p50 over cold TTFT p50.
    pub fn warm_over_cold(&self) -> f64 {
        if self.ttft_cold_ms.0 > 0.0 { self.ttft_warm_ms.0 / self.ttft_cold_ms.0 } else { f64::NAN }
    }
}

/// The 50th and 95th percentiles (nearest rank); NaN for no values.
pub fn p50_p95(mut values: Vec<f64>) -> (f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let rank = |p: f64| values[((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1];
    (rank(0.50), rank(0.95))
}

fn secs(ms: f64) -> String {
    if ms.is_nan() { "-".into() } else { format!("{:.2}", ms / 1e3) }
}

/// A Markdown table of summaries, one row each.
pub fn table(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| server | workload | requests | errors | prompt tok | cached tok | prefilled tok | hit ratio | ideal | prefilled / ideal | cold TTFT p50/p95 s | warm TTFT p50/p95 s | warm/cold | wall s |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1}% | {} | {} | {} / {} | {} / {} | {:.0}% | {:.1} |\n",
            s.server,
            s.workload,
            s.requests,
            s.errors,
            s.prompt_tokens,
            s.cached_tokens,
            s.prefilled_tokens,
            s.hit_ratio * 100.0,
            s.ideal_hit_ratio.map_or("-".into(), |r| format!("{:.1}%", r * 100.0)),
            // Three decimals: the bar is 3%, which two would round across.
            s.prefilled_vs_ideal().map_or("-".into(), |r| format!("{r:.3}x")),
            secs(s.ttft_cold_ms.0),
            secs(s.ttft_cold_ms.1),
            secs(s.ttft_warm_ms.0),
            secs(s.ttft_warm_ms.1),
            s.warm_over_cold() * 100.0,
            s.wall_s
        ));
    }
    out
}

/// Per workload, `ours` beside each other server: ratios other/ours for prefilled tokens, warm
/// TTFT and wall time (above 1: ours is better).
pub fn ratio_table(ours: &str, summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| workload | vs server | hit ratio (ours / theirs) | prefilled tok: theirs / ours | cold TTFT p50: theirs / ours | warm TTFT p50: theirs / ours | wall: theirs / ours |\n\
         |---|---|--:|--:|--:|--:|--:|\n",
    );
    let ratio =
        |a: f64, b: f64| if b > 0.0 && a.is_finite() && b.is_finite() { format!("{:.2}x", a / b) } else { "-".into() };
    for mine in summaries.iter().filter(|s| s.server == ours) {
        for theirs in summaries.iter().filter(|s| s.server != ours && s.workload == mine.workload) {
            out.push_str(&format!(
                "| {} | {} | {:.1}% / {:.1}% | {} | {} | {} | {} |\n",
                mine.workload,
                theirs.server,
                mine.hit_ratio * 100.0,
                theirs.hit_ratio * 100.0,
                ratio(theirs.prefilled_tokens as f64, mine.prefilled_tokens as f64),
                ratio(theirs.ttft_cold_ms.0, mine.ttft_cold_ms.0),
                ratio(theirs.ttft_warm_ms.0, mine.ttft_warm_ms.0),
                ratio(theirs.wall_s, mine.wall_s)
            ));
        }
    }
    out
}

/// llama-server's context-checkpoint events per run (`(server, workload, counts)`), one row each.
pub fn checkpoint_table(runs: &[(&str, &str, &CheckpointCounts)]) -> String {
    let mut out = String::from(
        "| server | workload | checkpoints created | restored | erased invalidated | erased old / too close | full re-processing |\n\
         |---|---|--:|--:|--:|--:|--:|\n",
    );
    for (server, workload, c) in runs {
        out.push_str(&format!(
            "| {server} | {workload} | {} | {} | {} | {} / {} | {} |\n",
            c.created, c.restored, c.erased_invalidated, c.erased_old, c.erased_too_close, c.full_reprocessing
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(first: bool, kind: RequestKind, prompt: usize, cached: usize, ttft: f64) -> Measurement {
        Measurement {
            index: 0,
            conversation: "s0".into(),
            session: 0,
            kind,
            first,
            prompt_tokens: prompt,
            cached_tokens: cached,
            cached_source: "usage",
            timings_cache_n: None,
            ideal_cached: None,
            completion_tokens: 1,
            ttft_ms: ttft,
            total_ms: ttft + 10.0,
            sent_at_ms: 0.0,
            error: None,
        }
    }

    #[test]
    fn percentiles_and_ratios() {
        assert_eq!(p50_p95(vec![4.0, 1.0, 3.0, 2.0]), (2.0, 4.0));
        assert!(p50_p95(vec![]).0.is_nan());
        let ms = vec![
            m(true, RequestKind::Title, 100, 0, 50.0),
            m(true, RequestKind::Agent, 1000, 0, 1000.0),
            m(false, RequestKind::Agent, 1200, 1000, 100.0),
            m(false, RequestKind::Agent, 1500, 1200, 200.0),
        ];
        let s = Summary::new("x", "w", &ms);
        assert_eq!((s.prompt_tokens, s.cached_tokens, s.prefilled_tokens), (3800, 2200, 1600));
        assert_eq!(s.ttft_cold_ms, (1000.0, 1000.0));
        assert_eq!(s.ttft_warm_ms, (100.0, 200.0));
        assert!((s.warm_over_cold() - 0.1).abs() < 1e-12);
    }

    #[test]
    fn prefilled_against_a_perfect_prefix_cache() {
        let with_ideal = |prompt, cached, ideal| Measurement {
            ideal_cached: Some(ideal),
            ..m(false, RequestKind::Agent, prompt, cached, 100.0)
        };
        // The ideal reuses 0, 1000 and 1200 tokens: it prefills 1000 + 200 + 300 = 1500; this
        // server missed 10 tokens of the second prompt, 1510 prefilled.
        let ms = vec![with_ideal(1000, 0, 0), with_ideal(1200, 990, 1000), with_ideal(1500, 1200, 1200)];
        let s = Summary::new("x", "w", &ms);
        assert_eq!((s.prefilled_tokens, s.ideal_prefilled_tokens), (1510, Some(1500)));
        assert!((s.prefilled_vs_ideal().unwrap() - 1510.0 / 1500.0).abs() < 1e-12);
        assert!(table(&[s]).contains("| 1.007x |"));

        // A failed request counts in neither sum.
        let mut failed = with_ideal(2000, 0, 1500);
        failed.error = Some("HTTP 500".into());
        let s = Summary::new("x", "w", &[ms.clone(), vec![failed]].concat());
        assert_eq!((s.prefilled_tokens, s.ideal_prefilled_tokens), (1510, Some(1500)));

        // No bound for one request: no ratio, shown as "-".
        let s = Summary::new("x", "w", &[ms, vec![m(false, RequestKind::Agent, 1600, 1500, 100.0)]].concat());
        assert_eq!((s.ideal_prefilled_tokens, s.prefilled_vs_ideal()), (None, None));
    }

    #[test]
    fn checkpoint_rows() {
        let c =
            CheckpointCounts { created: 9, restored: 4, erased_invalidated: 3, erased_old: 1, ..Default::default() };
        let t = checkpoint_table(&[("llama-server", "single", &c)]);
        assert_eq!(t.lines().nth(2), Some("| llama-server | single | 9 | 4 | 3 | 1 / 0 | 0 |"));
    }
}
