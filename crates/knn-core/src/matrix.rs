//! Row-major f32 matrices: `rows` points of `dim` coordinates, `dim` innermost.

use crate::error::{KnnError, Result};
use rayon::prelude::*;
use std::fmt;
use std::sync::OnceLock;

/// A borrowed row-major matrix, `rows × dim`, validated on construction:
/// `dim ≥ 1`, `data.len() == rows·dim`, every value finite.
///
/// Its values are either a slice, or rows of a [`CentredRoots`] derived from given rows, which
/// are made (once, for the whole matrix) the first time a value is read: an engine that derives
/// them itself (a GPU, from the given rows it uploads anyway) asks [`MatrixRef::centred_roots`]
/// and never makes the host pay for them.
#[derive(Clone, Copy)]
pub struct MatrixRef<'a> {
    src: Src<'a>,
    rows: usize,
    dim: usize,
    /// The largest magnitude of the values, when the finite check of [`MatrixRef::new`] saw
    /// it (the preparation then needs no second pass over them).
    top: Option<f32>,
}

#[derive(Clone, Copy)]
enum Src<'a> {
    Values(&'a [f32]),
    /// Rows `first..first + rows` of the derived matrix.
    Roots(&'a CentredRoots<'a>, usize),
}

impl fmt::Debug for MatrixRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.src {
            Src::Values(_) => "values",
            Src::Roots(..) => "centred roots",
        };
        write!(f, "MatrixRef({} × {}, {kind})", self.rows, self.dim)
    }
}

/// The rows `√x − c` of given rows `x` (square root and difference in f64, then rounded once to
/// f32): Hellinger's engine space, centred. Made on first use, on threads of its own (see
/// [`MatrixRef`]); any row can also be derived alone, with the same bits.
pub struct CentredRoots<'a> {
    given: MatrixRef<'a>,
    centre: Vec<f64>,
    values: OnceLock<Vec<f32>>,
}

impl<'a> CentredRoots<'a> {
    /// The roots of `given` (values ≥ 0, plain values) less `centre` (`given.dim()` values).
    pub fn new(given: MatrixRef<'a>, centre: Vec<f64>) -> Self {
        assert_eq!(centre.len(), given.dim(), "one centre value per column");
        CentredRoots {
            given,
            centre,
            values: OnceLock::new(),
        }
    }

    /// The derived matrix.
    pub fn view(&self) -> MatrixRef<'_> {
        MatrixRef {
            src: Src::Roots(self, 0),
            rows: self.given.rows(),
            dim: self.given.dim(),
            top: None,
        }
    }

    /// The centre subtracted from every row.
    pub fn centre(&self) -> &[f64] {
        &self.centre
    }

    /// The made values, if they were made; they are freed with `self` otherwise.
    pub fn into_values(self) -> Option<Vec<f32>> {
        self.values.into_inner()
    }

    /// One derived value of column `j`: `(√x − c_j)` in f64, rounded to f32.
    #[inline]
    pub fn derive(x: f32, c: f64) -> f32 {
        ((x as f64).sqrt() - c) as f32
    }

    fn derive_row(&self, i: usize, out: &mut [f32]) {
        for ((o, &x), &c) in out.iter_mut().zip(self.given.row(i)).zip(&self.centre) {
            *o = Self::derive(x, c);
        }
    }

    /// All values, made on first use. Threads of its own, not the rayon pool: this may run
    /// inside a rayon task, where a join could take up another task that waits for this very
    /// initialisation.
    fn values(&self) -> &[f32] {
        self.values.get_or_init(|| {
            let (n, d) = (self.given.rows(), self.given.dim());
            let mut out = vec![0.0f32; n * d];
            let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
            let per = n.div_ceil(threads).max(256);
            std::thread::scope(|s| {
                for (t, part) in out.chunks_mut(per * d).enumerate() {
                    s.spawn(move || {
                        for (r, o) in part.chunks_mut(d).enumerate() {
                            self.derive_row(t * per + r, o);
                        }
                    });
                }
            });
            out
        })
    }
}

