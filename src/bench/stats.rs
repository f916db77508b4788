//! Percentiles of a handful of samples (nearest rank: with fewer than 100 samples p99 is the maximum,
//! which is the honest reading of a small run).

use std::time::Duration;

#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    /// None for no samples.
    pub fn of(samples: &[Duration]) -> Option<Self> {
        let mut s = samples.to_vec();
        s.sort();
        let max = *s.last()?;
        Some(Self {
            n: s.len(),
            p50: nearest_rank(&s, 50.0),
            p99: nearest_rank(&s, 99.0),
            max,
        })
    }
}

/// `sorted` must not be empty.
fn nearest_rank(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Resident and peak resident memory of this process in MiB, from /proc/self/status (Linux only).
pub fn rss_mib() -> Option<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map(|kib| kib / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let ms: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        let s = Summary::of(&ms).unwrap();
        assert_eq!(s.p50, Duration::from_millis(5));
        assert_eq!(s.p99, Duration::from_millis(10));
        assert_eq!(s.max, Duration::from_millis(10));
        assert!(Summary::of(&[]).is_none());
    }
}
