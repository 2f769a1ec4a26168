//! # knn
//!
//! Exact k-nearest neighbours on CPUs and NVIDIA GPUs.
//!
//! | task | call |
//! |---|---|
//! | a base prepared once, searched many times (kept on the GPU) | [`Index`] |
//! | k nearest base points of each query | [`Knn::search`] or [`search`] |
//! | kNN graph (self-join, own id excluded) | [`Knn::graph`] or [`graph`] |
//! | a graph with each unordered pair computed once (on by default where it pays) | [`Options::symmetric`] |
//! | a graph in pieces (checkpoints) | [`Knn::graph_rows`] |
//! | low dimensions: the exact grid, on the CPU or a GPU | [`Options::method`] = [`Method::Grid`] (or `Auto`) |
//! | several GPUs | [`Options::gpus`] |
//! | cap GPU memory, stream the base from the host | [`Options::gpu_memory`] |
//! | your own distance: a per-coordinate accumulation | [`Metric::Expr`] with [`MetricExpr::parse`] |
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
//! A distance of your own, here Hellinger spelled out (see `knn_core::expr` for the syntax):
//! ```
//! use knn::{Knn, Metric, MetricExpr, MatrixRef, Options};
//! use std::sync::Arc;
//! let base = [0.0f32, 1.0, 0.25, 0.25, 1.0, 0.0];
//! let queries = [0.2f32, 0.3];
//! let hellinger = MetricExpr::parse("acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)").unwrap();
//! let knn = Knn::new(&Options { device: knn::Device::Cpu, ..Options::default() }).unwrap();
//! let b = MatrixRef::new("base", &base, 2).unwrap();
//! let q = MatrixRef::new("queries", &queries, 2).unwrap();
//! let nn = knn.search(b, q, 1, &Metric::Expr(Arc::new(hellinger))).unwrap();
//! assert_eq!(nn.ids_of(0), &[1]);
//! ```
//!
//! Every answer is exact: engines compute candidates fast, the shared pipeline re-ranks them in
//! f64 and proves no other point is closer (see `knn_core`). Rows are ordered by
//! (distance, id); the same input gives the same answer on every device and thread count.

pub use knn_core::given;
pub use knn_core::pages;
pub use knn_core::synth;
pub use knn_core::{
    check, check_with_truth, id_recall, oracle, CheckReport, Covariance, Engine, ExprError, Kernel,
    KnnError, Matrix, MatrixRef, Metric, MetricExpr, Neighbors, ProgressFn, Result, Symmetry,
    DEFAULT_TOLERANCE,
};
pub use knn_core::{merge_answers, MergedAnswer, PartAnswer};
pub use knn_cpu::CpuEngine;
pub use knn_grid::GridEngine;

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

mod index;
mod multi;

pub use index::{DeviceMemory, DeviceQueries, DeviceResults, Index, Rows};

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

/// How candidates are computed. Every method gives the same exact answer; they differ in speed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// The grid for low dimensions (d ≤ [`GRID_MAX_DIM`], a metric with a distance-to-cell
    /// bound, at least [`GRID_MIN_POINTS`] base points), on the device in use; brute force
    /// otherwise.
    #[default]
    Auto,
    /// Brute force: the GEMM form with a fused top-k on the CPU, the fused kernels on a GPU.
    Brute,
    /// The exact grid (cells, counting sort, ring search) on the device in use. L2, squared L2,
    /// L1, L∞ (and the metrics reduced to squared L2); not the inner product or cosine.
    Grid,
    /// Seed 000's global-memory CUDA kernel + insertion sort (a GPU baseline).
    Global,
    /// Seed 000's texture-memory CUDA kernel + insertion sort (a GPU baseline).
    Texture,
    /// Seed 000's cuBLAS GEMM + insertion sort (a GPU baseline).
    Cublas,
}

/// Dimensions up to which [`Method::Auto`] takes the grid.
pub const GRID_MAX_DIM: usize = 3;
/// Base points from which [`Method::Auto`] takes the grid (below it brute force is as fast).
pub const GRID_MIN_POINTS: usize = 2048;

