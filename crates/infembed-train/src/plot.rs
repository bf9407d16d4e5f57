//! Charts drawn with `plotters`, each as SVG and as PNG (the same drawing code on both
//! backends): the training chart of a run ([`training_chart`]: per-step loss with a smoothed
//! line, the learning rate, one panel per development metric) and the evaluation chart of one or
//! more models on an instruction-following test ([`evaluation_chart`]: the distribution of
//! per-query p-MRR and each changed document's rank under the original and the changed
//! instruction).
//!
//! Text is laid out with a font compiled into the crate (`assets/DejaVuSans-subset.ttf`, an
//! ASCII subset of DejaVu Sans; see `assets/README.md`), so the charts are the same on every
//! machine and need no system font.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::checkpoint::{HistoryEntry, StepRecord};
use crate::error::{Error, Result};

const FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");
const FONT: &str = "sans-serif";
static REGISTER: Once = Once::new();

/// Series colors (color-blind-safe, Okabe and Ito).
const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];

/// Colors of the development metrics' panels (the loss and learning rate have the first and
/// the third of the palette).
const METRIC_COLORS: [RGBColor; 4] = [PALETTE[1], PALETTE[3], PALETTE[4], PALETTE[5]];

/// One panel's size.
const PANEL: (u32, u32) = (560, 330);

/// A chart drawn twice: as an SVG document and as a PNG image of the same pixels' worth.
#[derive(Debug, Clone)]
pub struct Chart {
    /// The SVG document.
    pub svg: String,
    /// The PNG file's bytes (8-bit RGB).
    pub png: Vec<u8>,
    /// Width and height in pixels.
    pub size: (u32, u32),
}

impl Chart {
    /// Writes `<stem>.svg` and `<stem>.png` (each atomically: a complete file or the previous
    /// one). Returns both paths.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn write(&self, stem: &Path) -> Result<[PathBuf; 2]> {
        let svg = stem.with_extension("svg");
        let png = stem.with_extension("png");
        crate::checkpoint::write_atomic(&svg, self.svg.as_bytes())?;
        crate::checkpoint::write_atomic(&png, &self.png)?;
        Ok([svg, png])
    }
}

fn chart_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Chart {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// Draws with `svg_draw` on an SVG backend and with `bitmap_draw` (the same drawing code,
/// instantiated for the other backend) on an RGB bitmap, and encodes the bitmap as PNG.
fn render<S, B>(what: &str, size: (u32, u32), svg_draw: S, bitmap_draw: B) -> Result<Chart>
where
    S: Fn(&DrawingArea<SVGBackend<'_>, Shift>) -> std::result::Result<(), String>,
    B: Fn(&DrawingArea<BitMapBackend<'_>, Shift>) -> std::result::Result<(), String>,
{
    REGISTER.call_once(|| {
        // The bytes are the crate's own asset: parsing them cannot fail unless the build is
        // broken, and the drawing below then reports the missing font.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES);
    });
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        svg_draw(&root).map_err(|e| chart_error(what, e))?;
        root.present().map_err(|e| chart_error(what, e))?;
    }
    let mut pixels = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, size).into_drawing_area();
        bitmap_draw(&root).map_err(|e| chart_error(what, e))?;
        root.present().map_err(|e| chart_error(what, e))?;
    }
    let mut png = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut png, size.0, size.1);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(|e| chart_error(what, e))?;
        writer
            .write_image_data(&pixels)
            .map_err(|e| chart_error(what, e))?;
        writer.finish().map_err(|e| chart_error(what, e))?;
    }
    Ok(Chart { svg, png, size })
}

/// A tick label: as many decimals as the spacing of about six ticks over `span` needs,
/// scientific notation for values too small for that to read well.
fn tick_label(v: f64, span: f64) -> String {
    // A tick at zero computed as lo + k * step can land a rounding error away from it.
    if v.abs() <= span.abs() * 1e-9 {
        return "0".into();
    }
    let step = span.abs() / 6.0;
    if step > 0.0 && step < 1e-3 {
        return format!("{v:.1e}");
    }
    let decimals = if step >= 1.0 || step <= 0.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

/// `[lo, hi]` of the values, padded by 5 % (a unit around a single value).
fn value_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi - lo < 1e-12 {
        lo.abs().max(1e-6) * 0.05
    } else {
        (hi - lo) * 0.05
    };
    (lo - pad, hi + pad)
}

