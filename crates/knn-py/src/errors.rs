//! Library errors as Python exceptions, with the library's messages.

use knn::KnnError;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

/// `ValueError` for anything about the input or the options, `RuntimeError` for a device
/// failure, `MemoryError` when even the smallest tiles did not fit.
pub fn to_py(e: KnnError) -> PyErr {
    let msg = e.to_string();
    match e {
        KnnError::Device(_) => PyRuntimeError::new_err(msg),
        KnnError::OutOfMemory { .. } => PyMemoryError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// An error of the piece of queries that starts at row `start`, with rows numbered in the
/// whole query set.
pub fn shift_rows(e: KnnError, start: usize) -> KnnError {
    e.renumber_query_rows(|r| r + start)
}