impl FromStr for Method {
    type Err = KnnError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => Method::Auto,
            "brute" | "fused" => Method::Brute,
            "grid" => Method::Grid,
            "global" => Method::Global,
            "texture" => Method::Texture,
            "cublas" => Method::Cublas,
            _ => {
                return Err(KnnError::Option(format!(
                    "unknown method '{s}' (auto, brute, grid, or the GPU baselines global, texture, cublas)"
                )))
            }
        })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Auto => "auto",
            Method::Brute => "brute",
            Method::Grid => "grid",
            Method::Global => "global",
            Method::Texture => "texture",
            Method::Cublas => "cublas",
        })
    }
}

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Device choice.
    pub device: Device,
    /// CPU threads (`None`: one per core).
    pub threads: Option<usize>,
    /// How candidates are computed.
    pub method: Method,
    /// Cap on the device memory a GPU engine's tiles use, in bytes (`None`: 70 % of free
    /// memory). Smaller caps stream the base from host memory in tiles.
    pub gpu_memory: Option<usize>,
    /// Several GPUs at once (CUDA ordinals; [`parse_gpus`] reads them as users write them).
    /// Searches of a base from 256 MiB split the base (each GPU holds a part and searches
    /// every query in it, the lists merged); graphs and smaller bases give each GPU rounds of
    /// queries, and the pairs of a graph computed symmetrically are shared among the GPUs
    /// (`knn_cuda::GraphShare`). Empty: the single `device`. The answer is identical to one GPU's (every row is
    /// re-ranked exactly and ordered by (distance, id)).
    pub gpus: Vec<usize>,
    /// kNN graphs: compute each unordered pair's key once and fold it into both
    /// points' lists (every metric here is symmetric). `Auto` (default) where it pays
    /// ([`CpuEngine::pays_symmetric`], `CudaEngine::pays_symmetric`); the answer is the same
    /// either way. With several GPUs each takes whole rounds, one-sided.
    pub symmetric: Symmetry,
}

/// A configured engine: the device is chosen once, then used for every call; with
/// [`Method::Auto`] each call picks brute force or the grid from its data.
pub struct Knn {
    brute: Brute,
    device: Device,
    method: Method,
    threads: Option<usize>,
    /// The grid engine of the device in use, made on first use.
    grid: OnceLock<Result<Box<dyn Engine + Send>>>,
}

impl Knn {
    /// Picks the engine for `opts`. `Device::Auto` takes a GPU when one is usable, else the CPU;
    /// `Device::Cuda(n)` fails clearly when there is none. The GPU baselines need a GPU.
    pub fn new(opts: &Options) -> Result<Self> {
        let opened = std::time::Instant::now();
        let knn = Self::open(opts);
        if std::env::var_os("KNN_PROFILE").is_some() {
            eprintln!(
                "knn: engines opened in {:.2} ms",
                opened.elapsed().as_secs_f64() * 1e3
            );
        }
        knn
    }

    fn open(opts: &Options) -> Result<Self> {
        let gpu_only = matches!(
            opts.method,
            Method::Global | Method::Texture | Method::Cublas
        );
        let (brute, device) = match opts.device {
            Device::Cpu if gpu_only => {
                return Err(KnnError::Option(format!(
                    "method {} runs on a GPU only (use --device cuda or auto)",
                    opts.method
                )))
            }
            Device::Cpu if !opts.gpus.is_empty() => {
                return Err(KnnError::Option(
                    "several GPUs were asked for with the CPU device".into(),
                ))
            }
            Device::Cpu => (Brute::Cpu(cpu_engine(opts)?), Device::Cpu),
            _ if opts.gpus.len() > 1 => (
                Brute::Multi(gpu::multi(&opts.gpus, opts)?),
                Device::Cuda(opts.gpus[0]),
            ),
            _ if opts.gpus.len() == 1 => (
                Brute::Cuda(Box::new(gpu::engine(opts.gpus[0], opts)?)),
                Device::Cuda(opts.gpus[0]),
            ),
            Device::Cuda(n) => (
                Brute::Cuda(Box::new(gpu::engine(n, opts)?)),
                Device::Cuda(n),
            ),
            Device::Auto => match gpu::engine(0, opts) {
                Ok(engine) => (Brute::Cuda(Box::new(engine)), Device::Cuda(0)),
                Err(e) if gpu_only => return Err(e),
                Err(_) => (Brute::Cpu(cpu_engine(opts)?), Device::Cpu),
            },
        };
        Ok(Knn {
            brute,
            device,
            method: opts.method,
            threads: opts.threads,
            grid: OnceLock::new(),
        })
    }

    /// The device in use for brute force.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The engine's name (`cpu`, `cuda:0/fused`, ...) for brute force; see
    /// [`Knn::engine_for`] for the engine a given call uses.
    pub fn engine_name(&self) -> String {
        self.brute.engine().name()
    }

