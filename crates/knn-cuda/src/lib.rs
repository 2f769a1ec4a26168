//! # knn-cuda
//!
//! The CUDA engine of `knn`. The driver, NVRTC and cuBLAS are loaded at run time, so this crate
//! builds without a CUDA toolkit and the same binary runs on machines without a GPU
//! ([`CudaEngine::available`] is then `false` and [`CudaEngine::new`] a clear error).
//!
//! Kernels are `.cu` files under `kernels/`, embedded in the binary, compiled by NVRTC for the
//! device's own architecture on first use and cached on disk (`$XDG_CACHE_HOME/knn` or
//! `~/.cache/knn`; key: source hash, architecture, NVRTC version).
//!
//! Methods ([`Method`]):
//! - `fused` (the fast one): 128×128 key tiles from register-tiled FP32 kernels (GEMM form
//!   `‖q‖²+‖b‖²−2q·b` for squared L2 and inner product, direct for L1/L∞), folded into each
//!   query's running top-W list in shared memory (W ≤ 128); splits of the base are merged by a
//!   radix select. For W > 128, key tiles of bounded size go to device memory and a radix select
//!   keeps a running top-W (any W up to 4096 and beyond).
//! - `global`, `texture`, `cublas`: the three implementations of seed 000, each followed by the
//!   seed's modified insertion sort, with queries (and base) split under a memory budget.
//!
//! kNN graphs of a symmetric metric may be computed symmetrically ([`CudaEngine::with_symmetry`],
//! `kernels/sym.cu`, its own NVRTC module): every unordered pair's key once, folded into the
//! row's lists in shared memory and into the column's lists in device memory (under a lock per
//! tile), for all rows at the first round; the rounds then copy their rows' lists.
//!
//! Expression metrics (`--metric-expr`) run the fused method with the generated per-coordinate
//! program in place of the L1 operation: one NVRTC module per program (`kernels/expr.cu`,
//! `src/expr.rs`), cached on disk like the others.
//!
//! [`CudaGridEngine`] is the exact grid for d ≤ 3 (counting sort into cells on the device,
//! sub-grids for crowded cells, one thread per query searching rings of cells and writing final
//! rows itself; see `src/grid.rs`).
//!
//! Tuning is typed ([`CudaTuning`], given by [`CudaEngine::with_tuning`]): every field defaults
//! to the automatic choice; the environment is read only for `KNN_PROFILE` (phase timings on
//! stderr) and the cache folder.
//!
//! Every method returns, per query, the W smallest computed keys and a floor that is a proven
//! lower bound on the exact key of every point left out (see [`floor`](crate::floor)).

mod baseline;
mod device;
mod engine;
mod expr;
pub mod floor;
mod fused;
mod grid;
mod staging;
mod tuning;

pub use device::{devices, DeviceInfo};
pub use engine::{
    CudaEngine, DeviceMemory, DeviceQueries, DeviceResults, DeviceSearch, Method, Plain,
};
pub use fused::GraphShare;
pub use grid::{CudaGridEngine, GRID_WIDTH_MAX};
pub use tuning::{CollectPlan, CudaTuning};
