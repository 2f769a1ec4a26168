//! Timing of the fused method: device time of its kernels by CUDA events ([`KernelTimer`]) and
//! the wall-clock phases of one call, printed when `KNN_PROFILE` is set ([`Phases`]).

use crate::device::{dev_err, Gpu};
use cudarc::driver::sys;
use knn_core::Result;

/// Device time between its start and [`KernelTimer::stop`] (CUDA events), with the parts
/// between its marks; nothing (no events, no wait) when the call is not timed.
pub(super) struct KernelTimer {
    start: Option<cudarc::driver::CudaEvent>,
    marks: Vec<(&'static str, cudarc::driver::CudaEvent)>,
}

/// A timing event recorded on the stream here, when the engine times its kernels
/// (`CudaEngine::with_kernel_timing`); `None` otherwise, or when events are not available.
pub(super) fn kernel_event(gpu: &Gpu) -> Result<Option<cudarc::driver::CudaEvent>> {
    if gpu.kernel_timing {
        KernelTimer::event(gpu)
    } else {
        Ok(None)
    }
}

impl KernelTimer {
    fn event(gpu: &Gpu) -> Result<Option<cudarc::driver::CudaEvent>> {
        let e = gpu
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok();
        if let Some(e) = &e {
            e.record(&gpu.stream).map_err(dev_err("event"))?;
        }
        Ok(e)
    }

    /// Starts timing here when `on` (the engine times its kernels, or the call is profiled).
    pub(super) fn start(gpu: &Gpu, on: bool) -> Result<Self> {
        Ok(KernelTimer {
            start: if on { Self::event(gpu)? } else { None },
            marks: Vec::new(),
        })
    }

    /// Ends the part `what` here (when `on`: profiling).
    pub(super) fn mark(&mut self, gpu: &Gpu, what: &'static str, on: bool) -> Result<()> {
        if let (true, Some(e)) = (on, Self::event(gpu)?) {
            self.marks.push((what, e));
        }
        Ok(())
    }

    /// The total ms and "part ms, ..." of the marked parts (the rest is `last`), once the
    /// device has done the work queued so far; 0 at once when not timed. (Waiting there while
    /// a graph's lists were made left the device idle while the host queued their finishing.)
    pub(super) fn stop(self, gpu: &Gpu, last: &str) -> Result<(f32, String)> {
        let Some(t0) = self.start else {
            return Ok((0.0, String::new()));
        };
        let Some(t1) = Self::event(gpu)? else {
            return Ok((0.0, String::new()));
        };
        t1.synchronize().map_err(dev_err("event"))?;
        let ms = |e: &cudarc::driver::CudaEvent| t0.elapsed_ms(e).unwrap_or(0.0);
        let mut parts = String::new();
        let mut at = 0.0;
        for (what, e) in &self.marks {
            parts += &format!("{what} {:.2}, ", ms(e) - at);
            at = ms(e);
        }
        let total = ms(&t1);
        if !self.marks.is_empty() {
            parts += &format!("{last} {:.2}", total - at);
        }
        Ok((total, parts))
    }
}

/// Wall-clock phases of one [`run`](super::run), summed over its query chunks and printed to
/// stderr when `KNN_PROFILE` is set. Each phase ends with a device sync, so profiling slows a
/// call a little.
pub(super) struct Phases {
    since: Option<std::time::Instant>,
    parts: Vec<(&'static str, f64)>,
}

impl Phases {
    pub(super) fn new() -> Phases {
        Phases {
            since: std::env::var_os("KNN_PROFILE").map(|_| std::time::Instant::now()),
            parts: Vec::new(),
        }
    }

    pub(super) fn lap(&mut self, gpu: &Gpu, what: &'static str) {
        if let Some(t) = self.since {
            let _ = gpu.sync();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            match self.parts.iter_mut().find(|p| p.0 == what) {
                Some(p) => p.1 += ms,
                None => self.parts.push((what, ms)),
            }
            self.since = Some(std::time::Instant::now());
        }
    }

    pub(super) fn print(&self, rows: usize) {
        if self.since.is_some() {
            let parts: Vec<String> = (self.parts.iter())
                .map(|(w, ms)| format!("{w} {ms:.2}"))
                .collect();
            eprintln!("cuda fused ({rows} rows), ms: {}", parts.join(", "));
        }
    }
}
