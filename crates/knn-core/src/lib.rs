//! # knn-core
//!
//! The shared vocabulary of the `knn` engine: row-major f32 matrices ([`MatrixRef`],
//! [`Matrix`]), distances ([`Metric`], reduced to four engine [`Kernel`]s, or user-defined:
//! [`MetricExpr`], module [`expr`]), results ([`Neighbors`]), running top-k selection
//! ([`TopK`]), the [`Engine`] trait, the exact pipeline ([`search()`], [`graph()`]) and the f64
//! [`oracle()`] with its tie-aware [`check()`].
//!
//! ## Exactness
//! Engines return candidate lists computed in fast, rounded arithmetic together with a proven
//! floor for everything they left out. The pipeline re-ranks candidates in f64 and accepts a row
//! only when its exact k-th key lies below that floor; other rows are asked again, wider, and
//! finally scanned exactly. So every returned row is a true k-nearest set, sorted by
//! (distance, id), whatever the engine's rounding.

mod engine;
mod error;
pub mod expr;
pub mod given;
mod matrix;
mod merge;
mod metric;
mod neighbors;
mod oracle;
pub mod pages;
pub mod prepare;
mod search;
pub mod synth;
mod threads;
mod topk;
mod validate;

pub use engine::{
    base_key, part_key, CandidateRequest, CandidateRows, Candidates, Engine, ExactFrom,
    FinishedRows, GraphRequest, OutputRows, PinnedOutput, RowSink, RowSlices, Symmetry,
};
pub use error::{KnnError, Result};
pub use expr::{EngineProgram, ExprError, ExprPlan, MetricExpr};
pub use matrix::{CentredRoots, Matrix, MatrixRef, RootsView};
pub use merge::{merge_answers, MergedAnswer, PartAnswer};
pub use metric::{Covariance, ErrorBounds, Kernel, Metric};
pub use neighbors::Neighbors;
pub use oracle::{check, check_with_truth, id_recall, oracle, CheckReport, DEFAULT_TOLERANCE};
pub use prepare::PreparedBase;
pub use search::{
    given_keys, graph, graph_given, graph_prepared, graph_rows, graph_with_progress,
    in_given_precision, search, search_given, search_prepared, search_with_progress,
    with_graph_first_try, ProgressFn,
};
pub use threads::Threads;
pub use topk::{SortKey, TopK};
pub use validate::{check_base, validate};