/// The trailing window of the smoothed loss for a run of `n` steps: about 1/25 of the run,
/// between 1 and 200 steps.
pub(crate) fn smoothing_window(n: usize) -> usize {
    n.div_ceil(25).clamp(1, 200)
}

/// Trailing mean of `values` over `window` (fewer at the start).
pub(crate) fn trailing_mean(values: &[f64], window: usize) -> Vec<f64> {
    let window = window.max(1);
    let mut out = Vec::with_capacity(values.len());
    let mut sum = 0.0;
    for (i, v) in values.iter().enumerate() {
        sum += v;
        if i >= window {
            sum -= values[i - window];
        }
        out.push(sum / (i + 1).min(window) as f64);
    }
    out
}

/// One line of a panel: its label (drawn in its color under the panel's title), color,
/// width and points.
struct Line {
    points: Vec<(f64, f64)>,
    color: RGBColor,
    width: u32,
    /// Draw a dot at every point (sparse series such as evaluations).
    dots: bool,
}

/// A panel of lines against the optimizer step, its own y axis.
struct Panel {
    title: String,
    y_desc: String,
    lines: Vec<Line>,
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    max_step: f64,
) -> std::result::Result<(), String> {
    let (lo, hi) = value_range(
        panel
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1)),
    );
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, (FONT, 15))
        .margin(8)
        .margin_right(24)
        .x_label_area_size(38)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..max_step.max(1.0), lo..hi)
        .map_err(|e| e.to_string())?;
    let span = hi - lo;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(6)
        .x_desc("optimizer step")
        .y_desc(&panel.y_desc)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| tick_label(*v, span))
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(|e| e.to_string())?;
    for line in &panel.lines {
        let style = ShapeStyle::from(line.color).stroke_width(line.width);
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), style))
            .map_err(|e| e.to_string())?;
        if line.dots {
            chart
                .draw_series(
                    line.points
                        .iter()
                        .map(|&p| Circle::new(p, 3, line.color.filled())),
                )
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The training chart of a run: per-step loss (thin) with its trailing mean (bold) in the
/// first panel, the learning rate in the second, then one panel per development metric (each
/// on its own axis, a dot per evaluation). Without per-step records (a history from before
/// they were kept) the loss panel shows the history's mean loss per evaluation.
///
/// # Errors
/// [`Error::Chart`] when drawing fails.
pub fn training_chart(steps: &[StepRecord], history: &[HistoryEntry]) -> Result<Chart> {
    let max_step = steps
        .iter()
        .map(|s| s.step)
        .chain(history.iter().map(|h| h.step))
        .max()
        .unwrap_or(1) as f64;
    let mut panels = Vec::new();
    if steps.is_empty() {
        panels.push(Panel {
            title: "training loss (mean between evaluations)".into(),
            y_desc: "loss".into(),
            lines: vec![Line {
                points: history
                    .iter()
                    .filter_map(|h| h.loss.map(|l| (h.step as f64, l)))
                    .collect(),
                color: PALETTE[0],
                width: 2,
                dots: true,
            }],
        });
        panels.push(Panel {
            title: "learning rate".into(),
            y_desc: "learning rate".into(),
            lines: vec![Line {
                points: history
                    .iter()
                    .filter_map(|h| h.lr.map(|l| (h.step as f64, l)))
                    .collect(),
                color: PALETTE[2],
                width: 2,
                dots: false,
            }],
        });
    } else {
        let losses: Vec<f64> = steps.iter().map(|s| s.loss).collect();
        let window = smoothing_window(steps.len());
        let smooth = trailing_mean(&losses, window);
        let xs: Vec<f64> = steps.iter().map(|s| s.step as f64).collect();
        panels.push(Panel {
            title: format!("training loss (thin: each step; bold: mean of the last {window})"),
            y_desc: "loss".into(),
            lines: vec![
                Line {
                    points: xs.iter().copied().zip(losses.iter().copied()).collect(),
                    color: RGBColor(160, 190, 220),
                    width: 1,
                    dots: false,
                },
                Line {
                    points: xs.iter().copied().zip(smooth).collect(),
                    color: PALETTE[0],
                    width: 2,
                    dots: false,
                },
            ],
        });
        panels.push(Panel {
            title: "learning rate".into(),
            y_desc: "learning rate".into(),
            lines: vec![Line {
                points: steps.iter().map(|s| (s.step as f64, s.lr)).collect(),
                color: PALETTE[2],
                width: 2,
                dots: false,
            }],
        });
    }
    // In the order the evaluator reports them (its first metric first).
    let mut metrics: Vec<(&str, Vec<(f64, f64)>)> = Vec::new();
    for h in history {
        for (k, v) in &h.metrics {
            match metrics.iter_mut().find(|(name, _)| name == k) {
                Some((_, points)) => points.push((h.step as f64, *v)),
                None => metrics.push((k, vec![(h.step as f64, *v)])),
            }
        }
    }
    for (i, (name, points)) in metrics.into_iter().enumerate() {
        panels.push(Panel {
            title: format!("dev {name} (x100)"),
            y_desc: name.to_string(),
            lines: vec![Line {
                points,
                color: METRIC_COLORS[i % METRIC_COLORS.len()],
                width: 2,
                dots: true,
            }],
        });
    }
    let cols = 2u32;
    let rows = (panels.len() as u32).div_ceil(cols);
    let size = (PANEL.0 * cols, PANEL.1 * rows);
    render(
        "the training chart",
        size,
        |root| draw_panels(root, &panels, (rows, cols), max_step),
        |root| draw_panels(root, &panels, (rows, cols), max_step),
    )
}

fn draw_panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    panels: &[Panel],
    (rows, cols): (u32, u32),
    max_step: f64,
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((rows as usize, cols as usize));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel, max_step)?;
    }
    Ok(())
}

