//! # knn-cpu
//!
//! The CPU engine: rayon threads over tiles of queries and base points.
//!
//! - GEMM kernels (squared L2, inner product): a `QUERY_TILE × BASE_TILE` block of dot
//!   products from faer's matmul (SIMD chosen at run time), turned into keys
//!   `‖b‖² − 2 q·b` and folded into each query's running top-k ([`knn_core::TopK`]) while the
//!   block is still in cache. The full `n_q × n_b` matrix never exists.
//! - Direct kernels (L1, L∞): one query against a run of base points with many independent
//!   SIMD accumulators, compiled for AVX-512, AVX2 and baseline x86-64 and picked at run time.
//!
//! Results do not depend on the thread count: every selection is by (key, id).

mod bf16;
mod direct;
mod engine;
mod gemm;

pub use engine::CpuEngine;
