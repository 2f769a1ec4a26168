//! Pieces the CPU benchmarks share.

/// CPU time of this process (all threads) in seconds, from /proc (0 where unavailable): less
/// sensitive than wall time to other work on a shared machine.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    // Fields 14 and 15 (utime, stime), in clock ticks of 10 ms; `after` starts at field 3.
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    f.get(11)
        .zip(f.get(12))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}
