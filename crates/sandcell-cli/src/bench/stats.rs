//! The statistics every benchmark reports: quantiles and means of samples, in milliseconds.
//! It uses no other benchmark module.

use std::time::Duration;

/// The `q` quantile of `samples` (nearest rank), in milliseconds; 0 without samples.
pub(super) fn quantile(samples: &[Duration], q: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return 0.0;
    }
    let idx = ((ms.len() - 1) as f64 * q).round() as usize;
    ms[idx.min(ms.len() - 1)]
}

/// The mean of `samples` in milliseconds; 0 without samples.
pub(super) fn mean(samples: &[Duration]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.iter().map(Duration::as_secs_f64).sum::<f64>() * 1000.0 / samples.len() as f64
}
