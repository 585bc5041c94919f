//! The benchmark report: one self-contained HTML page (inline CSS, inline SVG plots drawn with
//! `plotters`, no scripts, no external URLs) and a terminal ranking of backends.
//!
//! [`render_html`] groups the measurements by (family, model) and shows for each group
//! - **latency vs batch**: one line per backend and sequence length / image side (p50 with min–max
//!   whiskers, both axes logarithmic),
//! - **throughput** per backend and shape (tokens/s for token inputs, items/s otherwise),
//! - **memory**: peak host RSS and device memory per backend and shape,
//! - a **speed-up** table (mean latency of the baseline over that of each backend, per shape; the
//!   baseline is `cpu` when it was measured at that shape, else the slowest backend),
//! - every measured number in a table, and the points that were not measured (unavailable,
//!   failed, interrupted) with their reason.
//!
//! Only measured values are shown; points without a measurement are listed, never drawn as
//! numbers. When several runs measured the same point (family, model, backend, dtype, batch,
//! seq), the most recent run's measurement is shown.
//!
//! [`compare_backends`] ranks the backends of one model by mean latency per shape for a terminal.
//!
//! ```
//! use ipfs_accelerate_bench::report;
//!
//! let html = report::render_html(&[], &[]);
//! assert!(html.contains("No measurements"));
//! let table = report::compare_backends(&[], "bert", None);
//! assert!(table.contains("no measurements"));
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::record::{LatencyStats, Measurement, RunInfo, Status};

/// Colours of the backends in the plots: the backends of a report, sorted by name, take these
/// colours in order (wrapping around), see [`backend_colours`].
pub const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

/// Width of one plot in pixels.
const PLOT_WIDTH: u32 = 960;
/// Height of one plot in pixels.
const PLOT_HEIGHT: u32 = 440;
/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

type PlotResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The colour each backend of `measurements` gets in the plots: backend names sorted, then
/// [`PALETTE`] in order.
pub fn backend_colours(measurements: &[Measurement]) -> Vec<(String, (u8, u8, u8))> {
    let names: BTreeSet<&str> = measurements.iter().map(|m| m.backend.as_str()).collect();
    names
        .into_iter()
        .enumerate()
        .map(|(i, name)| (name.to_string(), PALETTE[i % PALETTE.len()]))
        .collect()
}

/// Renders the report page of `runs` and their `measurements` (see the module docs).
pub fn render_html(runs: &[RunInfo], measurements: &[Measurement]) -> String {
    let labelled = series_labels(runs, measurements);
    let measurements = labelled.as_slice();
    let (points, superseded) = latest_points(runs, measurements);
    let colours: HashMap<String, RGBColor> = backend_colours(measurements)
        .into_iter()
        .map(|(name, (r, g, b))| (name, RGBColor(r, g, b)))
        .collect();

    let mut html = String::new();
    html.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>ipfs-accelerate benchmark report</title>\n<style>\n",
    );
    html.push_str(CSS);
    html.push_str("</style>\n</head>\n<body>\n<h1>ipfs-accelerate benchmark report</h1>\n");
    push_runs(&mut html, runs);
    push_ratios(&mut html, runs, measurements);

    if points.is_empty() {
        html.push_str(
            "<p class=\"empty\">No measurements: there are no measurements to report.</p>\n",
        );
        html.push_str("</body>\n</html>\n");
        return html;
    }
    if superseded > 0 {
        let _ = writeln!(
            html,
            "<p class=\"note\">{superseded} measurement(s) of points that a later run measured again are not shown.</p>"
        );
    }

    let mut groups: BTreeMap<(&str, &str), Vec<&Measurement>> = BTreeMap::new();
    for m in points {
        groups
            .entry((m.family.as_str(), m.model.as_str()))
            .or_default()
            .push(m);
    }
    html.push_str("<nav><ul>\n");
    for (i, (family, model)) in groups.keys().enumerate() {
        let _ = writeln!(
            html,
            "<li><a href=\"#group-{i}\">{} — {}</a></li>",
            escape(family),
            escape(model)
        );
    }
    html.push_str("</ul></nav>\n");
    for (i, ((family, model), group)) in groups.iter().enumerate() {
        push_group(&mut html, i, family, model, group, &colours);
    }
    html.push_str("</body>\n</html>\n");
    html
}

/// The suffix of the series of our points measured by an unoptimised build.
pub const UNOPTIMIZED_MARK: &str = "unoptimized";

/// `measurements` with their series (backend) names telling what measured them: a peer's points
/// become `<backend> · <engine>`, and ours from a run of an unoptimised build (opt-level below 2)
/// `<backend> · opt-level N unoptimized`, so no plot or table mixes them with optimised ours.
fn series_labels(runs: &[RunInfo], measurements: &[Measurement]) -> Vec<Measurement> {
    let levels: HashMap<&str, Option<&str>> = runs
        .iter()
        .map(|r| (r.run_id.as_str(), r.opt_level.as_deref()))
        .collect();
    measurements
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if !m.is_ours() {
                m.backend = m.series();
            } else if let Some(Some(level)) = levels.get(m.run_id.as_str()) {
                if !crate::build::is_optimized(level) {
                    m.backend = format!("{} · opt-level {level} {UNOPTIMIZED_MARK}", m.backend);
                }
            }
            m
        })
        .collect()
}

