//! The crate's error type: every variant says what is wrong and where.

use knn::KnnError;
use knn_io::IoError;

/// Errors of classification. Bad input always ends here, never in a panic.
#[derive(Debug, thiserror::Error)]
pub enum ClassifyError {
    /// The search engine refused the input (k, dimensions, non-finite values, device).
    #[error(transparent)]
    Knn(#[from] KnnError),
    /// A points or labels file could not be read or written.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A seed-003 CSV file is malformed; `line` and `column` count from 1, as editors do.
    #[error("{file}: line {line}, column {column}: {message}")]
    Csv {
        /// The file (or the name given for in-memory bytes).
        file: String,
        /// Line, from 1.
        line: usize,
        /// Column (cell), from 1.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A seed-003 CSV file whose rows disagree with its header as a whole.
    #[error("{file}: {message}")]
    CsvShape {
        /// The file.
        file: String,
        /// What disagrees.
        message: String,
    },
    /// Labels that do not fit the points (count, class set).
    #[error("labels: {0}")]
    Labels(String),
    /// `predict` before `fit`.
    #[error("the classifier has not been fitted: call fit() with labelled points first")]
    NotFitted,
    /// An option that cannot work with the others (distance weights with a similarity, ...).
    #[error("invalid option: {0}")]
    Option(String),
    /// Reading or writing a file failed.
    #[error("{file}: {error}")]
    File {
        /// The file.
        file: String,
        /// What the system said.
        error: std::io::Error,
    },
}

/// Result alias of the crate.
pub type Result<T, E = ClassifyError> = std::result::Result<T, E>;
