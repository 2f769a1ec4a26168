//! The timed runs of `--repeat`, and what `--timing-json` and the summary line say of them.

use anyhow::{Context, Result};
use std::path::Path;
use std::time::Instant;

/// Runs `f` `repeat` times (at least once); returns the last result and every time in ms.
pub fn timed<T, E>(repeat: usize, mut f: impl FnMut() -> Result<T, E>) -> Result<(T, Vec<f64>)>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        last = Some(f()?);
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((last.expect("at least one run"), times))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The median of `times` (ms), written with every time to `json` when given, and the note
/// " (median of N)" for the summary line when there was more than one run.
pub fn summary(times: &[f64], json: Option<&Path>) -> Result<(f64, String)> {
    let med = median(times);
    if let Some(path) = json {
        let list: Vec<String> = times.iter().map(|t| format!("{t:.4}")).collect();
        std::fs::write(
            path,
            format!(
                "{{\"median_ms\": {med:.4}, \"times_ms\": [{}]}}\n",
                list.join(", ")
            ),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    let runs = if times.len() > 1 {
        format!(" (median of {})", times.len())
    } else {
        String::new()
    };
    Ok((med, runs))
}