/// The build of a run as the report shows it.
fn build_label(r: &RunInfo) -> (String, bool) {
    match (&r.build_profile, &r.opt_level) {
        (None, None) => ("unknown".into(), false),
        (profile, level) => {
            let level = level.as_deref().unwrap_or("unknown");
            let flagged = !crate::build::is_optimized(level);
            (
                format!(
                    "{}, opt-level {level}{}",
                    profile.as_deref().unwrap_or("unknown profile"),
                    if flagged { " — UNOPTIMIZED" } else { "" }
                ),
                flagged,
            )
        }
    }
}

/// The ours-vs-peers table of every run that measured peers.
fn push_ratios(html: &mut String, runs: &[RunInfo], measurements: &[Measurement]) {
    let with_peers: Vec<&RunInfo> = runs
        .iter()
        .filter(|r| {
            measurements
                .iter()
                .any(|m| m.run_id == r.run_id && !m.is_ours())
        })
        .collect();
    if with_peers.is_empty() {
        return;
    }
    html.push_str(
        "<h2>Ours vs peers (measured in the same run)</h2>\n<p class=\"note\">Median over every \
         timed iteration of every round, interquartile range, and our throughput over the \
         peer's at the same shape, threads and device (above 1: ours is faster).</p>\n",
    );
    for r in with_peers {
        let run: Vec<Measurement> = measurements
            .iter()
            .filter(|m| m.run_id == r.run_id)
            .cloned()
            .map(|mut m| {
                // Undo the series label: the table has its own engine column.
                if let Some((backend, _)) = m.backend.split_once(" · ") {
                    m.backend = backend.to_string();
                }
                m
            })
            .collect();
        let (build, flagged) = build_label(r);
        let _ = writeln!(
            html,
            "<h3>run {} — {} threads, build {}</h3>\n<table class=\"ratios\">\n<tr><th>model</th>\
             <th>backend</th><th>shape</th><th>engine</th><th>dtype</th><th>rounds</th>\
             <th>median ms</th><th>IQR ms</th><th>ours / peer throughput</th></tr>",
            escape(&r.run_id),
            r.cores,
            if flagged {
                format!("<span class=\"warn\">{}</span>", escape(&build))
            } else {
                escape(&build)
            }
        );
        for row in crate::ratios::ratio_rows(&run) {
            let engine = match &row.engine_version {
                Some(v) => format!("{} {v}", row.engine),
                None => row.engine.clone(),
            };
            let (median, iqr) = match (row.median_ms, row.iqr_ms) {
                (Some(m), Some((a, b))) => (fmt_num(m), format!("{}–{}", fmt_num(a), fmt_num(b))),
                _ => (
                    format!(
                        "{}: {}",
                        row.status.as_str(),
                        escape(row.reason.as_deref().unwrap_or(""))
                    ),
                    String::new(),
                ),
            };
            let ratio = match (row.ratio, &row.ratio_vs) {
                (Some(x), Some(vs)) => format!("<b>{x:.2}×</b> (vs ours {})", escape(vs)),
                _ => "—".into(),
            };
            let _ = writeln!(
                html,
                "<tr><td>{}</td><td>{}</td><td>b{}×{}</td><td>{}</td><td>{}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{median}</td><td class=\"num\">{iqr}</td>\
                 <td class=\"num\">{ratio}</td></tr>",
                escape(&row.model),
                escape(&row.backend),
                row.batch,
                escape(&seq_label(row.seq, &row.shape_kind)),
                escape(&engine),
                escape(&row.dtype),
                row.rounds,
            );
        }
        html.push_str("</table>\n");
    }
}

