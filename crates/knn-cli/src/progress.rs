//! A progress bar on stderr that appears only for work longer than about a second, and never
//! with `--quiet` or when stderr is not a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shows after this much time without completion.
const SHOW_AFTER: Duration = Duration::from_secs(1);

pub struct Progress {
    bar: Option<Mutex<(ProgressBar, bool)>>,
    start: Instant,
}

impl Progress {
    pub fn new(what: &str, total: usize, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::hidden());
            b.set_style(
                ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta} left)")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            b.set_message(what.to_string());
            Mutex::new((b, false))
        });
        Progress {
            bar,
            start: Instant::now(),
        }
    }

    /// Records `done` of `total`.
    pub fn update(&self, done: usize, _total: usize) {
        if let Some(m) = &self.bar {
            let mut g = m.lock().expect("progress lock");
            if !g.1 && self.start.elapsed() > SHOW_AFTER && done < _total {
                g.0.set_draw_target(ProgressDrawTarget::stderr());
                g.1 = true;
            }
            g.0.set_position(done as u64);
        }
    }

    pub fn finish(&self) {
        if let Some(m) = &self.bar {
            m.lock().expect("progress lock").0.finish_and_clear();
        }
    }
}
