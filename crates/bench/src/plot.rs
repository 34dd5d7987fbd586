//! `sim --plot FILE.svg`: two bar charts side by side, token hit rate and
//! TTFT (mean and p99) by policy, as a self-contained SVG (no plotting
//! dependency; the numbers are printed on the bars).

use std::fmt::Write as _;

use crate::sim::SimResult;

const PANEL_W: f64 = 460.0;
const LEFT: f64 = 130.0;
const TOP: f64 = 50.0;
const ROW: f64 = 30.0;

/// The chart for `results`, titled `title`.
pub(crate) fn svg(title: &str, results: &[SimResult]) -> String {
    let rows = results.len().max(1) as f64;
    let height = TOP + rows * ROW + 40.0;
    let width = 2.0 * (LEFT + PANEL_W) + 40.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="10" y="20" font-size="14" font-weight="bold">{}</text>"#, escape(title));
    let hit: Vec<(f64, f64)> = results.iter().map(|r| (r.hit_rate, 0.0)).collect();
    panel(&mut s, 0.0, "token hit rate", results, &hit, |v| format!("{v:.3}"));
    let ttft: Vec<(f64, f64)> = results.iter().map(|r| (r.ttft_mean_s, r.ttft_p99_s)).collect();
    panel(&mut s, LEFT + PANEL_W + 20.0, "TTFT mean (dark) and p99 (light), s", results, &ttft, |v| format!("{v:.2}"));
    s.push_str("</svg>\n");
    s
}

/// One panel at horizontal offset `x0`: per row a dark bar for `.0` and, when non-zero, a light one for `.1`.
fn panel(
    s: &mut String,
    x0: f64,
    label: &str,
    results: &[SimResult],
    values: &[(f64, f64)],
    fmt: impl Fn(f64) -> String,
) {
    let max = values.iter().map(|(a, b)| a.max(*b)).fold(0.0, f64::max).max(1e-9);
    let scale = (PANEL_W - 60.0) / max;
    let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, x0 + LEFT, TOP - 12.0, escape(label));
    for (i, (r, (a, b))) in results.iter().zip(values).enumerate() {
        let y = TOP + i as f64 * ROW;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            x0 + LEFT - 8.0,
            y + 17.0,
            escape(&r.policy)
        );
        if *b > 0.0 {
            let _ = writeln!(
                s,
                r##"<rect x="{}" y="{y}" width="{:.1}" height="{}" fill="#a6c8ea"/>"##,
                x0 + LEFT,
                b * scale,
                ROW - 6.0
            );
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{}" fill="#555">{}</text>"##,
                x0 + LEFT + b * scale + 4.0,
                y + 17.0,
                fmt(*b)
            );
        }
        let (h, dy) = if *b > 0.0 { ((ROW - 6.0) / 2.0, (ROW - 6.0) / 4.0) } else { (ROW - 6.0, 0.0) };
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="{:.1}" height="{h}" fill="#2b6cb0"/>"##,
            x0 + LEFT,
            y + dy,
            a * scale
        );
        if *b == 0.0 {
            let _ = writeln!(s, r#"<text x="{:.1}" y="{}">{}</text>"#, x0 + LEFT + a * scale + 4.0, y + 17.0, fmt(*a));
        } else {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" font-size="10">{}</text>"#,
                x0 + LEFT + a * scale + 3.0,
                y + dy + h - 2.0,
                fmt(*a)
            );
        }
    }
    let axis_y = TOP + results.len() as f64 * ROW;
    let _ = writeln!(s, r#"<line x1="{0}" y1="{1}" x2="{0}" y2="{axis_y}" stroke="black"/>"#, x0 + LEFT, TOP - 4.0);
}

pub(crate) fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(policy: &str, hit: f64, mean: f64, p99: f64) -> SimResult {
        SimResult {
            policy: policy.into(),
            requests: 10,
            hit_rate: hit,
            ttft_mean_s: mean,
            ttft_p50_s: mean,
            ttft_p99_s: p99,
            prefill_work_max_over_mean: 1.0,
            regret: 0.0,
            oracle_regret: 0.0,
        }
    }

    #[test]
    fn draws_one_row_per_policy_with_bars_scaled_to_the_largest() {
        let out = svg("a <trace>", &[result("round_robin", 0.05, 1.0, 4.0), result("cache_aware", 0.30, 0.5, 2.0)]);
        assert!(out.starts_with("<svg") && out.trim_end().ends_with("</svg>"));
        assert!(out.contains("a &lt;trace&gt;"), "title escaped");
        assert_eq!(out.matches(">round_robin</text>").count(), 2, "a row in each panel");
        assert!(
            out.contains(">0.300</text>") && out.contains(">4.00</text>") && out.contains(">0.50</text>"),
            "values printed"
        );
        // The largest value of each panel spans the full bar width (PANEL_W - 60).
        assert_eq!(out.matches(r#"width="400.0""#).count(), 2, "{out}");
    }
}
