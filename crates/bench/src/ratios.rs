//! Ours vs the peers measured in the same run: one row per (shape, engine, dtype) with the median
//! over every timed iteration of every round, its spread (interquartile range), and the ratio of
//! our throughput to the peer's at that shape (the peer's median over ours; above 1: ours is
//! faster). Printed by `bench --peer` / `cargo xtask compare`, shown in the HTML report.
//!
//! ```
//! use ipfs_accelerate_bench::ratios;
//!
//! assert!(ratios::ratio_rows(&[]).is_empty());
//! assert!(ratios::table_text(&[]).contains("no measurements"));
//! ```

use std::fmt::Write as _;

use crate::record::{Measurement, Status};

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct RatioRow {
    /// Family.
    pub family: String,
    /// Model.
    pub model: String,
    /// Our backend (the peer ran on its device).
    pub backend: String,
    /// Batch size.
    pub batch: u32,
    /// Size (tokens, pixels, ...).
    pub seq: u32,
    /// What `seq` counts.
    pub shape_kind: String,
    /// Engine (`ipfs-accelerate`, `torch`, `onnxruntime`).
    pub engine: String,
    /// Engine version when known.
    pub engine_version: Option<String>,
    /// Precision.
    pub dtype: String,
    /// Rounds with timings.
    pub rounds: usize,
    /// Timed iterations over all rounds.
    pub iters: usize,
    /// Median latency in ms over all timed iterations.
    pub median_ms: Option<f64>,
    /// 25th and 75th percentiles in ms.
    pub iqr_ms: Option<(f64, f64)>,
    /// Fastest and slowest iteration in ms.
    pub min_max_ms: Option<(f64, f64)>,
    /// Our throughput over this engine's (peer median / our median), for peer rows.
    pub ratio: Option<f64>,
    /// Our precision the ratio compares with (the peer's own when we measured it, else our first).
    pub ratio_vs: Option<String>,
    /// Why nothing was measured (unavailable, failed), when nothing was.
    pub reason: Option<String>,
    /// How the points ended: `ok`, or the status of the last unmeasured point.
    pub status: Status,
}

/// Linear-interpolated quantile of an ascending, non-empty slice.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The rows of `measurements` (one invocation's, or a run's), in first-measured order, ours
/// before the peers at each shape.
pub fn ratio_rows(measurements: &[Measurement]) -> Vec<RatioRow> {
    let mut rows: Vec<RatioRow> = Vec::new();
    let mut timings: Vec<Vec<f64>> = Vec::new();
    for m in measurements {
        let engine = if m.is_ours() {
            crate::OURS
        } else {
            m.engine.as_str()
        };
        let found = rows.iter().position(|r| {
            r.family == m.family
                && r.model == m.model
                && r.backend == m.backend
                && r.batch == m.batch
                && r.seq == m.seq
                && r.shape_kind == m.shape_kind
                && r.engine == engine
                && r.dtype == m.dtype
        });
        let i = match found {
            Some(i) => i,
            None => {
                rows.push(RatioRow {
                    family: m.family.clone(),
                    model: m.model.clone(),
                    backend: m.backend.clone(),
                    batch: m.batch,
                    seq: m.seq,
                    shape_kind: m.shape_kind.clone(),
                    engine: engine.to_string(),
                    engine_version: m.engine_version.clone(),
                    dtype: m.dtype.clone(),
                    rounds: 0,
                    iters: 0,
                    median_ms: None,
                    iqr_ms: None,
                    min_max_ms: None,
                    ratio: None,
                    ratio_vs: None,
                    reason: None,
                    status: Status::Ok,
                });
                timings.push(Vec::new());
                rows.len() - 1
            }
        };
        let measured = matches!(m.status, Status::Ok | Status::Interrupted);
        if measured && !m.timings_ms.is_empty() {
            rows[i].rounds += 1;
            timings[i].extend(m.timings_ms.iter().copied().filter(|t| t.is_finite()));
        } else {
            rows[i].status = m.status;
            rows[i].reason = m.reason.clone();
        }
        if rows[i].engine_version.is_none() {
            rows[i].engine_version = m.engine_version.clone();
        }
    }
    for (row, t) in rows.iter_mut().zip(timings.iter_mut()) {
        t.sort_by(f64::total_cmp);
        row.iters = t.len();
        if let (Some(first), Some(last)) = (t.first(), t.last()) {
            row.median_ms = Some(quantile(t, 0.5));
            row.iqr_ms = Some((quantile(t, 0.25), quantile(t, 0.75)));
            row.min_max_ms = Some((*first, *last));
            row.status = Status::Ok;
            row.reason = None;
        }
    }
    // Ratios: each peer row against ours at the same shape and backend.
    let snapshot = rows.clone();
    for row in rows.iter_mut().filter(|r| r.engine != crate::OURS) {
        let ours: Vec<&RatioRow> = snapshot
            .iter()
            .filter(|o| {
                o.engine == crate::OURS
                    && o.family == row.family
                    && o.model == row.model
                    && o.backend == row.backend
                    && o.batch == row.batch
                    && o.seq == row.seq
                    && o.shape_kind == row.shape_kind
                    && o.median_ms.is_some()
            })
            .collect();
        let vs = ours
            .iter()
            .find(|o| o.dtype == row.dtype)
            .or_else(|| ours.first());
        if let (Some(vs), Some(peer_ms)) = (vs, row.median_ms) {
            if let Some(ours_ms) = vs.median_ms.filter(|v| *v > 0.0) {
                row.ratio = Some(peer_ms / ours_ms);
                row.ratio_vs = Some(vs.dtype.clone());
            }
        }
    }
    rows
}

