//! Latency statistics over timed iterations.

use crate::record::LatencyStats;

/// Statistics of `timings_ms` (in any order); `None` when empty. Percentiles use the
/// nearest-rank definition (the smallest sample with at least p% of samples at or below it), so
/// every reported percentile is one of the measured samples.
pub fn latency_stats(timings_ms: &[f64]) -> Option<LatencyStats> {
    if timings_ms.is_empty() {
        return None;
    }
    let mut sorted = timings_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let mean = sorted.iter().sum::<f64>() / n as f64;
    let variance = if n > 1 {
        sorted.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    Some(LatencyStats {
        mean_ms: mean,
        p50_ms: percentile(&sorted, 50.0),
        p90_ms: percentile(&sorted, 90.0),
        p99_ms: percentile(&sorted, 99.0),
        min_ms: sorted[0],
        max_ms: sorted[n - 1],
        stddev_ms: variance.sqrt(),
    })
}

/// Nearest-rank percentile of an ascending, non-empty slice.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_and_sample_stddev() {
        let t: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let s = latency_stats(&t).unwrap();
        assert_eq!(s.min_ms, 1.0);
        assert_eq!(s.max_ms, 10.0);
        assert_eq!(s.p50_ms, 5.0);
        assert_eq!(s.p90_ms, 9.0);
        assert_eq!(s.p99_ms, 10.0);
        assert!((s.mean_ms - 5.5).abs() < 1e-12);
        // Sample variance of 1..=10 is 55/6.
        assert!((s.stddev_ms - (55.0f64 / 6.0).sqrt()).abs() < 1e-12);
        let one = latency_stats(&[3.0]).unwrap();
        assert_eq!((one.p50_ms, one.p99_ms, one.stddev_ms), (3.0, 3.0, 0.0));
        assert!(latency_stats(&[]).is_none());
    }
}
