//! The library's error type: every variant names what is wrong and where.

use thiserror::Error;

/// Errors of the kNN library. Bad user input always ends here, never in a panic.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum KnnError {
    /// A value is NaN or infinite.
    #[error("{what}: row {row}, column {col} is {value} (only finite values are allowed)")]
    NonFinite {
        what: String,
        row: usize,
        col: usize,
        value: f32,
    },
    /// The slice length does not match rows × dim.
    #[error("{what}: {len} values cannot form {rows} rows of dimension {dim}")]
    Shape {
        what: String,
        len: usize,
        rows: usize,
        dim: usize,
    },
    /// Dimension zero.
    #[error("{what}: dimension must be at least 1")]
    ZeroDim { what: String },
    /// Base and queries have different dimensions.
    #[error("dimension mismatch: base has d={base}, queries have d={queries}")]
    DimMismatch { base: usize, queries: usize },
    /// No base points.
    #[error("the base set is empty")]
    EmptyBase,
    /// k = 0.
    #[error("k must be at least 1")]
    ZeroK,
    /// More neighbours asked for than exist.
    #[error("k={k} is larger than the {n} points available{hint}")]
    KTooLarge { k: usize, n: usize, hint: String },
    /// Hellinger needs non-negative inputs.
    #[error(
        "{what}: row {row}, column {col} is {value}, but the Hellinger distance needs values >= 0"
    )]
    Negative {
        what: String,
        row: usize,
        col: usize,
        value: f64,
    },
    /// A distance exceeds the f32 range of the output.
    #[error("{metric} distances of query row {row} exceed the f32 range (3.4e38); scale the data down or use a metric with smaller values (l2 instead of sqeuclidean)")]
    Overflow { metric: &'static str, row: usize },
    /// Too many points for 32-bit ids.
    #[error("{n} points exceed the 2^32-1 ids this build supports")]
    TooManyPoints { n: usize },
    /// Mahalanobis covariance is unusable.
    #[error("Mahalanobis: {0}")]
    Covariance(String),
    /// An expression metric that does not parse, or that the data would make undefined.
    #[error("metric expression: {0}")]
    Expr(crate::expr::ExprError),
    /// Invalid option value.
    #[error("invalid option: {0}")]
    Option(String),
    /// A device (GPU) failed or is unavailable.
    #[error("device: {0}")]
    Device(String),
    /// The engine ran out of memory even with the smallest tiles.
    #[error("out of memory: needed {needed} bytes on {device}, {available} available")]
    OutOfMemory {
        device: String,
        needed: u64,
        available: u64,
    },
}

impl KnnError {
    /// This error with its query row numbers mapped by `row`: an error of some of the queries
    /// (a piece, or chosen rows) told in the numbers of the whole query set.
    pub fn renumber_query_rows(self, row: impl Fn(usize) -> usize) -> KnnError {
        match self {
            KnnError::NonFinite {
                what,
                row: r,
                col,
                value,
            } if what == "queries" => KnnError::NonFinite {
                what,
                row: row(r),
                col,
                value,
            },
            KnnError::Negative {
                what,
                row: r,
                col,
                value,
            } if what == "queries" => KnnError::Negative {
                what,
                row: row(r),
                col,
                value,
            },
            KnnError::Overflow { metric, row: r } => KnnError::Overflow {
                metric,
                row: row(r),
            },
            e => e,
        }
    }
}

/// Result alias of the library.
pub type Result<T, E = KnnError> = std::result::Result<T, E>;
