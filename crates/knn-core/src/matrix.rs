//! Row-major f32 matrices: `rows` points of `dim` coordinates, `dim` innermost.

use crate::error::{KnnError, Result};
use rayon::prelude::*;

/// A borrowed row-major matrix, `rows × dim`, validated on construction:
/// `dim ≥ 1`, `data.len() == rows·dim`, every value finite.
#[derive(Clone, Copy, Debug)]
pub struct MatrixRef<'a> {
    data: &'a [f32],
    rows: usize,
    dim: usize,
}

impl<'a> MatrixRef<'a> {
    /// Wraps `data` as `data.len() / dim` rows; `what` names the input in error messages
    /// ("base", "queries", a file name). Rejects NaN/±inf naming row and column.
    pub fn new(what: &str, data: &'a [f32], dim: usize) -> Result<Self> {
        let m = Self::new_unchecked_values(what, data, dim)?;
        m.check_finite(what)?;
        Ok(m)
    }

    /// Like [`MatrixRef::new`] but trusts that every value is finite (already checked:
    /// for data derived from validated inputs).
    pub fn new_unchecked_values(what: &str, data: &'a [f32], dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(KnnError::ZeroDim { what: what.into() });
        }
        if !data.len().is_multiple_of(dim) {
            return Err(KnnError::Shape {
                what: what.into(),
                len: data.len(),
                rows: data.len() / dim + 1,
                dim,
            });
        }
        Ok(Self {
            data,
            rows: data.len() / dim,
            dim,
        })
    }

    fn check_finite(&self, what: &str) -> Result<()> {
        // Parallel scan for big inputs; the first bad value in row-major order is reported.
        let bad = self
            .data
            .par_chunks(self.dim * 1024)
            .enumerate()
            .find_first(|(_, c)| c.iter().any(|v| !v.is_finite()));
        if let Some((chunk, c)) = bad {
            let off = c.iter().position(|v| !v.is_finite()).unwrap();
            let idx = chunk * self.dim * 1024 + off;
            return Err(KnnError::NonFinite {
                what: what.into(),
                row: idx / self.dim,
                col: idx % self.dim,
                value: self.data[idx],
            });
        }
        Ok(())
    }

    /// Number of points.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Coordinates per point.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The whole row-major buffer.
    pub fn as_slice(&self) -> &'a [f32] {
        self.data
    }
    /// Point `i`.
    #[inline]
    pub fn row(&self, i: usize) -> &'a [f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
    /// Rows `start..end` as a matrix.
    pub fn slice_rows(&self, start: usize, end: usize) -> MatrixRef<'a> {
        MatrixRef {
            data: &self.data[start * self.dim..end * self.dim],
            rows: end - start,
            dim: self.dim,
        }
    }
}

/// An owned row-major matrix (same layout and contract as [`MatrixRef`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    data: Vec<f32>,
    dim: usize,
}

impl Matrix {
    /// Takes ownership of `data` (`rows·dim` values), validated like [`MatrixRef::new`].
    pub fn new(what: &str, data: Vec<f32>, dim: usize) -> Result<Self> {
        MatrixRef::new(what, &data, dim)?;
        Ok(Self { data, dim })
    }
    /// Wraps values already known to be finite (derived from validated data).
    pub(crate) fn from_trusted(data: Vec<f32>, dim: usize) -> Self {
        debug_assert!(dim > 0 && data.len().is_multiple_of(dim));
        Self { data, dim }
    }
    /// Borrowed view.
    pub fn view(&self) -> MatrixRef<'_> {
        MatrixRef {
            data: &self.data,
            rows: self.data.len() / self.dim,
            dim: self.dim,
        }
    }
    /// Number of points.
    pub fn rows(&self) -> usize {
        self.data.len() / self.dim
    }
    /// Coordinates per point.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The row-major values.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }
}
