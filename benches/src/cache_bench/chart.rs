//! One SVG picture per workload, readable without the tool: TTFT of every request for each
//! server (left), and the cumulative prompt tokens each server had to prefill (right).

use super::client::Measurement;

const COLORS: &[&str] = &["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 300.0;
const MARGIN: f64 = 60.0;

/// A line of points in one panel.
struct Series<'a> {
    label: &'a str,
    color: &'a str,
    points: Vec<(f64, f64)>,
}

/// The SVG for one workload: `runs` holds (server label, its measurements).
pub fn workload_svg(workload: &str, runs: &[(String, Vec<Measurement>)]) -> String {
    let ttft: Vec<Series> = runs
        .iter()
        .enumerate()
        .map(|(i, (label, ms))| Series {
            label,
            color: COLORS[i % COLORS.len()],
            points: ms.iter().map(|m| ((m.index + 1) as f64, m.ttft_ms / 1e3)).collect(),
        })
        .collect();
    let prefilled: Vec<Series> = runs
        .iter()
        .enumerate()
        .map(|(i, (label, ms))| {
            let mut total = 0.0;
            Series {
                label,
                color: COLORS[i % COLORS.len()],
                points: ms
                    .iter()
                    .map(|m| {
                        total += m.prefilled() as f64;
                        ((m.index + 1) as f64, total)
                    })
                    .collect(),
            }
        })
        .collect();
    let width = 2.0 * (PANEL_W + 2.0 * MARGIN);
    let height = PANEL_H + 2.0 * MARGIN + 20.0 * runs.len() as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" \
         font-size=\"15\" text-anchor=\"middle\">cache-bench: {}</text>\n",
        width / 2.0,
        escape(workload)
    );
    svg.push_str(&panel(MARGIN, "time to first token (s) per request", &ttft));
    svg.push_str(&panel(PANEL_W + 3.0 * MARGIN, "cumulative prompt tokens prefilled", &prefilled));
    for (i, s) in ttft.iter().enumerate() {
        let y = PANEL_H + 2.0 * MARGIN + 20.0 * i as f64;
        svg.push_str(&format!(
            "<rect x=\"{MARGIN}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{}\"/><text x=\"{}\" y=\"{y}\">{}</text>\n",
            y - 6.0,
            s.color,
            MARGIN + 20.0,
            escape(s.label)
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

fn panel(left: f64, title: &str, series: &[Series]) -> String {
    let top = MARGIN;
    let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0, f64::max);
    let y_max = nice_ceiling(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0, f64::max));
    let x = |v: f64| left + (v - 1.0) / (x_max - 1.0).max(1.0) * PANEL_W;
    let y = |v: f64| top + PANEL_H - v / y_max * PANEL_H;
    let mut out = format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n<rect x=\"{left}\" y=\"{top}\" width=\"{PANEL_W}\" \
         height=\"{PANEL_H}\" fill=\"none\" stroke=\"#888\"/>\n",
        left + PANEL_W / 2.0,
        top - 10.0,
        escape(title)
    );
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        out.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy}\" y2=\"{yy}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{}\" \
             text-anchor=\"end\">{}</text>\n",
            left + PANEL_W,
            left - 6.0,
            y(v) + 4.0,
            label(v),
            yy = y(v)
        ));
    }
    let step = (x_max / 8.0).ceil().max(1.0);
    let mut tick = 1.0;
    while tick <= x_max {
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            x(tick),
            top + PANEL_H + 16.0,
            tick
        ));
        tick += step;
    }
    out.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">request</text>\n",
        left + PANEL_W / 2.0,
        top + PANEL_H + 34.0
    ));
    for s in series {
        let path: Vec<String> = s.points.iter().map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b))).collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            s.color,
            path.join(" ")
        ));
        for &(a, b) in &s.points {
            out.push_str(&format!("<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{}\"/>\n", x(a), y(b), s.color));
        }
    }
    out
}

/// The smallest 1, 2 or 5 times a power of ten at or above `v` (1 for nothing).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|&c| c >= v).unwrap_or(10.0 * p)
}

fn label(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(12_000.0), 20_000.0);
        assert_eq!(nice_ceiling(50.0), 50.0);
    }
}
