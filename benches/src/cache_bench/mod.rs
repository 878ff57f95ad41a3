//! `cache-bench`: replays agent-shaped sessions against OpenAI-compatible servers and reports how
//! much of each prompt the server did not recompute, and what that did to the time to first token.
//!
//! - [`workload`]: the sessions, generated from a seed ([`agent`] and [`text`] make their parts);
//! - [`client`]: the streaming replay and what each request measured;
//! - [`ideal`]: the most any prefix cache could reuse, the bound a hit ratio is judged by;
//! - [`report`], [`chart`]: tables, JSON and SVG pictures;
//! - [`servers`]: starting radix-serve and llama-server for `compare`.

pub mod agent;
pub mod chart;
pub mod client;
pub mod ideal;
pub mod report;
pub mod servers;
pub mod text;
pub mod workload;

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

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
    std::fs::write(out.join("table.md"), &table)?;
    let records = json!({
        "command": command,
        "seed": seed,
        "sizes": sizes,
        "summaries": summaries,
        "runs": runs.iter().map(|r| json!({"server": r.server, "workload": r.workload, "requests": r.measurements})).collect::<Vec<_>>(),
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
