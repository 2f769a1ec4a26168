//! # knn
//!
//! Exact k-nearest neighbours on CPUs and NVIDIA GPUs.
//!
//! | task | call |
//! |---|---|
//! | k nearest base points of each query | [`Knn::search`] or [`search`] |
//! | kNN graph (self-join, own id excluded) | [`Knn::graph`] or [`graph`] |
//! | check a result against the f64 oracle | [`check`] |
//!
//! ```
//! use knn::{Knn, Metric, MatrixRef, Options};
//! let base = [0.0f32, 0.0, 1.0, 0.0, 5.0, 5.0];
//! let queries = [0.9f32, 0.1];
//! let knn = Knn::new(&Options::default()).unwrap();
//! let b = MatrixRef::new("base", &base, 2).unwrap();
//! let q = MatrixRef::new("queries", &queries, 2).unwrap();
//! let nn = knn.search(b, q, 2, &Metric::L2).unwrap();
//! assert_eq!(nn.ids_of(0), &[1, 0]);
//! ```
//!
//! Every answer is exact: engines compute candidates fast, the shared pipeline re-ranks them in
//! f64 and proves no other point is closer (see `knn_core`). Rows are ordered by
//! (distance, id); the same input gives the same answer on every device and thread count.

pub use knn_core::synth;
pub use knn_core::{
    check, check_with_truth, id_recall, oracle, CheckReport, Covariance, Engine, Kernel, KnnError,
    Matrix, MatrixRef, Metric, Neighbors, Result, DEFAULT_TOLERANCE,
};
pub use knn_cpu::CpuEngine;

use std::fmt;
use std::str::FromStr;

/// Where to compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// A usable CUDA GPU if there is one, else the CPU.
    #[default]
    Auto,
    /// The CPU engine.
    Cpu,
    /// CUDA device number N.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = KnnError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    KnnError::Option(format!("unknown device '{s}' (auto, cpu, cuda, cuda:N)"))
                }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Device choice.
    pub device: Device,
    /// CPU threads (`None`: one per core).
    pub threads: Option<usize>,
    /// GPU method (`fused`, `global`, `texture`, `cublas`; `None`: fused).
    pub gpu_method: Option<String>,
}

/// A configured engine: the device is chosen once, then used for every call.
pub struct Knn {
    engine: Box<dyn Engine>,
    device: Device,
}

impl Knn {
    /// Picks the engine for `opts`. `Device::Auto` takes a GPU when one is usable, else the CPU;
    /// `Device::Cuda(n)` fails clearly when there is none.
    pub fn new(opts: &Options) -> Result<Self> {
        match opts.device {
            Device::Cpu => Self::cpu(opts),
            Device::Cuda(n) => gpu::engine(n, opts).map(|engine| Knn {
                engine,
                device: Device::Cuda(n),
            }),
            Device::Auto => match gpu::engine(0, opts) {
                Ok(engine) => Ok(Knn {
                    engine,
                    device: Device::Cuda(0),
                }),
                Err(_) => Self::cpu(opts),
            },
        }
    }

    fn cpu(opts: &Options) -> Result<Self> {
        Ok(Knn {
            engine: Box::new(CpuEngine::new(opts.threads)?),
            device: Device::Cpu,
        })
    }

    /// The device in use.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The engine's name (`cpu`, `cuda:0/fused`, ...).
    pub fn engine_name(&self) -> String {
        self.engine.name()
    }

    /// The engine, for the lower-level pipeline calls of `knn_core`.
    pub fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }

    /// The k nearest base points of every query (see [`knn_core::search()`]).
    pub fn search(
        &self,
        base: MatrixRef<'_>,
        queries: MatrixRef<'_>,
        k: usize,
        metric: &Metric,
    ) -> Result<Neighbors> {
        knn_core::search(self.engine(), base, queries, k, metric)
    }

    /// [`Knn::search`] with a progress callback `(done, total)`.
    pub fn search_with_progress(
        &self,
        base: MatrixRef<'_>,
        queries: MatrixRef<'_>,
        k: usize,
        metric: &Metric,
        progress: knn_core::ProgressFn<'_>,
    ) -> Result<Neighbors> {
        knn_core::search_with_progress(self.engine(), base, queries, k, metric, progress)
    }

    /// The kNN graph of `points`: each point's k nearest other points (see [`knn_core::graph()`]).
    pub fn graph(&self, points: MatrixRef<'_>, k: usize, metric: &Metric) -> Result<Neighbors> {
        knn_core::graph(self.engine(), points, k, metric)
    }

    /// [`Knn::graph`] with a progress callback `(done, total)`.
    pub fn graph_with_progress(
        &self,
        points: MatrixRef<'_>,
        k: usize,
        metric: &Metric,
        progress: knn_core::ProgressFn<'_>,
    ) -> Result<Neighbors> {
        knn_core::graph_with_progress(self.engine(), points, k, metric, progress)
    }
}

/// Exact search with default options (GPU if usable, else all CPU cores).
pub fn search(
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
) -> Result<Neighbors> {
    Knn::new(&Options::default())?.search(base, queries, k, metric)
}

/// Exact kNN graph with default options.
pub fn graph(points: MatrixRef<'_>, k: usize, metric: &Metric) -> Result<Neighbors> {
    Knn::new(&Options::default())?.graph(points, k, metric)
}

/// Usable CUDA devices: (ordinal, description).
pub fn gpu_devices() -> Vec<(usize, String)> {
    gpu::devices()
}

/// Why no GPU is usable (or "ok").
pub fn gpu_status() -> String {
    gpu::status()
}

/// GPU engines, when this build has them.
mod gpu {
    use super::*;

    pub(super) fn engine(_ordinal: usize, _opts: &Options) -> Result<Box<dyn Engine>> {
        Err(KnnError::Device("this build has no CUDA engine".into()))
    }

    pub(super) fn devices() -> Vec<(usize, String)> {
        Vec::new()
    }

    pub(super) fn status() -> String {
        "this build has no CUDA engine".into()
    }
}
