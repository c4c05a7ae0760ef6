//! Latency histograms cheap enough for the log's hot paths: a fixed array
//! of atomic buckets, no lock, rendered as Prometheus histograms.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::storage::{StdStorage, Storage};

/// Upper bounds of the buckets, in nanoseconds: 0.1 ms to 10 s.
const BOUNDS_NS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// A histogram of durations: counts per bucket (the last past 10 s), their
/// sum and count. Relaxed atomics: a scrape may see one observation half
/// counted, never a torn number.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

/// A histogram's counts at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Per bucket (not cumulative), the last one past the largest bound.
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
    pub count: u64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            count: self.count.load(Ordering::Relaxed),
        }
    }

    /// Append the Prometheus text of this histogram, in seconds.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        self.snapshot().render(out, name, help);
    }
}

impl HistogramSnapshot {
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        let mut cumulative = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            cumulative += n;
            let le = match BOUNDS_NS.get(i) {
                Some(b) => format!("{}", *b as f64 / 1e9),
                None => "+Inf".to_owned(),
            };
            out.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {cumulative}\n"));
        }
        out.push_str(&format!(
            "{name}_sum {}\n{name}_count {}\n",
            self.sum_ns as f64 / 1e9,
            self.count
        ));
    }
}

/// `Dirty` and `Writeback` of /proc/meminfo, in bytes: what the page cache
/// holds for the disk that a sync will wait on.
pub fn dirty_and_writeback() -> Option<(u64, u64)> {
    let bytes = StdStorage.read(Path::new("/proc/meminfo")).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
    };
    Some((field("Dirty:")?, field("Writeback:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_render_cumulatively() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(20));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], 2, "at or under 0.1 ms");
        assert_eq!(s.buckets[5], 1, "2.5 to 5 ms");
        assert_eq!(s.buckets[16], 1, "past 10 s");
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "help");
        assert!(out.contains("# TYPE x_seconds histogram"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.0001\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.005\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"10\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_seconds_count 4\n"), "{out}");
    }

    #[test]
    fn meminfo_gives_dirty_and_writeback() {
        assert!(dirty_and_writeback().is_some());
    }
}
