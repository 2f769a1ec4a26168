//! Separate files: labelled points, their labels and points to classify in any format of
//! `knn_io` (npy, CSV, fvecs/ivecs/bvecs); predicted labels and probabilities written back.

use crate::error::{ClassifyError, Result};
use knn::Matrix;
use knn_io::{Format, Table};
use std::path::Path;

/// Reads a matrix of points, validated: at least one row, every value finite (else an error
/// naming the file, row and column).
pub fn read_points(path: &Path, format: Option<Format>) -> Result<Matrix> {
    let t = knn_io::read_f32(path, format)?;
    let name = path.display().to_string();
    if t.rows == 0 {
        return Err(ClassifyError::Labels(format!(
            "{name}: no points in the file"
        )));
    }
    Ok(Matrix::new(&name, t.data, t.cols)?)
}

/// Reads `rows` integer labels: a column (`rows × 1`) or a single row (`1 × rows`) of an npy,
/// CSV, ivecs or bvecs file.
pub fn read_labels(path: &Path, format: Option<Format>, rows: usize) -> Result<Vec<i64>> {
    let t = knn_io::read_i64(path, format)?;
    if t.data.len() == rows && (t.cols == 1 || t.rows == 1) {
        return Ok(t.data);
    }
    Err(ClassifyError::Labels(format!(
        "{}: expected {rows} labels (one column or one row), found a table of {} x {}",
        path.display(),
        t.rows,
        t.cols
    )))
}

/// Writes one label per row (`n × 1`: npy int64, CSV, ivecs), atomically.
pub fn write_labels(path: &Path, format: Option<Format>, labels: &[i64]) -> Result<()> {
    let t = Table {
        data: labels.to_vec(),
        rows: labels.len(),
        cols: 1,
    };
    Ok(knn_io::write_i64(path, format, &t)?)
}

/// Writes `rows × classes` probabilities (as f32: npy float32, CSV, fvecs), atomically.
pub fn write_proba(
    path: &Path,
    format: Option<Format>,
    classes: usize,
    proba: &[f64],
) -> Result<()> {
    let t = Table {
        data: proba.iter().map(|&p| p as f32).collect(),
        rows: proba.len() / classes.max(1),
        cols: classes,
    };
    Ok(knn_io::write_f32(path, format, &t)?)
}