/// What [`evaluation_chart`] draws for one model.
#[derive(Debug, Clone)]
pub struct EvalSeries {
    /// The legend's label, e.g. `zero-shot` or `fine-tuned`.
    pub label: String,
    /// p-MRR of each query, as fractions in `[-1, 1]`.
    pub per_query: Vec<f64>,
    /// `(rank under the original instruction, rank under the changed one)` of each changed
    /// document, 1-based.
    pub ranks: Vec<(usize, usize)>,
}

/// The evaluation chart of one or more models on one instruction-following test: left, the
/// distribution of per-query p-MRR (x100, bins of 10, one bar per model in each bin); right,
/// each changed document's rank under the changed instruction against its rank under the
/// original (log axes; above the diagonal = pushed down, which is what the changed
/// instruction asks for). The legend is a line of colored labels above the panels.
///
/// # Errors
/// [`Error::Chart`] when drawing fails (a series without queries or documents draws as empty,
/// not as an error).
pub fn evaluation_chart(title: &str, series: &[EvalSeries]) -> Result<Chart> {
    const BINS: usize = EVAL_BINS;
    let counts: Vec<[usize; BINS]> = series
        .iter()
        .map(|s| {
            let mut c = [0usize; BINS];
            for v in &s.per_query {
                let bin = (((v * 100.0) + 100.0) / 10.0)
                    .floor()
                    .clamp(0.0, (BINS - 1) as f64);
                c[bin as usize] += 1;
            }
            c
        })
        .collect();
    let max_count = counts
        .iter()
        .flat_map(|c| c.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let max_rank = series
        .iter()
        .flat_map(|s| s.ranks.iter().map(|&(a, b)| a.max(b)))
        .max()
        .unwrap_or(1)
        .max(5) as f64
        * 1.15
        + 0.5;
    let size = (PANEL.0 * 2, PANEL.1 + 80);
    let view = EvalView {
        title,
        series,
        counts: &counts,
        max_count,
        max_rank,
    };
    render(
        "the evaluation chart",
        size,
        |root| draw_eval(root, &view),
        |root| draw_eval(root, &view),
    )
}

/// The evaluation chart's axes: the fonts and grid of every chart, whole-number labels.
fn whole_number_mesh<'m, 'a, 'b, X, Y, DB>(
    mesh: &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>,
) -> &'m mut plotters::chart::MeshStyle<'a, 'b, X, Y, DB>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    DB: DrawingBackend,
{
    mesh.label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
}

/// What [`draw_eval`] needs, computed once for both backends.
struct EvalView<'a> {
    title: &'a str,
    series: &'a [EvalSeries],
    counts: &'a [[usize; EVAL_BINS]],
    max_count: usize,
    max_rank: f64,
}

/// Bins of the per-query p-MRR histogram (width 10 over `[-100, 100]`).
const EVAL_BINS: usize = 20;