/// What an engine needs to derive a [`CentredRoots`] matrix (or rows of one) itself.
#[derive(Clone, Copy, Debug)]
pub struct RootsView<'a> {
    /// The given rows behind these rows, one each.
    pub given: MatrixRef<'a>,
    /// Subtracted from every row's square roots.
    pub centre: &'a [f64],
    /// Whether the host already made the values (reading them then costs nothing more).
    pub made: bool,
}

impl<'a> MatrixRef<'a> {
    /// Wraps `data` as `data.len() / dim` rows; `what` names the input in error messages
    /// ("base", "queries", a file name). Rejects NaN/±inf naming row and column.
    pub fn new(what: &str, data: &'a [f32], dim: usize) -> Result<Self> {
        let m = Self::new_unchecked_values(what, data, dim)?;
        let top = m.check_finite(what)?;
        Ok(Self {
            top: Some(top),
            ..m
        })
    }

    /// Like [`MatrixRef::new`] but trusts that every value is finite (already checked:
    /// for data derived from validated inputs).
    pub fn new_unchecked_values(what: &str, data: &'a [f32], dim: usize) -> Result<Self> {
        check_shape(what, data.len(), dim)?;
        Ok(Self {
            src: Src::Values(data),
            rows: data.len() / dim,
            dim,
            top: None,
        })
    }

    /// The largest magnitude of the values, or the error naming the first NaN or infinity.
    fn check_finite(&self, what: &str) -> Result<f32> {
        // A NaN or an infinity has the largest magnitude bits (from 0x7f80_0000); the first
        // bad value in row-major order is reported.
        let data = self.as_slice();
        let top = max_magnitude_bits(data, |b| b);
        if top >= INFINITY_BITS {
            let idx = data
                .par_iter()
                .position_first(|v| !v.is_finite())
                .expect("a value is not finite");
            return Err(KnnError::NonFinite {
                what: what.into(),
                row: idx / self.dim,
                col: idx % self.dim,
                value: data[idx],
            });
        }
        Ok(f32::from_bits(top as u32))
    }

    /// The largest magnitude of the values when it is known without reading them (seen by
    /// the finite check of [`MatrixRef::new`]).
    pub(crate) fn known_top(&self) -> Option<f32> {
        self.top
    }