/// Ranks the backends of one model of `family` by mean latency at every shape, fastest first
/// with the ratio to the fastest, and lists the backends that were not measured and why.
/// With `model` `None` every model of the family gets its own ranking.
pub fn compare_backends(measurements: &[Measurement], family: &str, model: Option<&str>) -> String {
    let (points, _) = latest_points(&[], measurements);
    let mut models: BTreeMap<&str, Vec<&Measurement>> = BTreeMap::new();
    for m in points {
        if m.is_ours() && m.family == family && model.is_none_or(|want| m.model == want) {
            models.entry(m.model.as_str()).or_default().push(m);
        }
    }
    let mut out = String::new();
    if models.is_empty() {
        let _ = writeln!(
            out,
            "no measurements of family `{family}`{}",
            model.map(|m| format!(" model `{m}`")).unwrap_or_default()
        );
        return out;
    }
    for (model_name, group) in models {
        let _ = writeln!(out, "compare-backends: {family} / {model_name}");
        let mut shapes: BTreeMap<ShapeKey, Vec<(&Measurement, &LatencyStats)>> = BTreeMap::new();
        for m in &group {
            if let Some(lat) = measured_latency(m) {
                shapes.entry(ShapeKey::of(m)).or_default().push((m, lat));
            }
        }
        if shapes.is_empty() {
            out.push_str("  no latency was measured\n");
        }
        for (shape, mut rows) in shapes {
            rows.sort_by(|a, b| {
                a.1.mean_ms
                    .total_cmp(&b.1.mean_ms)
                    .then_with(|| a.0.backend.cmp(&b.0.backend))
            });
            let fastest = rows[0].1.mean_ms;
            let _ = writeln!(out, "\n  shape {}", shape.label(true));
            let _ = writeln!(
                out,
                "  {:>4}  {:<14} {:>12} {:>12} {:>12} {:>9}",
                "rank", "backend", "mean ms", "p50 ms", "p90 ms", "vs fastest"
            );
            for (rank, (m, lat)) in rows.iter().enumerate() {
                let partial = if m.status == Status::Interrupted {
                    format!(
                        "  (interrupted: {} of {} iterations)",
                        m.iters_done, m.iters_asked
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "  {:>4}  {:<14} {:>12.3} {:>12.3} {:>12.3} {:>9}{partial}",
                    rank + 1,
                    m.backend,
                    lat.mean_ms,
                    lat.p50_ms,
                    lat.p90_ms,
                    format!("{:.2}×", lat.mean_ms / fastest),
                );
            }
        }
        let missing: Vec<&&Measurement> = group
            .iter()
            .filter(|m| matches!(m.status, Status::Unavailable | Status::Failed))
            .collect();
        if !missing.is_empty() {
            out.push_str("\n  not measured:\n");
            let mut seen = BTreeSet::new();
            for m in missing {
                let reason = m.reason.as_deref().unwrap_or("no reason recorded");
                // One line per backend and reason: an absent backend is absent at every shape.
                if seen.insert((m.backend.as_str(), m.status.as_str(), reason)) {
                    let _ = writeln!(
                        out,
                        "    {:<14} {}: {}",
                        m.backend,
                        m.status.as_str(),
                        reason
                    );
                }
            }
        }
        out.push('\n');
    }
    out
}

/// Escapes `text` for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            other => out.push(other),
        }
    }
    out
}

const CSS: &str = ".warn{color:#b00020;font-weight:bold}\
body{font-family:'DejaVu Sans','Liberation Sans',Arial,sans-serif;margin:24px auto;\
max-width:1200px;padding:0 16px;color:#1a1a1a;background:#fff}\n\
h1{font-size:1.6em}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:2em}h3{margin-top:1.5em}\n\
table{border-collapse:collapse;margin:8px 0;font-size:0.85em}\n\
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}\n\
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}\n\
figure{margin:8px 0}figure svg{max-width:100%;height:auto;border:1px solid #eee}\n\
figcaption{font-size:0.85em;color:#555}.note,.empty{color:#555}.reason{white-space:pre-wrap}\n\
.status-unavailable{color:#8a6d00}.status-failed{color:#b00020}.status-interrupted{color:#555}\n\
.base{font-weight:bold}\n";

/// The shape of a grid point, ordered by dtype, batch, seq.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ShapeKey {
    dtype: String,
    batch: u32,
    seq: u32,
    kind: String,
}

impl ShapeKey {
    fn of(m: &Measurement) -> ShapeKey {
        ShapeKey {
            dtype: m.dtype.clone(),
            batch: m.batch,
            seq: m.seq,
            kind: m.shape_kind.clone(),
        }
    }

    /// `f32 b8 s128` (tokens), `b1 224px` (pixels), `b1 16000 samples`.
    fn label(&self, with_dtype: bool) -> String {
        let size = seq_label(self.seq, &self.kind);
        if with_dtype {
            format!("{} b{} {size}", self.dtype, self.batch)
        } else {
            format!("b{} {size}", self.batch)
        }
    }
}

/// `s128` for tokens, `224px` for pixels, `16000 samples` otherwise.
pub(crate) fn seq_label(seq: u32, kind: &str) -> String {
    match kind {
        "tokens" => format!("s{seq}"),
        "pixels" => format!("{seq}px"),
        "prefill" => format!("prompt {seq} (prefill)"),
        "decode" => format!("prompt {seq} (decode)"),
        other => format!("{seq} {other}"),
    }
}