    /// The brute-force engine when it is one GPU's (searches of queries in its memory).
    pub(crate) fn cuda(&self) -> Option<&knn_cuda::CudaEngine> {
        match &self.brute {
            Brute::Cuda(e) => Some(e.as_ref()),
            _ => None,
        }
    }

    fn grid_engine(&self) -> Result<&dyn Engine> {
        self.grid
            .get_or_init(|| match self.device {
                Device::Cuda(n) => gpu::grid(n, self.threads),
                _ => GridEngine::new(self.threads).map(|g| Box::new(g) as Box<dyn Engine + Send>),
            })
            .as_ref()
            .map(|e| e.as_ref() as &dyn Engine)
            .map_err(|e| KnnError::Option(e.to_string()))
    }

    /// The engine a call on `points` base points of dimension `dim` under `metric` uses.
    /// Expression metrics always take brute force (the grid has no bound for them).
    pub fn engine_for(&self, points: usize, dim: usize, metric: &Metric) -> Result<&dyn Engine> {
        let grid_fits = metric.kernel() != Kernel::NegDot && !metric.is_expr();
        match self.method {
            Method::Grid if !grid_fits => Err(KnnError::Option(format!(
                "the grid method has no distance-to-cell bound for {metric} (use --method brute)"
            ))),
            Method::Grid => Ok(self.grid_engine()?),
            Method::Auto if grid_fits && dim <= GRID_MAX_DIM && points >= GRID_MIN_POINTS => {
                Ok(self.grid_engine()?)
            }
            _ => Ok(self.brute.engine()),
        }
    }

    /// The brute-force engine, for the lower-level pipeline calls of `knn_core`.
    pub fn engine(&self) -> &dyn Engine {
        self.brute.engine()
    }

    /// The k nearest base points of every query (see [`knn_core::search()`]).
    pub fn search(
        &self,
        base: MatrixRef<'_>,
        queries: MatrixRef<'_>,
        k: usize,
        metric: &Metric,
    ) -> Result<Neighbors> {
        self.search_with_progress(base, queries, k, metric, &|_, _| {})
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
        let engine = self.engine_for(base.rows(), base.dim(), metric)?;
        knn_core::search_with_progress(engine, base, queries, k, metric, progress)
    }

    /// The kNN graph of `points`: each point's k nearest other points (see [`knn_core::graph()`]).
    pub fn graph(&self, points: MatrixRef<'_>, k: usize, metric: &Metric) -> Result<Neighbors> {
        self.graph_with_progress(points, k, metric, &|_, _| {})
    }

    /// [`Knn::graph`] with a progress callback `(done, total)`.
    pub fn graph_with_progress(
        &self,
        points: MatrixRef<'_>,
        k: usize,
        metric: &Metric,
        progress: knn_core::ProgressFn<'_>,
    ) -> Result<Neighbors> {
        let engine = self.engine_for(points.rows(), points.dim(), metric)?;
        knn_core::graph_with_progress(engine, points, k, metric, progress)
    }

    /// Rows `rows` of the kNN graph of `points` (see [`knn_core::graph_rows()`]): a graph in
    /// pieces, for checkpoints.
    pub fn graph_rows(
        &self,
        points: MatrixRef<'_>,
        rows: std::ops::Range<usize>,
        k: usize,
        metric: &Metric,
        progress: knn_core::ProgressFn<'_>,
    ) -> Result<Neighbors> {
        let engine = self.engine_for(points.rows(), points.dim(), metric)?;
        knn_core::graph_rows(engine, points, rows, k, metric, progress)
    }
}

/// The CPU engine of `opts`.
/// The brute-force engine of a [`Knn`], by kind.
enum Brute {
    Cpu(CpuEngine),
    Cuda(Box<knn_cuda::CudaEngine>),
    /// Several GPUs.
    Multi(multi::MultiEngine),
}

impl Brute {
    fn engine(&self) -> &dyn Engine {
        match self {
            Brute::Cpu(e) => e,
            Brute::Cuda(e) => e.as_ref(),
            Brute::Multi(e) => e,
        }
    }
}