    /// Number of points.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Coordinates per point.
    pub fn dim(&self) -> usize {
        self.dim
    }
    /// The whole row-major buffer (derived values are made now if they were not).
    pub fn as_slice(&self) -> &'a [f32] {
        match self.src {
            Src::Values(v) => v,
            Src::Roots(r, first) => &r.values()[first * self.dim..(first + self.rows) * self.dim],
        }
    }
    /// The row-major buffer when the rows are values held in memory (not derived ones).
    pub fn values(&self) -> Option<&'a [f32]> {
        match self.src {
            Src::Values(v) => Some(v),
            Src::Roots(..) => None,
        }
    }
    /// Point `i`.
    #[inline]
    pub fn row(&self, i: usize) -> &'a [f32] {
        let d = self.dim;
        match self.src {
            Src::Values(v) => &v[i * d..(i + 1) * d],
            Src::Roots(r, first) => {
                assert!(i < self.rows, "row {i} of {}", self.rows);
                &r.values()[(first + i) * d..(first + i + 1) * d]
            }
        }
    }
    /// Rows `start..end` as a matrix.
    pub fn slice_rows(&self, start: usize, end: usize) -> MatrixRef<'a> {
        assert!(
            start <= end && end <= self.rows,
            "rows {start}..{end} of {}",
            self.rows
        );
        let src = match self.src {
            Src::Values(v) => Src::Values(&v[start * self.dim..end * self.dim]),
            Src::Roots(r, first) => Src::Roots(r, first + start),
        };
        MatrixRef {
            src,
            rows: end - start,
            dim: self.dim,
            top: if end - start == self.rows {
                self.top
            } else {
                None
            },
        }
    }
    /// Appends point `i` to `out`; rows of derived values not made yet are derived alone.
    pub fn extend_with_row(&self, i: usize, out: &mut Vec<f32>) {
        match self.src {
            Src::Roots(r, first) if r.values.get().is_none() => {
                assert!(i < self.rows, "row {i} of {}", self.rows);
                let at = out.len();
                out.resize(at + self.dim, 0.0);
                r.derive_row(first + i, &mut out[at..]);
            }
            _ => out.extend_from_slice(self.row(i)),
        }
    }
    /// When these rows are [`CentredRoots`]: their given rows and centre.
    pub fn centred_roots(&self) -> Option<RootsView<'a>> {
        match self.src {
            Src::Values(_) => None,
            Src::Roots(r, first) => Some(RootsView {
                given: r.given.slice_rows(first, first + self.rows),
                centre: &r.centre,
                made: r.values.get().is_some(),
            }),
        }
    }
    /// The row of `base` at which these rows start when they are a run of `base`'s own rows
    /// (the same memory, or the same derived matrix), without making derived values.
    pub fn row_offset_in(&self, base: &MatrixRef<'_>) -> Option<usize> {
        if self.dim != base.dim {
            return None;
        }
        match (self.src, base.src) {
            (Src::Values(p), Src::Values(b)) => {
                let (b0, p0) = (b.as_ptr() as usize, p.as_ptr() as usize);
                let inside =
                    p0 >= b0 && p0 + std::mem::size_of_val(p) <= b0 + std::mem::size_of_val(b);
                (inside && (p0 - b0) % (4 * self.dim) == 0).then(|| (p0 - b0) / (4 * self.dim))
            }
            (Src::Roots(p, pf), Src::Roots(b, bf)) => {
                (std::ptr::eq(p, b) && pf >= bf && pf + self.rows <= bf + base.rows)
                    .then(|| pf - bf)
            }
            _ => None,
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
            src: Src::Values(&self.data),
            rows: self.data.len() / self.dim,
            dim: self.dim,
            top: None,
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

/// Whether `len` values make whole rows of dimension `dim`: a clear error (naming `what`) for a
/// zero dimension or a ragged last row.
/// The bits of +∞; those of a float's magnitude order like the magnitudes, NaNs above.
pub(crate) const INFINITY_BITS: i32 = 0x7f80_0000;

/// The largest `lane(b)` over the bits `b` of the magnitudes of `values` (as i32: non-negative),
/// 0 for none. In 8 lanes, which the compiler vectorises (one accumulator stays scalar on the
/// x86-64 baseline: 3× slower), and in pieces on the rayon pool from a million values (starting
/// the pool costs about 0.1 ms on a 16-core machine, as much as the scan of a million values).
pub(crate) fn max_magnitude_bits(values: &[f32], lane: impl Fn(i32) -> i32 + Copy + Sync) -> i32 {
    const PIECE: usize = 1 << 20;
    let scan = |c: &[f32]| {
        let bits = |v: &f32| lane((v.to_bits() & 0x7fff_ffff) as i32);
        let mut acc = [0i32; 8];
        let lanes = c.chunks_exact(8);
        let rest = lanes.remainder().iter().map(bits).max().unwrap_or(0);
        for x in lanes {
            for (a, v) in acc.iter_mut().zip(x) {
                *a = (*a).max(bits(v));
            }
        }
        acc.into_iter().fold(rest, i32::max)
    };
    if values.len() <= PIECE {
        scan(values)
    } else {
        values.par_chunks(PIECE).map(scan).max().unwrap_or(0)
    }
}

pub(crate) fn check_shape(what: &str, len: usize, dim: usize) -> Result<()> {
    if dim == 0 {
        return Err(KnnError::ZeroDim { what: what.into() });
    }
    if !len.is_multiple_of(dim) {
        return Err(KnnError::Shape {
            what: what.into(),
            len,
            rows: len / dim + 1,
            dim,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lanes, the remainder and the pieces each find the largest magnitude, and the first
    /// value that is not finite is the one reported, wherever it lies.
    #[test]
    fn magnitude_scans_see_every_value() {
        for len in [0usize, 1, 7, 8, 9, 1000, (1 << 20) + 13] {
            let v: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1013) as f32 - 500.0)
                .collect();
            let want = v.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            assert_eq!(
                max_magnitude_bits(&v, |b| b),
                want.to_bits() as i32,
                "{len}"
            );
            for at in [0, len / 2, len.saturating_sub(1)] {
                if len == 0 {
                    continue;
                }
                let mut w = v.clone();
                w[at] = -9e30;
                let got = max_magnitude_bits(&w, |b| b);
                assert_eq!(f32::from_bits(got as u32), 9e30, "{len} {at}");
                // The checked matrix keeps what its check saw; a part of it does not.
                let m = MatrixRef::new("w", &w, 1).unwrap();
                assert_eq!(m.known_top(), Some(9e30), "{len} {at}");
                assert_eq!(m.slice_rows(0, len).known_top(), Some(9e30));
                assert_eq!(m.slice_rows(0, len - 1).known_top(), None);
                for bad in [f32::NAN, f32::NEG_INFINITY] {
                    let mut x = w.clone();
                    x[at] = bad;
                    if at > 0 {
                        x[at - 1] = f32::INFINITY;
                    }
                    let first = if at > 0 { at - 1 } else { at };
                    match MatrixRef::new("x", &x, 1) {
                        Err(KnnError::NonFinite { row, .. }) => assert_eq!(row, first),
                        other => panic!("{len} {at}: {other:?}"),
                    }
                }
            }
        }
    }

    fn given(n: usize, d: usize) -> Vec<f32> {
        (0..n * d)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.37 + if i % 11 == 0 { 4e6 } else { 0.0 })
            .collect()
    }

    #[test]
    fn centred_roots_rows_are_the_made_ones() {
        let (n, d) = (1031, 13);
        let v = given(n, d);
        let g = MatrixRef::new("g", &v, d).unwrap();
        let centre: Vec<f64> = (0..d).map(|j| 1.5 + j as f64 * 0.25).collect();
        let alone = CentredRoots::new(g, centre.clone());
        let view = alone.view();
        // Rows derived one by one (nothing made) equal the made values, bit for bit.
        let mut rows = Vec::new();
        for i in 0..n {
            view.extend_with_row(i, &mut rows);
        }
        assert!(!view.centred_roots().unwrap().made);
        let made = CentredRoots::new(g, centre.clone());
        let all = made.view().as_slice();
        assert!(made.view().centred_roots().unwrap().made);
        assert_eq!(rows.len(), n * d);
        for (i, (a, b)) in rows.iter().zip(all).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "value {i}");
            let want = ((v[i] as f64).sqrt() - centre[i % d]) as f32;
            assert_eq!(a.to_bits(), want.to_bits(), "value {i}");
        }
        // Slices stay derived and know where they lie.
        let part = view.slice_rows(100, 300);
        assert_eq!(part.row_offset_in(&view), Some(100));
        assert_eq!(part.slice_rows(5, 10).row_offset_in(&view), Some(105));
        assert_eq!(view.row_offset_in(&part), None);
        assert_eq!(part.row_offset_in(&made.view()), None);
        let r = part.centred_roots().unwrap();
        assert_eq!(r.given.rows(), 200);
        assert_eq!(r.given.row(0), g.row(100));
        assert_eq!(part.row(3), made.view().row(103));
        // Plain slices too.
        let plain = g.slice_rows(7, 9);
        assert_eq!(plain.row_offset_in(&g), Some(7));
        assert_eq!(g.row_offset_in(&plain), None);
        assert_eq!(alone.into_values().map(|v| v.len()), Some(n * d));
    }
}
