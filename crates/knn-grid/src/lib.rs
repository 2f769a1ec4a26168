//! # knn-grid
//!
//! An exact kNN engine for low-dimensional points (d ≤ 3 or so): [`GridEngine`], an
//! implementation of [`knn_core::Engine`], used through the shared pipeline
//! (`knn_core::search(&GridEngine::new(None)?, base, queries, k, &Metric::L2)`).
//!
//! - **Build** (`src/build.rs`): bounding box, cells sized from the point count (about
//!   3 points per cell, at most 2²² cells per level), a parallel counting sort (histogram per
//!   chunk, prefix sum, scatter) that copies the points into cell order with their original
//!   ids. Cells with more than 48 points get their own sub-grid over their own bounding box
//!   (recursively, up to 8 levels), so clustered data stays fast; coinciding points stay
//!   together in one leaf.
//! - **Search** (`src/search.rs`): queries sorted by cell; each visits rings of cells
//!   of growing Chebyshev radius around its cell (queries outside the box start from the
//!   nearest cell), skips cells whose distance bound exceeds its running `width`-th key, and
//!   stops once that key is below a proven bound on every unvisited cell.
//! - **Exactness**: bounds are computed from the actual coordinates in each slab of cells, in
//!   f64, rounded down; keys are direct f32 computations with a relative rounding bound. Rows
//!   hold exactly `width` (= k) candidates; the floor is the smallest of (the best key left out
//!   among examined points, less its rounding bound) and (the proven bound of every region
//!   skipped or left unvisited), rounded down, or `+∞` when the row holds every available point.
//!   The pipeline re-ranks in f64 and retries the rare rows the floor does not prove.
//! - **Exact keys**: through `Engine::candidates_with_exact` the grid also returns each
//!   candidate's f64 key (bit for bit `Kernel::exact`), computed from its cell-ordered copy while
//!   the rows are in cache, so the pipeline's re-rank reads no base row; results are scattered
//!   straight into the caller's row order, and the pipeline gives it rounds of 2²⁰ queries.
//! - **Kernels**: squared L2 (metrics sqeuclidean, l2, hellinger, mahalanobis), L1, L∞. The inner
//!   product and cosine are refused with a clear error (no distance-to-cell bound).
//! - **Cache**: the index of the last base is kept and reused when the pipeline calls again with
//!   the same data (same address, length and values).

mod best;
mod build;
mod engine;
mod lanes;
mod search;

pub use engine::GridEngine;
