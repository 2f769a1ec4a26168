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
//!   together in one leaf. The points are also kept column by column, for the key loops.
//! - **Search** (`src/search.rs`): queries sorted by cell; each first searches the 3×3×3 block
//!   of cells around its cell (queries outside the box start from the nearest cell), rows of
//!   cells nearest first, skipping rows and cells whose distance bound exceeds its running
//!   `width`-th key (for k = 1 the whole block is scanned without branches instead), then rings
//!   of cells of Chebyshev radius 2, 3, ... until that key is below a proven bound on every
//!   unvisited cell.
//! - **Keys** (`src/lanes.rs`): four points at a time with SSE2 on x86_64 (its baseline, so no
//!   run-time dispatch), bit for bit the scalar keys; the selection (`src/best.rs`) compares
//!   (key, id) pairs as one packed integer.
//! - **Exactness**: bounds are computed from the actual coordinates in each slab of cells, in
//!   f64, rounded down; keys are direct f32 computations with a relative rounding bound. Rows
//!   hold exactly `width` (= k) candidates; the floor is the smallest of (the best key left out
//!   among examined points, less its rounding bound) and (the proven bound of every region
//!   skipped or left unvisited), rounded down, or `+∞` when the row holds every available point.
//!   The pipeline re-ranks in f64 and retries the rare rows the floor does not prove.
//! - **Rows to the pipeline**: through `Engine::candidate_rows` the grid hands its rows over in
//!   batches of 256 queries, in its own (cell) order, each announced to the pipeline before its
//!   search (so the pipeline fetches the scattered output lines meanwhile) and handed over right
//!   after it, with each candidate's f64 key (bit for bit `Kernel::exact`, computed from the
//!   cell-ordered copy while it is in cache): no candidate lists are built, no base row is read
//!   by the re-rank, and the pipeline gives it rounds of 2²⁰ queries. `Engine::candidates` (and
//!   `candidates_with_exact`) still return whole lists in the caller's order.
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
