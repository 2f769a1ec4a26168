//! # knn-cpu
//!
//! The CPU engine: rayon threads over tiles of queries and base points.
//!
//! - GEMM kernels (squared L2, inner product): a `QUERY_TILE × BASE_TILE` block of dot
//!   products from faer's matmul (SIMD chosen at run time), turned into keys
//!   `‖b‖² − 2 q·b` and folded into each query's running top-k ([`knn_core::TopK`]) while the
//!   block is still in cache. The full `n_q × n_b` matrix never exists.
//! - Squared L2 first tries on AVX-512 BF16 CPUs: products of bf16-rounded inputs (`bf16.rs`,
//!   `vdpbf16ps`), or with AMX tiles where the CPU has them (`amx.rs`, `tdpbf16ps`: Intel Xeon
//!   from Sapphire Rapids on, where `vdpbf16ps` runs at the f32 FMA rate); the wider bound of
//!   bf16 inputs goes to the floor, the re-rank keeps results exact. A base's GEMM plan (mean,
//!   norms, norm bound) is kept per base key: an index's searches make it once.
//! - Squared L2 at small `d`: an integer path (`int8.rs`) with exact integer keys of grid
//!   codes, 8-bit with AVX-512 VNNI (`vpdpbusd`, `d ≤ 64`), else 12-bit with AVX2 (`vpmaddwd`,
//!   `d ≤ 128`, and L1 by `vpminsw`), base
//!   points in SIMD lanes and a fused threshold compare; the floor comes from the measured
//!   quantisation error. Retries (`precise`) use f32. `CpuEngine::without_int8` turns it off
//!   (`CpuEngine::f32_only` turns off bf16 too); the engine reads no environment variable.
//! - Direct kernels (L1, L∞): register-blocked micro-kernels (queries in SIMD lanes, base
//!   coordinates broadcast, 6 base points × 64 queries of accumulators with AVX-512), for
//!   AVX-512, AVX2 + FMA and plain x86-64, picked at run time. L1 on data near the origin uses
//!   `Σ|q − b| = Σq + Σb − 2·Σmin(q, b)` (2 operations per coordinate instead of 3) with a
//!   proven, wider floor bound; retries use `|q − b|` (see `direct.rs`).
//! - kNN graphs (`symmetric.rs`, [`knn_core::Engine::graph_candidates`]): each unordered
//!   pair's key computed once, by the same kernels made symmetric (whole keys, rows in lanes and
//!   columns broadcast, each key compared with both points' thresholds), and folded into both
//!   points' lists; block pairs run in tournament rounds so no two threads share a list. Same
//!   floors as the one-sided path. [`CpuEngine::with_symmetry`] chooses; `Auto` takes it where
//!   it measured faster ([`CpuEngine::pays_symmetric`]).
//!
//! - Expression metrics (`--metric-expr`): the plan's f32 program run by a bytecode loop over
//!   64 query lanes × 4 base points per dispatch (`expr.rs`).
//!
//! Results do not depend on the thread count: every selection is by (key, id).

mod amx;
mod bf16;
mod direct;
mod engine;
mod expr;
mod gemm;
mod int8;
mod isa;
mod symmetric;
mod units;

pub use engine::{CpuEngine, SYMMETRIC_LIST_BYTES, SYMMETRIC_MIN_POINTS};
pub use isa::describe;
pub use symmetric::SymmetricStats;