fn draw_eval<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    view: &EvalView<'_>,
) -> std::result::Result<(), String> {
    let EvalView {
        title,
        series,
        counts,
        max_count,
        max_rank,
    } = *view;
    let n = series.len().max(1);
    {
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (header, body) = root.split_vertically(64);
        header
            .draw(&Text::new(title.to_string(), (16, 8), (FONT, 16)))
            .map_err(|e| e.to_string())?;
        header
            .draw(&Text::new(
                "right: above the diagonal = pushed down, as the changed instruction asks; \
                 circle area = documents",
                (PANEL.0 as i32 + 8, 10),
                (FONT, 12).into_font().color(&RGBColor(90, 90, 90)),
            ))
            .map_err(|e| e.to_string())?;
        let mut x = 16i32;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let mean = if s.per_query.is_empty() {
                "n/a".to_string()
            } else {
                format!(
                    "{:.2}",
                    100.0 * s.per_query.iter().sum::<f64>() / s.per_query.len() as f64
                )
            };
            let label = format!(
                "{}: p-MRR {mean}, {} queries, {} changed documents",
                s.label,
                s.per_query.len(),
                s.ranks.len()
            );
            header
                .draw(&Rectangle::new([(x, 38), (x + 14, 52)], color.filled()))
                .map_err(|e| e.to_string())?;
            header
                .draw(&Text::new(
                    label.clone(),
                    (x + 20, 38),
                    (FONT, 13).into_font().color(&color),
                ))
                .map_err(|e| e.to_string())?;
            let width = header
                .estimate_text_size(&label, &TextStyle::from((FONT, 13).into_font()))
                .map_or(300, |(w, _)| w as i32);
            x += width + 44;
        }
        let (left, right) = body.split_horizontally(PANEL.0);
        let mut hist = ChartBuilder::on(&left)
            .caption("per-query p-MRR (x100)", (FONT, 15))
            .margin(8)
            .margin_right(24)
            .x_label_area_size(38)
            .y_label_area_size(56)
            .build_cartesian_2d(-100f64..100f64, 0f64..(max_count as f64 * 1.1))
            .map_err(|e| e.to_string())?;
        whole_number_mesh(&mut hist.configure_mesh())
            .x_labels(11)
            .y_labels(6)
            .x_desc("p-MRR x100 (positive: the changed instruction was followed)")
            .y_desc("queries")
            .draw()
            .map_err(|e| e.to_string())?;
        let bar = 10.0 / n as f64;
        for (i, c) in counts.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            hist.draw_series(c.iter().enumerate().filter(|(_, k)| **k > 0).map(|(b, k)| {
                let x0 = -100.0 + 10.0 * b as f64 + bar * i as f64;
                Rectangle::new(
                    [(x0 + 0.4, 0.0), (x0 + bar - 0.4, *k as f64)],
                    color.filled(),
                )
            }))
            .map_err(|e| e.to_string())?;
        }
        // Documents at the same pair of ranks are one circle whose area grows with their
        // number; each model's circles are shifted a little sideways so both stay visible.
        let groups: Vec<Vec<((usize, usize), usize)>> = series
            .iter()
            .map(|s| {
                let mut counts: std::collections::BTreeMap<(usize, usize), usize> =
                    std::collections::BTreeMap::new();
                for &r in &s.ranks {
                    *counts.entry(r).or_default() += 1;
                }
                counts.into_iter().collect()
            })
            .collect();
        let log = max_rank > 40.0;
        let offset = |i: usize| i as f64 - (n as f64 - 1.0) / 2.0;
        macro_rules! scatter {
            ($x:expr, $y:expr, $lo:expr, $shift:expr) => {{
                let mut scatter = ChartBuilder::on(&right)
                    .caption(
                        "changed documents: rank, original vs changed instruction",
                        (FONT, 15),
                    )
                    .margin(8)
                    .margin_right(24)
                    .x_label_area_size(38)
                    .y_label_area_size(56)
                    .build_cartesian_2d($x, $y)
                    .map_err(|e| e.to_string())?;
                whole_number_mesh(&mut scatter.configure_mesh())
                    .x_desc("rank under the original instruction")
                    .y_desc("rank under the changed instruction")
                    .draw()
                    .map_err(|e| e.to_string())?;
                scatter
                    .draw_series(LineSeries::new(
                        [($lo, $lo), (max_rank, max_rank)],
                        ShapeStyle::from(RGBColor(120, 120, 120)).stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?;
                for (i, group) in groups.iter().enumerate() {
                    let color = PALETTE[i % PALETTE.len()];
                    let shift: &dyn Fn(f64) -> f64 = &|x| $shift(x, offset(i));
                    scatter
                        .draw_series(group.iter().map(|&((og, changed), count)| {
                            let radius = 3.0 * (count as f64).sqrt();
                            Circle::new(
                                (shift(og as f64), changed as f64),
                                radius.round() as u32,
                                ShapeStyle::from(color.mix(0.6)).filled(),
                            )
                        }))
                        .map_err(|e| e.to_string())?;
                }
            }};
        }
        if log {
            scatter!(
                (0.8f64..max_rank).log_scale(),
                (0.8f64..max_rank).log_scale(),
                0.8,
                |x: f64, o: f64| x * 10f64.powf(0.015 * o)
            );
        } else {
            scatter!(0.5f64..max_rank, 0.5f64..max_rank, 0.5, |x: f64, o: f64| x
                + 0.12 * o);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoded PNG: width, height, RGB bytes.
    fn decode(png_bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
        let mut reader = decoder.read_info().expect("a PNG");
        let mut buf = vec![0; reader.output_buffer_size().expect("size")];
        let info = reader.next_frame(&mut buf).expect("a frame");
        assert_eq!(info.color_type, png::ColorType::Rgb);
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    fn run(n: usize) -> (Vec<StepRecord>, Vec<HistoryEntry>) {
        let steps: Vec<StepRecord> = (1..=n)
            .map(|i| StepRecord {
                step: i,
                epoch: 0,
                loss: 2.0 * (-(i as f64) / 40.0).exp() + 0.3 * ((i * 7919) % 13) as f64 / 13.0,
                lr: 2e-5 * (1.0 - i as f64 / n as f64),
            })
            .collect();
        let history = (0..=4)
            .map(|k| HistoryEntry {
                step: k * n / 4,
                loss: None,
                lr: None,
                metrics: vec![
                    ("p_mrr".into(), 10.0 + 5.0 * k as f64),
                    ("ndcg_at_10".into(), 80.0 + k as f64),
                ],
            })
            .collect();
        (steps, history)
    }

    /// Pixels of exactly `color` in the rectangle `[x0, x1) x [y0, y1)`.
    fn pixels(
        img: &(u32, u32, Vec<u8>),
        color: RGBColor,
        (x0, x1, y0, y1): (u32, u32, u32, u32),
    ) -> Vec<(u32, u32)> {
        let (w, _, data) = img;
        let mut out = Vec::new();
        for y in y0..y1 {
            for x in x0..x1 {
                let i = 3 * (y * w + x) as usize;
                if data[i..i + 3] == [color.0, color.1, color.2] {
                    out.push((x, y));
                }
            }
        }
        out
    }

    fn mean_y(points: &[(u32, u32)]) -> f64 {
        points.iter().map(|p| f64::from(p.1)).sum::<f64>() / points.len().max(1) as f64
    }

    /// Nothing is drawn on the canvas's outer `band` pixels: no panel is cut at the edge.
    fn assert_white_border(img: &(u32, u32, Vec<u8>), band: u32) {
        let (w, h, data) = img;
        for y in 0..*h {
            for x in 0..*w {
                if x < band || y < band || x >= w - band || y >= h - band {
                    let i = 3 * (y * w + x) as usize;
                    assert_eq!(&data[i..i + 3], &[255, 255, 255], "ink at ({x}, {y})");
                }
            }
        }
    }

    #[test]
    fn the_training_png_has_each_series_in_its_panel_and_nothing_at_the_edges() {
        let (steps, history) = run(200);
        let chart = training_chart(&steps, &history).unwrap();
        let img = decode(&chart.png);
        // Loss, learning rate and two metrics: a 2 x 2 grid.
        assert_eq!((img.0, img.1), (2 * PANEL.0, 2 * PANEL.1));
        assert_eq!(chart.size, (img.0, img.1));
        assert_white_border(&img, 3);
        let (pw, ph) = PANEL;
        // The smoothed loss in the top-left panel, falling from left to right.
        let loss = pixels(&img, PALETTE[0], (0, pw, 0, ph));
        assert!(loss.len() > 200, "{} loss pixels", loss.len());
        let (left, right): (Vec<_>, Vec<_>) = loss.iter().partition(|p| p.0 < pw / 2);
        assert!(
            mean_y(&left) < mean_y(&right),
            "the loss line does not fall"
        );
        // The learning rate top right, falling too; absent from the loss panel.
        let lr = pixels(&img, PALETTE[2], (pw, 2 * pw, 0, ph));
        assert!(lr.len() > 200);
        let (left, right): (Vec<_>, Vec<_>) = lr.iter().partition(|p| p.0 < pw + pw / 2);
        assert!(mean_y(&left) < mean_y(&right));
        assert!(pixels(&img, PALETTE[2], (0, pw, 0, ph)).is_empty());
        // The metrics below, in the evaluator's order (p_mrr first), both rising.
        for (k, color) in [(0, METRIC_COLORS[0]), (1, METRIC_COLORS[1])] {
            let area = (k * pw, (k + 1) * pw, ph, 2 * ph);
            let line = pixels(&img, color, area);
            assert!(line.len() > 100, "metric {k}: {} pixels", line.len());
            let (left, right): (Vec<_>, Vec<_>) = line.iter().partition(|p| p.0 < k * pw + pw / 2);
            assert!(mean_y(&left) > mean_y(&right), "metric {k} does not rise");
        }
        // The SVG is the same drawing: two loss lines, the learning rate, two metric lines.
        assert!(chart.svg.starts_with("<svg") && chart.svg.trim_end().ends_with("</svg>"));
        let svg_color = |c: RGBColor| format!("stroke=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        let lines = |c: RGBColor| {
            chart
                .svg
                .lines()
                .filter(|l| l.starts_with("<polyline") && l.contains(&svg_color(c)))
                .count()
        };
        assert_eq!(lines(PALETTE[0]), 1, "smoothed loss");
        assert_eq!(lines(RGBColor(160, 190, 220)), 1, "per-step loss");
        assert_eq!(lines(PALETTE[2]), 1, "learning rate");
        assert_eq!(
            lines(METRIC_COLORS[0]) + lines(METRIC_COLORS[1]),
            2,
            "metrics"
        );
        for text in [
            "learning rate",
            "dev p_mrr (x100)",
            "dev ndcg_at_10 (x100)",
            "mean of the last 8",
        ] {
            assert!(chart.svg.contains(text), "{text}");
        }
        let p_mrr = chart.svg.find("dev p_mrr").unwrap();
        assert!(p_mrr < chart.svg.find("dev ndcg_at_10").unwrap());
    }

    #[test]
    fn a_history_without_steps_still_draws() {
        let (_, mut history) = run(40);
        history[2].loss = Some(1.0);
        history[3].loss = Some(0.5);
        let chart = training_chart(&[], &history).unwrap();
        let img = decode(&chart.png);
        assert!(!pixels(&img, PALETTE[0], (0, PANEL.0, 0, PANEL.1)).is_empty());
        assert_white_border(&img, 3);
    }

    #[test]
    fn smoothing_is_a_trailing_mean() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(trailing_mean(&v, 2), vec![1.0, 1.5, 2.5, 3.5, 4.5]);
        assert_eq!(trailing_mean(&v, 1), v.to_vec());
        assert_eq!(smoothing_window(10), 1);
        assert_eq!(smoothing_window(200), 8);
        assert_eq!(smoothing_window(1_000_000), 200);
        assert_eq!(tick_label(2e-5, 2e-5), "2.0e-5");
        assert_eq!(tick_label(8.5e-22, 2e-5), "0");
        assert_eq!(tick_label(0.25, 2.0), "0.2");
        assert_eq!(tick_label(25.0, 20.0), "25");
    }

    #[test]
    fn the_evaluation_png_puts_bars_in_their_bins_and_ranks_on_the_right() {
        // Model A: every query at p-MRR -0.35 (bin -40..-30); model B: every query at +0.55
        // (bin 50..60).
        let series = vec![
            EvalSeries {
                label: "zero-shot".into(),
                per_query: vec![-0.35; 12],
                ranks: (1..=12).map(|i| (i, i)).collect(),
            },
            EvalSeries {
                label: "fine-tuned".into(),
                per_query: vec![0.55; 12],
                ranks: (1..=12).map(|i| (i, 10 * i)).collect(),
            },
        ];
        let chart = evaluation_chart("dev", &series).unwrap();
        let img = decode(&chart.png);
        assert_eq!((img.0, img.1), (2 * PANEL.0, PANEL.1 + 80));
        assert_white_border(&img, 3);
        let body = (0, PANEL.0, 64, img.1);
        let a = pixels(&img, PALETTE[0], body);
        let b = pixels(&img, PALETTE[1], body);
        assert!(a.len() > 100 && b.len() > 100);
        // Both bars are equally tall, A's left of B's.
        let a_right = a.iter().map(|p| p.0).max().unwrap();
        let b_left = b.iter().map(|p| p.0).min().unwrap();
        assert!(a_right < b_left);
        let top = |v: &[(u32, u32)]| v.iter().map(|p| p.1).min().unwrap();
        assert_eq!(top(&a), top(&b));
        // The x axis runs over [-100, 100]: A's bar is in the left half, B's in the right.
        let plot_mid = f64::from(PANEL.0) / 2.0;
        assert!(f64::from(a_right) < plot_mid && f64::from(b_left) > plot_mid);
        // The legend names both models with their mean p-MRR; the scatter has a point per
        // changed document and the diagonal.
        for text in ["zero-shot: p-MRR -35.00", "fine-tuned: p-MRR 55.00"] {
            assert!(chart.svg.contains(text), "{text}");
        }
        assert_eq!(chart.svg.matches("<circle").count(), 24);
    }

    #[test]
    fn the_grid_chart_names_the_zero_shot_line_in_its_caption_not_over_the_rows() {
        let rows = vec![
            GridChartRow {
                label: "low".into(),
                values: vec![30.0, 31.0, 32.0],
                paper: None,
            },
            GridChartRow {
                label: "high".into(),
                values: vec![40.0, 41.0],
                paper: None,
            },
        ];
        let chart = grid_chart("t", &rows, Some(26.98), None).unwrap();
        assert!(
            chart
                .svg
                .contains("rings: each seed; dashed: zero-shot 26.98)"),
            "{}",
            chart.svg
        );
        // Named once, in the caption: no legend box over the rows.
        assert_eq!(chart.svg.matches("zero-shot").count(), 1);
        // A ring per seed and a dot per row's mean.
        assert_eq!(chart.svg.matches("<circle").count(), 5 + 2);
        let without = grid_chart("t", &rows, None, None).unwrap();
        assert!(!without.svg.contains("zero-shot"));
    }
}

/// One row of [`grid_chart`]: a recipe of an ablation grid.
#[derive(Debug, Clone)]
pub struct GridChartRow {
    /// The row's label.
    pub label: String,
    /// Its value for each seed (x100); empty for a row still pending.
    pub values: Vec<f64>,
    /// The paper's value for it (x100), when known.
    pub paper: Option<f64>,
}

/// The chart of an ablation grid: one line per row, each seed's value as a small ring, the mean
/// as a dot with a bar of ± one sample standard deviation, and the zero-shot value (when given)
/// as a vertical dashed line; with a `paper` measure, a second panel on the same rows shows the
/// paper's values, so the two rankings can be compared by eye.
///
/// # Errors
/// [`Error::Chart`] when drawing fails.
pub fn grid_chart(
    title: &str,
    rows: &[GridChartRow],
    baseline: Option<f64>,
    paper: Option<&str>,
) -> Result<Chart> {
    let row_height = 26u32;
    let label_width = rows
        .iter()
        .map(|r| r.label.len() as u32 * 7 + 16)
        .max()
        .unwrap_or(80)
        .clamp(80, 420);
    let panels = if paper.is_some() { 2 } else { 1 };
    let size = (
        label_width + PANEL.0 * panels,
        (rows.len() as u32).max(1) * row_height + 130,
    );
    let view = GridView {
        title,
        rows,
        baseline,
        paper,
        label_width,
    };
    render(
        "the grid chart",
        size,
        |root| draw_grid(root, &view),
        |root| draw_grid(root, &view),
    )
}

/// Mean and sample standard deviation (0 for fewer than two values; NaN mean for none).
fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let m = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (m, 0.0);
    }
    let sd = (values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    (m, sd)
}

struct GridView<'a> {
    title: &'a str,
    rows: &'a [GridChartRow],
    baseline: Option<f64>,
    paper: Option<&'a str>,
    label_width: u32,
}