/// The measurements to show: of several measurements of the same point, the one of the most
/// recent run (by [`RunInfo::started_at`], then by order in `measurements`). Also returns how many
/// were left out.
fn latest_points<'a>(
    runs: &[RunInfo],
    measurements: &'a [Measurement],
) -> (Vec<&'a Measurement>, usize) {
    let started: HashMap<&str, &str> = runs
        .iter()
        .map(|r| (r.run_id.as_str(), r.started_at.as_str()))
        .collect();
    type PointKey<'k> = (&'k str, &'k str, &'k str, &'k str, u32, u32, &'k str);
    let mut best: HashMap<PointKey<'a>, (usize, &str)> = HashMap::new();
    for (i, m) in measurements.iter().enumerate() {
        let key = (
            m.family.as_str(),
            m.model.as_str(),
            m.backend.as_str(),
            m.dtype.as_str(),
            m.batch,
            m.seq,
            m.shape_kind.as_str(),
        );
        let time = started.get(m.run_id.as_str()).copied().unwrap_or("");
        match best.get(&key) {
            Some(&(_, t)) if t > time => {}
            _ => {
                best.insert(key, (i, time));
            }
        }
    }
    let mut keep: Vec<usize> = best.values().map(|&(i, _)| i).collect();
    keep.sort_unstable();
    let superseded = measurements.len() - keep.len();
    (
        keep.into_iter().map(|i| &measurements[i]).collect(),
        superseded,
    )
}

/// The latency stats of a point when they were measured (ok or interrupted with timed
/// iterations) and are finite and positive.
fn measured_latency(m: &Measurement) -> Option<&LatencyStats> {
    if !matches!(m.status, Status::Ok | Status::Interrupted) || m.iters_done == 0 {
        return None;
    }
    let lat = m.latency.as_ref()?;
    let values = [
        lat.mean_ms,
        lat.p50_ms,
        lat.p90_ms,
        lat.p99_ms,
        lat.min_ms,
        lat.max_ms,
    ];
    values
        .iter()
        .all(|v| v.is_finite() && *v > 0.0)
        .then_some(lat)
}

/// `Some(v)` when `v` is a measured, finite, positive number of a measured point.
fn measured_value(m: &Measurement, v: Option<f64>) -> Option<f64> {
    measured_latency(m)?;
    v.filter(|v| v.is_finite() && *v > 0.0)
}

fn push_runs(html: &mut String, runs: &[RunInfo]) {
    if runs.is_empty() {
        return;
    }
    html.push_str(
        "<h2>Runs</h2>\n<table>\n<tr><th>started (UTC)</th><th>run</th><th>commit</th><th>host</th>\
         <th>OS</th><th>CPU</th><th>cores</th><th>GPU</th><th>driver</th><th>build</th><th>command</th></tr>\n",
    );
    for r in runs {
        let commit = r
            .git_commit
            .as_deref()
            .map(|c| c.chars().take(12).collect::<String>())
            .unwrap_or_else(|| "—".into());
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td>{}</td><td{}>{}</td><td><code>{}</code></td></tr>",
            escape(&r.started_at),
            escape(&r.run_id),
            escape(&commit),
            escape(&r.host),
            escape(&r.os),
            escape(&r.cpu_model),
            r.cores,
            escape(r.gpu.as_deref().unwrap_or("—")),
            escape(r.driver.as_deref().unwrap_or("—")),
            if build_label(r).1 { " class=\"warn\"" } else { "" },
            escape(&build_label(r).0),
            escape(&r.command),
        );
    }
    html.push_str("</table>\n");
}

fn push_group(
    html: &mut String,
    index: usize,
    family: &str,
    model: &str,
    group: &[&Measurement],
    colours: &HashMap<String, RGBColor>,
) {
    let _ = writeln!(
        html,
        "<section id=\"group-{index}\">\n<h2>{} — {}</h2>",
        escape(family),
        escape(model)
    );
    let dtypes: BTreeSet<&str> = group.iter().map(|m| m.dtype.as_str()).collect();
    let with_dtype = dtypes.len() > 1;
    // Plot titles name a model given as a path by its file or folder name (the heading has it all).
    let short = std::path::Path::new(model)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(model);
    let title = format!("{family} / {short}");

    html.push_str("<h3>Latency vs batch</h3>\n");
    push_plot(
        html,
        latency_svg(&title, group, colours, with_dtype),
        "Lines: p50 latency per backend and size; whiskers: fastest to slowest iteration.",
        "No latency was measured.",
    );

    let use_tokens = group
        .iter()
        .filter(|m| measured_latency(m).is_some())
        .all(|m| measured_value(m, m.tokens_per_s).is_some())
        && group.iter().any(|m| measured_latency(m).is_some());
    let (unit, pick): (&str, fn(&Measurement) -> Option<f64>) = if use_tokens {
        ("tokens/s", |m| m.tokens_per_s)
    } else {
        ("items/s", |m| m.items_per_s)
    };
    html.push_str("<h3>Throughput per backend</h3>\n");
    push_plot(
        html,
        throughput_svg(&title, unit, pick, group, colours, with_dtype),
        &format!("Throughput at the mean latency ({unit}), one bar per backend at each shape."),
        "No throughput was measured.",
    );

    if group.iter().any(|m| m.new_tokens.is_some()) {
        html.push_str("<h3>Generation</h3>\n");
        push_plot(
            html,
            generation_svg(&title, group, colours, with_dtype),
            "Left: time to the first new token (prompt evaluation + first token), median over \
             the timed generations; right: decode tokens/s after the first token, median.",
            "No generation was measured.",
        );
    }

    html.push_str("<h3>Memory</h3>\n");
    push_plot(
        html,
        memory_svg(&title, group, colours, with_dtype),
        "Left: peak resident set size of the process; right: device memory in use after the timed \
         iterations, as the backend's allocator reports it.",
        "No memory use was measured.",
    );

    push_speedups(html, group, with_dtype);
    push_measurement_table(html, group);
    push_not_measured(html, group);
    html.push_str("</section>\n");
}