/// The rows as a terminal table.
pub fn table_text(rows: &[RatioRow]) -> String {
    if rows.is_empty() {
        return "no measurements to compare\n".into();
    }
    let mut out = String::new();
    let h = [
        "shape",
        "engine",
        "dtype",
        "rounds",
        "median ms",
        "IQR ms",
        "ours/peer throughput",
        "version",
    ];
    let _ = writeln!(
        out,
        "{:<26} {:<16} {:<6} {:>6} {:>10} {:>21} {:>22}  {}",
        h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
    );
    for r in rows {
        // A model given as a path shows its file or folder name.
        let model = std::path::Path::new(&r.model)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&r.model);
        let shape = format!(
            "{} {} b{}×{}",
            model,
            r.backend,
            r.batch,
            crate::report::seq_label(r.seq, &r.shape_kind)
        );
        let version = r.engine_version.as_deref().unwrap_or("");
        match (r.median_ms, r.iqr_ms) {
            (Some(med), Some((q1, q3))) => {
                let ratio = match (r.ratio, &r.ratio_vs) {
                    (Some(x), Some(vs)) => format!("{x:.2}× (vs ours {vs})"),
                    _ if r.engine == crate::OURS => "—".into(),
                    _ => "ours not measured".into(),
                };
                let _ = writeln!(
                    out,
                    "{shape:<26} {:<16} {:<6} {:>6} {med:>10.2} {:>21} {ratio:>22}  {version}",
                    r.engine,
                    r.dtype,
                    r.rounds,
                    format!("{q1:.2}–{q3:.2}"),
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "{shape:<26} {:<16} {:<6} {}: {}",
                    r.engine,
                    r.dtype,
                    r.status.as_str(),
                    r.reason.as_deref().unwrap_or("no timings")
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(engine: &str, dtype: &str, round: u32, timings: &[f64]) -> Measurement {
        Measurement {
            run_id: "r".into(),
            family: "bert".into(),
            model: "minilm-l6".into(),
            backend: "cpu".into(),
            dtype: dtype.into(),
            batch: 8,
            seq: 128,
            shape_kind: "tokens".into(),
            engine: engine.into(),
            round,
            iters_done: timings.len() as u32,
            timings_ms: timings.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn pooled_medians_and_ratios_per_shape() {
        let ms = [
            point("ipfs-accelerate", "f32", 0, &[10.0, 12.0]),
            point("torch", "f32", 0, &[20.0, 22.0]),
            point("torch", "bf16", 0, &[40.0]),
            point("ipfs-accelerate", "f32", 1, &[11.0]),
            point("torch", "f32", 1, &[21.0]),
            Measurement {
                status: Status::Unavailable,
                reason: Some("no int8".into()),
                ..point("onnxruntime", "int8", 0, &[])
            },
        ];
        let rows = ratio_rows(&ms);
        assert_eq!(rows.len(), 4);
        assert_eq!(
            (rows[0].engine.as_str(), rows[0].rounds),
            ("ipfs-accelerate", 2)
        );
        assert_eq!(rows[0].median_ms, Some(11.0));
        assert_eq!(rows[0].ratio, None);
        assert_eq!(rows[1].median_ms, Some(21.0));
        assert_eq!(rows[1].ratio, Some(21.0 / 11.0));
        // bf16 has no ours of its dtype: compared with ours f32.
        assert_eq!(rows[2].ratio, Some(40.0 / 11.0));
        assert_eq!(rows[2].ratio_vs.as_deref(), Some("f32"));
        assert_eq!(rows[3].status, Status::Unavailable);
        assert_eq!(rows[3].median_ms, None);
        let text = table_text(&rows);
        assert!(text.contains("1.91× (vs ours f32)"), "{text}");
        assert!(text.contains("unavailable: no int8"), "{text}");
    }
}
