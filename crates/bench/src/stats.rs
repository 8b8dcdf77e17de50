//! Mean ± SD and least-squares lines, for aggregating runs over seeds and for the scaling laws.

use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use serde::{Deserialize, Serialize};

/// CPU time the process has used so far, every thread (zero where the clock cannot be read).
pub fn process_cpu() -> Duration {
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// CPU time of the child processes this process has waited for (zero where it cannot be read).
pub fn children_cpu() -> Duration {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|usage| {
            let seconds = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec().max(0) as u64, 0)
                    + Duration::from_micros(t.tv_usec().max(0) as u64)
            };
            seconds(usage.user_time()) + seconds(usage.system_time())
        })
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeanSd {
    pub mean: f64,
    /// Sample standard deviation (n − 1); 0 for a single value.
    pub sd: f64,
}

pub fn mean_sd(values: &[f64]) -> MeanSd {
    if values.is_empty() {
        return MeanSd { mean: 0.0, sd: 0.0 };
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = if values.len() > 1 {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    MeanSd { mean, sd }
}

/// The middle value (the mean of the two middle values for an even count); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `y ≈ intercept + slope · x`, with the coefficient of determination.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    pub slope: f64,
    pub intercept: f64,
    pub r_squared: f64,
}

pub fn linear_fit(xs: &[f64], ys: &[f64]) -> LinearFit {
    let n = xs.len().min(ys.len()) as f64;
    if n < 2.0 {
        return LinearFit {
            slope: 0.0,
            intercept: ys.first().copied().unwrap_or(0.0),
            r_squared: 1.0,
        };
    }
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    let syy: f64 = ys.iter().map(|y| (y - my).powi(2)).sum();
    let slope = if sxx == 0.0 { 0.0 } else { sxy / sxx };
    let intercept = my - slope * mx;
    let r_squared = if syy == 0.0 {
        1.0
    } else {
        (sxy * sxy) / (sxx * syy)
    };
    LinearFit {
        slope,
        intercept,
        r_squared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn mean_sd_and_fit() {
        let m = mean_sd(&[1.0, 2.0, 3.0, 4.0]);
        assert!((m.mean - 2.5).abs() < 1e-12);
        assert!((m.sd - 1.290_994_448_735_805_6).abs() < 1e-12);
        assert_eq!(mean_sd(&[7.0]).sd, 0.0);
        let fit = linear_fit(&[0.0, 1.0, 2.0, 3.0], &[1.0, 3.0, 5.0, 7.0]);
        assert!((fit.slope - 2.0).abs() < 1e-12 && (fit.intercept - 1.0).abs() < 1e-12);
        assert!((fit.r_squared - 1.0).abs() < 1e-12);
        let flat = linear_fit(&[0.0, 1.0, 2.0], &[5.0, 5.0, 5.0]);
        assert_eq!((flat.slope, flat.r_squared), (0.0, 1.0));
    }
}