/// Appends a plot (or why there is none) to the page.
fn push_plot(html: &mut String, svg: PlotResult<Option<String>>, caption: &str, none: &str) {
    match svg {
        Ok(Some(svg)) => {
            html.push_str("<figure>\n");
            html.push_str(&svg);
            let _ = writeln!(
                html,
                "<figcaption>{}</figcaption>\n</figure>",
                escape(caption)
            );
        }
        Ok(None) => {
            let _ = writeln!(html, "<p class=\"note\">{}</p>", escape(none));
        }
        Err(err) => {
            let _ = writeln!(
                html,
                "<p class=\"status-failed\">The plot could not be drawn: {}</p>",
                escape(&err.to_string())
            );
        }
    }
}

fn colour_of(colours: &HashMap<String, RGBColor>, backend: &str) -> RGBColor {
    colours.get(backend).copied().unwrap_or(RGBColor(0, 0, 0))
}

/// A readable number for axis labels and tables.
fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.3e}", v)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

/// An axis label: integers without decimals, else up to three significant digits.
fn axis_num(v: f64) -> String {
    if v.abs() >= 1.0 && (v - v.round()).abs() < 1e-9 {
        return format!("{v:.0}");
    }
    let text = fmt_num(v);
    if text.contains('.') && !text.contains('e') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// The share of a plot's height that its legend of `rows` entries takes (at most 0.6).
fn legend_share(rows: usize, plot_height: u32) -> f64 {
    let inner = f64::from(plot_height.saturating_sub(110).max(100));
    ((rows as f64 * 19.0 + 18.0) / inner).min(0.6)
}

/// Labelled and light tick values of a logarithmic axis over `lo..hi` (positive): 1, 2, 5 × 10^k
/// when that gives at least four labels, else every 1..9 × 10^k, else five geometric steps.
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let in_range = |mults: &[f64]| -> Vec<f64> {
        let (k0, k1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (k0..=k1)
            .flat_map(|k| mults.iter().map(move |m| m * 10f64.powi(k)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect()
    };
    let all = in_range(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    let coarse = in_range(&[1.0, 2.0, 5.0]);
    if coarse.len() >= 4 {
        let light = all.into_iter().filter(|v| !coarse.contains(v)).collect();
        return (coarse, light);
    }
    if all.len() >= 3 {
        return (all, Vec::new());
    }
    let step = (hi / lo).powf(1.0 / 6.0);
    let ticks = (1..6)
        .map(|i| {
            let v = lo * step.powi(i);
            let scale = 10f64.powi(v.log10().floor() as i32 - 1);
            (v / scale).round() * scale
        })
        .collect();
    (ticks, Vec::new())
}

/// One (p50, min, max) point of a latency line at a batch size.
struct LatencyPoint {
    batch: f64,
    p50: f64,
    min: f64,
    max: f64,
}

fn latency_svg(
    title: &str,
    group: &[&Measurement],
    colours: &HashMap<String, RGBColor>,
    with_dtype: bool,
) -> PlotResult<Option<String>> {
    // One line per (backend, dtype, seq).
    let mut lines: BTreeMap<(&str, &str, u32, &str), Vec<LatencyPoint>> = BTreeMap::new();
    for m in group {
        if let Some(lat) = measured_latency(m) {
            lines
                .entry((&m.backend, &m.dtype, m.seq, &m.shape_kind))
                .or_default()
                .push(LatencyPoint {
                    batch: f64::from(m.batch.max(1)),
                    p50: lat.p50_ms,
                    min: lat.min_ms,
                    max: lat.max_ms,
                });
        }
    }
    if lines.is_empty() {
        return Ok(None);
    }
    let sizes: Vec<(&str, u32)> = lines
        .keys()
        .map(|k| (k.1, k.2))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let all = lines.values().flatten();
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for p in all {
        x_lo = x_lo.min(p.batch);
        x_hi = x_hi.max(p.batch);
        y_lo = y_lo.min(p.min.min(p.p50));
        y_hi = y_hi.max(p.max.max(p.p50));
    }
    let batches: Vec<f64> =
        lines
            .values()
            .flatten()
            .map(|p| p.batch)
            .fold(Vec::new(), |mut v, b| {
                if !v.contains(&b) {
                    v.push(b);
                }
                v
            });
    let x_range = (x_lo / 1.6)..(x_hi * 1.6);
    // Room above the data for the legend (one row per line).
    let y_bottom = y_lo / 1.3;
    let legend_share = legend_share(lines.len(), PLOT_HEIGHT);
    let y_top = (y_bottom.ln() + (y_hi * 1.2 / y_bottom).ln() / (1.0 - legend_share)).exp();
    let (y_ticks, y_light) = log_ticks(y_bottom, y_top);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{title}: latency vs batch"), ("sans-serif", 20))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(70)
            .build_cartesian_2d(
                x_range.log_scale().with_key_points(batches),
                (y_bottom..y_top)
                    .log_scale()
                    .with_key_points(y_ticks)
                    .with_light_points(y_light),
            )?;
        chart
            .configure_mesh()
            .x_desc("batch size")
            .y_desc("latency (ms)")
            .x_label_formatter(&|v| axis_num(*v))
            .y_label_formatter(&|v| axis_num(*v))
            .light_line_style(RGBColor(240, 240, 240))
            .draw()?;

        for ((backend, dtype, seq, kind), mut points) in lines {
            points.sort_by(|a, b| a.batch.total_cmp(&b.batch));
            let colour = colour_of(colours, backend);
            let marker = sizes.iter().position(|s| *s == (dtype, seq)).unwrap_or(0) % 4;
            let label = if with_dtype {
                format!("{backend} · {dtype} {}", seq_label(seq, kind))
            } else {
                format!("{backend} · {}", seq_label(seq, kind))
            };
            chart.draw_series(points.iter().map(|p| {
                PathElement::new(
                    vec![(p.batch, p.min), (p.batch, p.max)],
                    colour.stroke_width(1),
                )
            }))?;
            chart.draw_series(points.iter().flat_map(|p| {
                [p.min, p.max].map(|y| {
                    PathElement::new(
                        vec![(p.batch / 1.03, y), (p.batch * 1.03, y)],
                        colour.stroke_width(1),
                    )
                })
            }))?;
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|p| (p.batch, p.p50)),
                    colour.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| {
                    let shape: Vec<(i32, i32)> = marker_shape(marker)
                        .iter()
                        .map(|(dx, dy)| (dx + 12, *dy))
                        .collect();
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (24, 0)], colour.stroke_width(2))
                        + Polygon::new(shape, colour.filled())
                });
            chart.draw_series(points.iter().map(|p| {
                EmptyElement::at((p.batch, p.p50))
                    + Polygon::new(marker_shape(marker).to_vec(), colour.filled())
            }))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(180, 180, 180))
            .label_font(("sans-serif", 14))
            .draw()?;
        root.present()?;
    }
    Ok(Some(svg))
}

