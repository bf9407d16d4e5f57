//! A self-contained SVG chart of a run: training loss (left panel) and every development
//! metric (right panel) against the optimizer step. No plotting dependency: the chart is a
//! few polylines, axes and labels.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::checkpoint::HistoryEntry;

const W: f64 = 960.0;
const H: f64 = 400.0;
const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 290.0;
const TOP: f64 = 50.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if (hi - lo).abs() < 1e-12 {
        return (lo - 0.5, hi + 0.5);
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn panel(out: &mut String, left: f64, title: &str, series: &[Series], max_step: f64) {
    let (ylo, yhi) = range(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let x = |s: f64| left + s / max_step.max(1.0) * PANEL_W;
    let y = |v: f64| TOP + PANEL_H - (v - ylo) / (yhi - ylo) * PANEL_H;
    let _ = writeln!(
        out,
        r##"<rect x="{left}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="15">{}</text>"#,
        left + PANEL_W / 2.0,
        TOP - 12.0,
        escape(title)
    );
    for i in 0..=4 {
        let v = ylo + (yhi - ylo) * f64::from(i) / 4.0;
        let s = max_step * f64::from(i) / 4.0;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end" font-size="11">{v:.3}</text>"#,
            left - 4.0,
            y(v) + 4.0
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="11">{s:.0}</text>"#,
            x(s),
            TOP + PANEL_H + 16.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="12">optimizer step</text>"#,
        left + PANEL_W / 2.0,
        TOP + PANEL_H + 34.0
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            pts.join(" ")
        );
        for &(a, b) in &s.points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                x(a),
                y(b)
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" font-size="12" fill="{color}">{}</text>"#,
            left + 8.0,
            TOP + 16.0 + 15.0 * i as f64,
            escape(&s.name)
        );
    }
}

/// The SVG document for `history`.
pub(crate) fn history_svg(history: &[HistoryEntry]) -> String {
    let max_step = history.iter().map(|h| h.step).max().unwrap_or(1) as f64;
    let loss = Series {
        name: "training loss (mean since the previous point)".into(),
        points: history
            .iter()
            .filter_map(|h| h.loss.map(|l| (h.step as f64, l)))
            .collect(),
    };
    let mut metrics: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for h in history {
        for (k, v) in &h.metrics {
            metrics.entry(k).or_default().push((h.step as f64, *v));
        }
    }
    let metric_series: Vec<Series> = metrics
        .into_iter()
        .map(|(k, points)| Series {
            name: k.to_string(),
            points,
        })
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif">"#
    );
    let _ = writeln!(out, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    panel(&mut out, 60.0, "Training loss", &[loss], max_step);
    panel(
        &mut out,
        60.0 + PANEL_W + 60.0,
        "Development metrics (x100)",
        &metric_series,
        max_step,
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_one_line_per_series_and_every_point() {
        let h = vec![
            HistoryEntry {
                step: 0,
                loss: None,
                lr: None,
                metrics: vec![("p_mrr".into(), 20.0), ("ndcg_at_10".into(), 80.0)],
            },
            HistoryEntry {
                step: 10,
                loss: Some(1.5),
                lr: Some(1e-5),
                metrics: vec![("p_mrr".into(), 30.0), ("ndcg_at_10".into(), 82.0)],
            },
            HistoryEntry {
                step: 20,
                loss: Some(1.0),
                lr: Some(0.0),
                metrics: vec![],
            },
        ];
        let svg = history_svg(&h);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        // 2 loss points + 2 p_mrr + 2 ndcg points.
        assert_eq!(svg.matches("<circle").count(), 6);
        assert!(svg.contains("p_mrr") && svg.contains("ndcg_at_10"));
    }
}