fn draw_grid<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    view: &GridView<'_>,
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (header, body) = root.split_vertically(40);
    header
        .draw(&Text::new(view.title.to_string(), (16, 10), (FONT, 16)))
        .map_err(|e| e.to_string())?;
    let n = view.rows.len().max(1);
    // Row i is drawn at y = n - 1 - i, so the grid's first row is at the top.
    let y_of = |i: usize| (n - 1 - i) as f64;
    let labels: Vec<String> = view.rows.iter().map(|r| r.label.clone()).collect();
    let label_of = move |at: &f64| {
        let y = at.round();
        if (y - *at).abs() > 1e-6 || y < 0.0 || y >= n as f64 {
            return String::new();
        }
        labels.get(n - 1 - y as usize).cloned().unwrap_or_default()
    };
    // Every seed's value, each mean +/- sd bar's ends, the zero-shot line.
    let ours: Vec<f64> = view
        .rows
        .iter()
        .flat_map(|r| {
            let (m, sd) = mean_sd(&r.values);
            r.values.iter().copied().chain([m - sd, m + sd])
        })
        .filter(|v| v.is_finite())
        .chain(view.baseline)
        .collect();
    let (lo, hi) = value_range(ours.iter().copied());
    let width = view.label_width + PANEL.0;
    let (left, right) = body.split_horizontally(width);
    // The zero-shot line is named in the caption rather than in a legend box, which would sit
    // on the rows whose values reach the right edge.
    let zero_shot = view
        .baseline
        .map(|b| format!("; dashed: zero-shot {b:.2}"))
        .unwrap_or_default();
    let caption = format!("this grid: mean +/- sd over seeds (rings: each seed{zero_shot})");
    let mut chart = ChartBuilder::on(&left)
        .caption(caption, (FONT, 14))
        .margin(8)
        .margin_right(24)
        .x_label_area_size(38)
        .y_label_area_size(view.label_width)
        .build_cartesian_2d(lo..hi, -0.6f64..(n as f64 - 0.4))
        .map_err(|e| e.to_string())?;
    let span = hi - lo;
    chart
        .configure_mesh()
        .x_labels(6)
        .y_labels(n * 2 + 1)
        .x_desc("dev p-MRR (x100)")
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .x_label_formatter(&|v| tick_label(*v, span))
        .y_label_formatter(&label_of)
        .disable_y_mesh()
        .light_line_style(RGBColor(245, 245, 245))
        .bold_line_style(RGBColor(225, 225, 225))
        .draw()
        .map_err(|e| e.to_string())?;
    if let Some(b) = view.baseline {
        let dashes: Vec<f64> = (0..=(n * 8))
            .map(|k| -0.6 + k as f64 * (n as f64 + 0.2) / (n * 8) as f64)
            .collect();
        chart
            .draw_series(
                dashes.chunks(2).filter(|c| c.len() == 2).map(|c| {
                    PathElement::new(vec![(b, c[0]), (b, c[1])], PALETTE[1].stroke_width(2))
                }),
            )
            .map_err(|e| e.to_string())?;
    }
    for (i, row) in view.rows.iter().enumerate() {
        let y = y_of(i);
        chart
            .draw_series(
                row.values
                    .iter()
                    .map(|&v| Circle::new((v, y), 4, PALETTE[0].stroke_width(1))),
            )
            .map_err(|e| e.to_string())?;
        if row.values.is_empty() {
            continue;
        }
        let (m, sd) = mean_sd(&row.values);
        if row.values.len() > 1 {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(m - sd, y), (m + sd, y)],
                    PALETTE[0].stroke_width(2),
                )))
                .map_err(|e| e.to_string())?;
        }
        chart
            .draw_series(std::iter::once(Circle::new((m, y), 5, PALETTE[0].filled())))
            .map_err(|e| e.to_string())?;
    }
    if let Some(measure) = view.paper {
        let (plo, phi) = value_range(view.rows.iter().filter_map(|r| r.paper));
        let mut p = ChartBuilder::on(&right)
            .caption(format!("paper: {measure}"), (FONT, 14))
            .margin(8)
            .margin_right(24)
            .x_label_area_size(38)
            .y_label_area_size(8)
            .build_cartesian_2d(plo..phi, -0.6f64..(n as f64 - 0.4))
            .map_err(|e| e.to_string())?;
        let pspan = phi - plo;
        p.configure_mesh()
            .x_labels(6)
            .y_labels(n * 2 + 1)
            .label_style((FONT, 12))
            .x_label_formatter(&|v| tick_label(*v, pspan))
            .y_label_formatter(&|_| String::new())
            .disable_y_mesh()
            .light_line_style(RGBColor(245, 245, 245))
            .bold_line_style(RGBColor(225, 225, 225))
            .draw()
            .map_err(|e| e.to_string())?;
        p.draw_series(view.rows.iter().enumerate().filter_map(|(i, r)| {
            r.paper
                .map(|v| Circle::new((v, y_of(i)), 5, PALETTE[2].filled()))
        }))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