/// The marker of the `kind`-th size of a latency plot, as polygon corners around (0, 0):
/// octagon, triangle, square, diamond.
fn marker_shape(kind: usize) -> &'static [(i32, i32)] {
    match kind % 4 {
        0 => &[
            (-2, -5),
            (2, -5),
            (5, -2),
            (5, 2),
            (2, 5),
            (-2, 5),
            (-5, 2),
            (-5, -2),
        ],
        1 => &[(0, -6), (6, 5), (-6, 5)],
        2 => &[(-4, -4), (4, -4), (4, 4), (-4, 4)],
        _ => &[(0, -6), (6, 0), (0, 6), (-6, 0)],
    }
}

/// Bars of one quantity: `values[(shape index, backend)]`.
struct Bars<'a> {
    shapes: Vec<String>,
    backends: Vec<&'a str>,
    values: BTreeMap<(usize, &'a str), f64>,
}

impl<'a> Bars<'a> {
    /// The bars of `value` over the measured points of `group`.
    fn collect(
        group: &[&'a Measurement],
        with_dtype: bool,
        value: impl Fn(&Measurement) -> Option<f64>,
    ) -> Bars<'a> {
        let mut found: Vec<(ShapeKey, &'a str, f64)> = Vec::new();
        for m in group {
            if let Some(v) = measured_value(m, value(m)) {
                found.push((ShapeKey::of(m), m.backend.as_str(), v));
            }
        }
        let shape_keys: Vec<ShapeKey> = found
            .iter()
            .map(|f| f.0.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let backends: Vec<&str> = found
            .iter()
            .map(|f| f.1)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let values = found
            .into_iter()
            .filter_map(|(shape, backend, v)| {
                let i = shape_keys.iter().position(|s| *s == shape)?;
                Some(((i, backend), v))
            })
            .collect();
        Bars {
            shapes: shape_keys.iter().map(|s| s.label(with_dtype)).collect(),
            backends,
            values,
        }
    }

    fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Draws grouped bars (one group per shape, one bar per backend) on `area`.
fn draw_bars(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    caption: &str,
    y_desc: &str,
    bars: &Bars<'_>,
    colours: &HashMap<String, RGBColor>,
) -> PlotResult<()> {
    if bars.is_empty() {
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new(
            format!("{caption}: not measured"),
            (w as i32 / 2 - 90, h as i32 / 2),
            ("sans-serif", 16)
                .into_font()
                .color(&RGBColor(100, 100, 100)),
        ))?;
        return Ok(());
    }
    let n = bars.shapes.len();
    let (_, area_height) = area.dim_in_pixel();
    let y_max = bars.values.values().copied().fold(0.0_f64, f64::max) * 1.08
        / (1.0 - legend_share(bars.backends.len(), area_height));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..y_max)?;
    let shapes = &bars.shapes;
    let shape_label = |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < shapes.len() {
            shapes[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&shape_label)
        .y_label_formatter(&|v| axis_num(*v))
        .x_desc("shape (batch, size)")
        .y_desc(y_desc)
        .light_line_style(RGBColor(240, 240, 240))
        .draw()?;
    let width = 0.8 / bars.backends.len() as f64;
    for (j, backend) in bars.backends.iter().enumerate() {
        let colour = colour_of(colours, backend);
        let rects: Vec<Rectangle<(f64, f64)>> = bars
            .values
            .iter()
            .filter(|((_, b), _)| b == backend)
            .map(|((i, _), v)| {
                let x0 = *i as f64 - 0.4 + j as f64 * width;
                Rectangle::new(
                    [(x0 + 0.06 * width, 0.0), (x0 + 0.94 * width, *v)],
                    colour.filled(),
                )
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(backend.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

fn throughput_svg(
    title: &str,
    unit: &str,
    pick: fn(&Measurement) -> Option<f64>,
    group: &[&Measurement],
    colours: &HashMap<String, RGBColor>,
    with_dtype: bool,
) -> PlotResult<Option<String>> {
    let bars = Bars::collect(group, with_dtype, pick);
    if bars.is_empty() {
        return Ok(None);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        draw_bars(&root, &format!("{title}: throughput"), unit, &bars, colours)?;
        root.present()?;
    }
    Ok(Some(svg))
}

/// Time to first token (prefill rows) and decode tokens/s (decode rows), side by side.
fn generation_svg(
    title: &str,
    group: &[&Measurement],
    colours: &HashMap<String, RGBColor>,
    with_dtype: bool,
) -> PlotResult<Option<String>> {
    let of_kind = |kind: &str| -> Vec<&Measurement> {
        group
            .iter()
            .copied()
            .filter(|m| m.shape_kind == kind)
            .collect()
    };
    let (prefill, decode) = (of_kind("prefill"), of_kind("decode"));
    let ttft = Bars::collect(&prefill, with_dtype, |m| m.ttft_ms);
    let rate = Bars::collect(&decode, with_dtype, |m| m.decode_tokens_per_s);
    if ttft.is_empty() && rate.is_empty() {
        return Ok(None);
    }
    two_panels(
        (&format!("{title}: time to first token"), "ms", &ttft),
        ("decode", "tokens/s", &rate),
        colours,
    )
}

/// One plot of two bar panels side by side, each `(title, unit, bars)`.
fn two_panels(
    left: (&str, &str, &Bars<'_>),
    right: (&str, &str, &Bars<'_>),
    colours: &HashMap<String, RGBColor>,
) -> PlotResult<Option<String>> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let (l, r) = root.split_horizontally(PLOT_WIDTH / 2);
        draw_bars(&l, left.0, left.1, left.2, colours)?;
        draw_bars(&r, right.0, right.1, right.2, colours)?;
        root.present()?;
    }
    Ok(Some(svg))
}

fn memory_svg(
    title: &str,
    group: &[&Measurement],
    colours: &HashMap<String, RGBColor>,
    with_dtype: bool,
) -> PlotResult<Option<String>> {
    let to_mib = |b: Option<u64>| b.map(|b| b as f64 / MIB);
    let host = Bars::collect(group, with_dtype, |m| to_mib(m.host_rss_peak_bytes));
    let device = Bars::collect(group, with_dtype, |m| to_mib(m.device_memory_bytes));
    if host.is_empty() && device.is_empty() {
        return Ok(None);
    }
    two_panels(
        (&format!("{title}: host RSS peak"), "MiB", &host),
        ("device memory", "MiB", &device),
        colours,
    )
}

fn push_speedups(html: &mut String, group: &[&Measurement], with_dtype: bool) {
    html.push_str("<h3>Speed-ups</h3>\n");
    let mut shapes: BTreeMap<ShapeKey, Vec<(&str, f64)>> = BTreeMap::new();
    for m in group {
        if let Some(lat) = measured_latency(m) {
            shapes
                .entry(ShapeKey::of(m))
                .or_default()
                .push((&m.backend, lat.mean_ms));
        }
    }
    if shapes.is_empty() {
        html.push_str("<p class=\"note\">No latency was measured.</p>\n");
        return;
    }
    let backends: BTreeSet<&str> = shapes.values().flatten().map(|(b, _)| *b).collect();
    html.push_str(
        "<p class=\"note\">Mean latency of the baseline divided by the mean latency of each backend at \
         the same shape (higher is faster). The baseline is <code>cpu</code> where it was measured, \
         else the slowest backend.</p>\n<table class=\"speedups\">\n<tr><th>shape</th><th>baseline</th>",
    );
    for b in &backends {
        let _ = write!(html, "<th>{}</th>", escape(b));
    }
    html.push_str("</tr>\n");
    for (shape, rows) in &shapes {
        let baseline = rows
            .iter()
            .find(|(b, _)| *b == "cpu")
            .or_else(|| rows.iter().max_by(|a, b| a.1.total_cmp(&b.1)))
            .copied();
        let Some((base_name, base_ms)) = baseline else {
            continue;
        };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{} ({} ms)</td>",
            escape(&shape.label(with_dtype)),
            escape(base_name),
            fmt_num(base_ms)
        );
        for b in &backends {
            match rows.iter().find(|(name, _)| name == b) {
                Some((name, ms)) => {
                    let class = if *name == base_name {
                        "num base"
                    } else {
                        "num"
                    };
                    let _ = write!(
                        html,
                        "<td class=\"{class}\">{:.2}× <small>({} ms)</small></td>",
                        base_ms / ms,
                        fmt_num(*ms)
                    );
                }
                None => html.push_str("<td class=\"num\">—</td>"),
            }
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n");
}

fn push_measurement_table(html: &mut String, group: &[&Measurement]) {
    let mut measured: Vec<(&Measurement, &LatencyStats)> = group
        .iter()
        .filter_map(|m| measured_latency(m).map(|l| (*m, l)))
        .collect();
    if measured.is_empty() {
        return;
    }
    measured.sort_by(|a, b| {
        ShapeKey::of(a.0)
            .cmp(&ShapeKey::of(b.0))
            .then_with(|| a.0.backend.cmp(&b.0.backend))
    });
    html.push_str(
        "<h3>Measurements</h3>\n<table class=\"measurements\">\n<tr><th>backend</th><th>dtype</th>\
         <th>batch</th><th>size</th><th>iters</th><th>mean ms</th><th>p50 ms</th><th>p90 ms</th>\
         <th>p99 ms</th><th>min ms</th><th>max ms</th><th>stddev ms</th><th>items/s</th>\
         <th>tokens/s</th><th>host RSS MiB</th><th>device MiB</th><th>load ms</th><th>GFLOP/s</th>\
         <th>% peak</th></tr>\n",
    );
    let opt = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map(fmt_num)
            .unwrap_or_else(|| "—".into())
    };
    let mib = |v: Option<u64>| opt(v.map(|b| b as f64 / MIB));
    for (m, l) in measured {
        let iters = if m.status == Status::Interrupted {
            format!("{} of {} (interrupted)", m.iters_done, m.iters_asked)
        } else {
            m.iters_done.to_string()
        };
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(&m.backend),
            escape(&m.dtype),
            m.batch,
            escape(&seq_label(m.seq, &m.shape_kind)),
            escape(&iters),
            fmt_num(l.mean_ms),
            fmt_num(l.p50_ms),
            fmt_num(l.p90_ms),
            fmt_num(l.p99_ms),
            fmt_num(l.min_ms),
            fmt_num(l.max_ms),
            fmt_num(l.stddev_ms),
            opt(m.items_per_s),
            opt(m.tokens_per_s),
            mib(m.host_rss_peak_bytes),
            mib(m.device_memory_bytes),
            opt(m.load_ms),
            opt(m.achieved_flops_per_s.map(|f| f / 1e9)),
            opt(m.peak_flops_pct),
        );
    }
    html.push_str("</table>\n");
}

fn push_not_measured(html: &mut String, group: &[&Measurement]) {
    let mut rows: Vec<&Measurement> = group
        .iter()
        .copied()
        .filter(|m| m.status != Status::Ok)
        .collect();
    if rows.is_empty() {
        return;
    }
    rows.sort_by(|a, b| {
        a.backend
            .cmp(&b.backend)
            .then_with(|| ShapeKey::of(a).cmp(&ShapeKey::of(b)))
    });
    html.push_str(
        "<h3>Not measured or partly measured</h3>\n<table class=\"not-measured\">\n<tr><th>backend</th>\
         <th>dtype</th><th>batch</th><th>size</th><th>status</th><th>iterations</th><th>reason</th></tr>\n",
    );
    for m in rows {
        let status = m.status.as_str();
        let _ = writeln!(
            html,
            "<tr class=\"status-{status}\"><td>{}</td><td>{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{status}</td><td class=\"num\">{} of {}</td>\
             <td class=\"reason\">{}</td></tr>",
            escape(&m.backend),
            escape(&m.dtype),
            m.batch,
            escape(&seq_label(m.seq, &m.shape_kind)),
            m.iters_done,
            m.iters_asked,
            escape(m.reason.as_deref().unwrap_or("no reason recorded")),
        );
    }
    html.push_str("</table>\n");
}
