//! `cache-bench`: replays agent-shaped sessions against OpenAI-compatible servers and reports how
//! much of each prompt the server did not recompute, and what that did to the time to first token.
//!
//! - [`workload`]: the sessions, generated from a seed ([`agent`] and [`text`] make their parts);
//! - [`recorded`]: the same from a real agent's recorded requests;
//! - [`client`]: the streaming replay and what each request measured;
//! - [`ideal`]: the most any prefix cache could reuse, the bound a hit ratio is judged by;
//! - [`report`], [`chart`]: tables, JSON and SVG pictures;
//! - [`servers`]: starting radix-serve and llama-server for `compare`;
//! - [`checkpoints`]: llama-server's context-checkpoint events, counted from its log.

pub mod agent;
pub mod chart;
pub mod checkpoints;
pub mod client;
pub mod ideal;
pub mod recorded;
pub mod report;
pub mod servers;
pub mod text;
pub mod workload;

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use checkpoints::CheckpointCounts;
use client::Measurement;
use report::Summary;
use workload::Sizes;

/// One workload replayed against one server.
pub struct Run {
    /// The server's label.
    pub server: String,
    /// The workload's name.
    pub workload: String,
    /// Per request, in order.
    pub measurements: Vec<Measurement>,
    /// llama-server's context-checkpoint events, from its log (`compare` only; `None` for
    /// radix-serve and for servers whose log we do not have).
    pub checkpoints: Option<CheckpointCounts>,
}

/// Writes `results.json`, `table.md` and one `<workload>.svg` per workload into `out`, and
/// returns the table. `ours` names the server the ratio table compares the others with.
pub fn write_outputs(
    out: &Path,
    runs: &[Run],
    ours: Option<&str>,
    seed: u64,
    sizes: &Sizes,
    command: &str,
) -> Result<String> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let summaries: Vec<Summary> = runs.iter().map(|r| Summary::new(&r.server, &r.workload, &r.measurements)).collect();
    for s in summaries.iter().filter(|s| s.report_mismatches > 0) {
        eprintln!(
            "warning: {} on {}: usage.prompt_tokens_details.cached_tokens and timings.cache_n disagree on {} requests",
            s.server, s.workload, s.report_mismatches
        );
    }
    let mut table = report::table(&summaries);
    if let Some(ours) =
        ours.filter(|o| summaries.iter().any(|s| s.server != *o) && summaries.iter().any(|s| s.server == *o))
    {
        table.push('\n');
        table.push_str(&report::ratio_table(ours, &summaries));
    }
    // Only runs that touched checkpoints: dense models' logs have none, and an all-zero table
    // would only say so at length.
    let with_checkpoints: Vec<(&str, &str, &CheckpointCounts)> = runs
        .iter()
        .filter_map(|r| r.checkpoints.as_ref().filter(|c| c.any()).map(|c| (r.server.as_str(), r.workload.as_str(), c)))
        .collect();
    if !with_checkpoints.is_empty() {
        table.push('\n');
        table.push_str(&report::checkpoint_table(&with_checkpoints));
    }
    std::fs::write(out.join("table.md"), &table)?;
    let records = json!({
        "command": command,
        "seed": seed,
        "sizes": sizes,
        "summaries": summaries,
        "runs": runs.iter().map(|r| json!({"server": r.server, "workload": r.workload, "checkpoints": r.checkpoints, "requests": r.measurements})).collect::<Vec<_>>(),
    });
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&records)?)?;
    let mut workloads: Vec<&str> = Vec::new();
    for r in runs {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    for w in workloads {
        let series: Vec<(String, Vec<Measurement>)> =
            runs.iter().filter(|r| r.workload == w).map(|r| (r.server.clone(), r.measurements.clone())).collect();
        std::fs::write(out.join(format!("{w}.svg")), chart::workload_svg(w, &series))?;
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use workload::RequestKind;

    fn request(prompt: usize, cached: usize, ideal: usize) -> Measurement {
        Measurement {
            index: 0,
            conversation: "s0".into(),
            session: 0,
            kind: RequestKind::Agent,
            first: cached == 0,
            prompt_tokens: prompt,
            cached_tokens: cached,
            cached_source: "usage",
            timings_cache_n: None,
            ideal_cached: Some(ideal),
            completion_tokens: 1,
            ttft_ms: 100.0,
            total_ms: 110.0,
            sent_at_ms: 0.0,
            error: None,
        }
    }

    fn run(server: &str, checkpoints: Option<CheckpointCounts>) -> Run {
        Run {
            server: server.into(),
            workload: "single".into(),
            measurements: vec![request(1000, 0, 0), request(1200, 999, 999)],
            checkpoints,
        }
    }

    /// The checkpoint table appears only when some run had checkpoint events, and the counts
    /// reach results.json.
    #[test]
    fn checkpoint_table_only_for_runs_with_events() {
        let out = std::env::temp_dir().join(format!("cache-bench-outputs-{}", std::process::id()));
        let write = |runs: &[Run]| write_outputs(&out, runs, Some("ours"), 1, &Sizes::smollm2(), "test").unwrap();

        // A dense model: llama-server's log had no event.
        let dense = [run("ours", None), run("llama-server", Some(CheckpointCounts::default()))];
        let table = write(&dense);
        assert!(table.contains("| 1.000x |") && !table.contains("checkpoints created"), "{table}");

        let hybrid = CheckpointCounts { created: 5, restored: 1, full_reprocessing: 1, ..Default::default() };
        let table = write(&[run("ours", None), run("llama-server", Some(CheckpointCounts::default())), {
            let mut r = run("llama-server -np 1", Some(hybrid));
            r.measurements[1].cached_tokens = 0;
            r
        }]);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| llama-server -np 1 | single | 5 |")).collect();
        assert_eq!(rows, ["| llama-server -np 1 | single | 5 | 1 | 0 | 0 / 0 | 1 |"], "{table}");
        assert!(!table.contains("| llama-server | single | 0 |"), "{table}");
        // 2200 prefilled where the ideal prefilled 1000 + 201.
        assert!(table.contains("| 1.832x |"), "{table}");

        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
        assert_eq!(json["runs"][0]["checkpoints"], serde_json::Value::Null);
        assert_eq!(json["runs"][2]["checkpoints"]["full_reprocessing"], 1);
        assert_eq!(json["summaries"][2]["ideal_prefilled_tokens"], 1201);
        std::fs::remove_dir_all(&out).unwrap();
    }
}