fn cpu_engine(opts: &Options) -> Result<CpuEngine> {
    Ok(CpuEngine::new(opts.threads)?.with_symmetry(opts.symmetric))
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

/// The CPU engine's instruction set and fast paths on this CPU, in words (`knn info`).
pub fn cpu_paths() -> String {
    knn_cpu::describe()
}

/// Why no GPU is usable (or "ok").
pub fn gpu_status() -> String {
    gpu::status()
}

/// Several GPUs as the user names them: `all` (every usable GPU) or a comma list of CUDA
/// ordinals, each maybe written `cuda:N` (`0,2,3`, `cuda:0,cuda:1`), for [`Options::gpus`].
/// An error names the part that is not a GPU number, or says why no GPU is usable.
pub fn parse_gpus(list: &str) -> Result<Vec<usize>> {
    let gpus: Vec<usize> = if list.trim() == "all" {
        gpu_devices().into_iter().map(|(n, _)| n).collect()
    } else {
        list.split(',')
            .map(|s| {
                let s = s.trim();
                s.strip_prefix("cuda:").unwrap_or(s).parse().map_err(|_| {
                    KnnError::Option(format!("'{s}' is not a GPU number (e.g. 0,2,3 or all)"))
                })
            })
            .collect::<Result<_>>()?
    };
    if gpus.is_empty() {
        return Err(KnnError::Option(format!(
            "no usable GPU for '{list}' ({})",
            gpu_status()
        )));
    }
    Ok(gpus)
}

/// The CUDA engines (the driver, NVRTC and cuBLAS are loaded at run time: without them these
/// report why and the CPU is used).
mod gpu {
    use super::*;
    use knn_cuda::{CudaEngine, Method as CudaMethod};

    pub(super) fn engine(ordinal: usize, opts: &Options) -> Result<CudaEngine> {
        let method = match opts.method {
            Method::Global => CudaMethod::Global,
            Method::Texture => CudaMethod::Texture,
            Method::Cublas => CudaMethod::Cublas,
            Method::Auto | Method::Brute | Method::Grid => CudaMethod::Fused,
        };
        // Lists wider than the kernels hold go to the CPU engine.
        let mut engine = CudaEngine::new(ordinal, method)?
            .with_symmetry(opts.symmetric)
            .with_fallback(Box::new(cpu_engine(opts)?));
        if let Some(bytes) = opts.gpu_memory {
            engine = engine.with_memory_budget(bytes);
        }
        Ok(engine)
    }

    pub(super) fn grid(ordinal: usize, threads: Option<usize>) -> Result<Box<dyn Engine + Send>> {
        // What the device's grid does not hold (wide lists, d > 3) goes to the CPU grid.
        let cpu = GridEngine::new(threads)?;
        Ok(Box::new(
            knn_cuda::CudaGridEngine::new(ordinal)?.with_fallback(Box::new(cpu)),
        ))
    }

    pub(super) fn multi(ordinals: &[usize], opts: &Options) -> Result<crate::multi::MultiEngine> {
        let mut seen = std::collections::HashSet::new();
        if let Some(d) = ordinals.iter().find(|&&d| !seen.insert(d)) {
            return Err(KnnError::Option(format!("GPU {d} is listed twice")));
        }
        // The GPUs share the pairs of symmetric graphs (each makes a part of the lists). They
        // are opened at once, a thread each (a context and its modules per GPU).
        let shares = knn_cuda::GraphShare::new(ordinals.len());
        let engines = std::thread::scope(|s| {
            let opened: Vec<_> = ordinals
                .iter()
                .zip(shares)
                .map(|(&n, share)| {
                    s.spawn(move || engine(n, opts).map(|e| e.with_graph_share(share)))
                })
                .collect();
            opened
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(KnnError::Device("opening a GPU panicked".into())))
                })
                .collect::<Result<Vec<_>>>()
        })?;
        // Their parts of a shared graph copy from one another.
        CudaEngine::link_peers(&engines.iter().collect::<Vec<_>>());
        let engines = engines
            .into_iter()
            .map(|e| Box::new(e) as Box<dyn Engine + Send>)
            .collect();
        Ok(crate::multi::MultiEngine::new(engines))
    }

    pub(super) fn devices() -> Vec<(usize, String)> {
        knn_cuda::devices()
            .into_iter()
            .map(|d| {
                (
                    d.ordinal,
                    format!(
                        "{}, {:.1} GiB, compute capability {}.{}, {} SMs",
                        d.name,
                        d.total_memory as f64 / (1u64 << 30) as f64,
                        d.compute_capability.0,
                        d.compute_capability.1,
                        d.multiprocessors
                    ),
                )
            })
            .collect()
    }

    pub(super) fn status() -> String {
        if CudaEngine::available() {
            "ok".into()
        } else {
            "no CUDA driver library (libcuda) or no GPU found".into()
        }
    }
}
