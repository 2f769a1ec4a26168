//! Turning user data into what engines compute on (the engine space) and what the exact
//! re-rank computes on (the exact space).

use crate::error::{KnnError, Result};
use crate::matrix::{Matrix, MatrixRef};
use crate::metric::{Covariance, Kernel, Metric};
use rayon::prelude::*;

/// Borrowed user data or a transformed copy.
pub enum Data<'a> {
    /// The user's data as is.
    Borrowed(MatrixRef<'a>),
    /// A transformed copy.
    Owned(Matrix),
}

impl Data<'_> {
    /// The matrix.
    pub fn view(&self) -> MatrixRef<'_> {
        match self {
            Data::Borrowed(m) => *m,
            Data::Owned(m) => m.view(),
        }
    }
}

/// Prepared data for one search. Queries are `None` for a self-join (the base is used).
pub struct Prepared<'a> {
    /// Data the exact re-rank sees: the original data, or whitened for Mahalanobis.
    pub exact_base: Data<'a>,
    /// Queries the exact re-rank sees.
    pub exact_queries: Option<Data<'a>>,
    /// Data the engine sees when it differs from the exact space (normalised, square-rooted,
    /// centred, scaled): base, then queries.
    pub engine: Option<(Matrix, Option<Matrix>)>,
    /// Engine keys are exact-space keys times this (a power of two; 1 unless the data was
    /// scaled to keep f32 arithmetic away from overflow and underflow).
    pub key_scale: f64,
}

impl Prepared<'_> {
    /// Base points of the engine space.
    pub fn engine_base(&self) -> MatrixRef<'_> {
        match &self.engine {
            Some((b, _)) => b.view(),
            None => self.exact_base.view(),
        }
    }
    /// Queries of the engine space (the engine base for a self-join).
    pub fn engine_queries(&self) -> MatrixRef<'_> {
        match &self.engine {
            Some((b, q)) => q.as_ref().unwrap_or(b).view(),
            None => self.exact_queries().unwrap_or(self.exact_base.view()),
        }
    }
    /// Queries of the exact space (`None`: self-join).
    pub fn exact_queries(&self) -> Option<MatrixRef<'_>> {
        self.exact_queries.as_ref().map(|q| q.view())
    }
}

fn map_rows(m: MatrixRef<'_>, f: impl Fn(&[f32], &mut [f32]) + Sync) -> Matrix {
    let d = m.dim();
    let mut out = vec![0.0f32; m.rows() * d];
    out.par_chunks_mut(d)
        .zip(m.as_slice().par_chunks(d))
        .for_each(|(o, x)| f(x, o));
    Matrix::from_trusted(out, d)
}

/// Subtracts the base mean from base and queries when the data sits far from the origin
/// relative to its spread: the GEMM form's rounding grows with ‖x‖², so this keeps candidate
/// keys tight for data such as points near 4e6 with small jitter. Returns `None` when the
/// data is already near the origin (no copy made).
fn centre_if_far(
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
) -> Option<(Matrix, Option<Matrix>)> {
    let d = base.dim();
    let n = base.rows() as f64;
    // One pass: sums of the coordinates and of their squares, both taken from the first point
    // (so that data far from the origin loses no digits to the subtraction below).
    let x0: Vec<f64> = base.row(0).iter().map(|&v| v as f64).collect();
    let (s1, s2) = base
        .as_slice()
        .par_chunks(d * 1024)
        .map(|c| {
            let (mut s1, mut s2) = (vec![0.0f64; d], vec![0.0f64; d]);
            for r in c.chunks(d) {
                for j in 0..d {
                    let t = r[j] as f64 - x0[j];
                    s1[j] += t;
                    s2[j] += t * t;
                }
            }
            (s1, s2)
        })
        .reduce(
            || (vec![0.0f64; d], vec![0.0f64; d]),
            |(mut a1, mut a2), (b1, b2)| {
                a1.iter_mut().zip(b1).for_each(|(x, y)| *x += y);
                a2.iter_mut().zip(b2).for_each(|(x, y)| *x += y);
                (a1, a2)
            },
        );
    let mean: Vec<f64> = (0..d).map(|j| x0[j] + s1[j] / n).collect();
    // Mean squared distance to the mean: E[(x − x0)²] − (E[x − x0])².
    let spread: f64 = (0..d)
        .map(|j| (s2[j] / n - (s1[j] / n).powi(2)).max(0.0))
        .sum();
    let mean_sq: f64 = mean.iter().map(|m| m * m).sum();
    if mean_sq <= 16.0 * spread {
        return None;
    }
    let centre = |m: MatrixRef<'_>| {
        map_rows(m, |x, o| {
            for ((o, &v), mu) in o.iter_mut().zip(x).zip(&mean) {
                *o = (v as f64 - mu) as f32;
            }
        })
    };
    Some((centre(base), queries.map(centre)))
}

/// Lower-triangular Cholesky factor of a symmetric positive definite `d × d` matrix (f64).
fn cholesky(c: &[f64], d: usize) -> Result<Vec<f64>> {
    let mut l = vec![0.0f64; d * d];
    for i in 0..d {
        for j in 0..=i {
            let s: f64 = (0..j).map(|p| l[i * d + p] * l[j * d + p]).sum();
            if i == j {
                let v = c[i * d + i] - s;
                if v <= 1e-12 * c[i * d + i].abs().max(1e-300) || !v.is_finite() {
                    return Err(KnnError::Covariance(format!(
                        "the covariance is not positive definite (pivot {i}); a base set with fewer than d+1 points or a constant or repeated column makes it singular"
                    )));
                }
                l[i * d + i] = v.sqrt();
            } else {
                l[i * d + j] = (c[i * d + j] - s) / l[j * d + j];
            }
        }
    }
    Ok(l)
}

/// Unbiased covariance (divisor n − 1) of the rows, f64.
fn covariance(m: MatrixRef<'_>) -> Result<Vec<f64>> {
    let (n, d) = (m.rows(), m.dim());
    if n < 2 {
        return Err(KnnError::Covariance(
            "estimating a covariance needs at least 2 base points".into(),
        ));
    }
    let mut mean = vec![0.0f64; d];
    for r in 0..n {
        for (a, &v) in mean.iter_mut().zip(m.row(r)) {
            *a += v as f64;
        }
    }
    mean.iter_mut().for_each(|v| *v /= n as f64);
    let c = m
        .as_slice()
        .par_chunks(d * 64)
        .map(|chunk| {
            let mut c = vec![0.0f64; d * d];
            let mut x = vec![0.0f64; d];
            for r in chunk.chunks(d) {
                for ((xi, &v), mu) in x.iter_mut().zip(r).zip(&mean) {
                    *xi = v as f64 - mu;
                }
                for i in 0..d {
                    for j in 0..=i {
                        c[i * d + j] += x[i] * x[j];
                    }
                }
            }
            c
        })
        .reduce(
            || vec![0.0f64; d * d],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let mut c = c;
    for i in 0..d {
        for j in 0..=i {
            let v = c[i * d + j] / (n as f64 - 1.0);
            c[i * d + j] = v;
            c[j * d + i] = v;
        }
    }
    Ok(c)
}

/// The whitening map `x ↦ L⁻¹ x` with `Σ = L Lᵀ`, so that ‖L⁻¹(x − y)‖² is the squared
/// Mahalanobis distance.
pub fn whitener(
    cov: &Covariance,
    base: MatrixRef<'_>,
) -> Result<impl Fn(&[f32], &mut [f32]) + Sync> {
    let d = base.dim();
    let c = match cov {
        Covariance::FromBase => covariance(base)?,
        Covariance::Given(m) => {
            let v: Vec<f64> = m.view().as_slice().iter().map(|&x| x as f64).collect();
            for i in 0..d {
                for j in 0..i {
                    let (a, b) = (v[i * d + j], v[j * d + i]);
                    if (a - b).abs() > 1e-6 * a.abs().max(b.abs()).max(1e-30) {
                        return Err(KnnError::Covariance(format!(
                            "the covariance is not symmetric: ({i},{j}) = {a} but ({j},{i}) = {b}"
                        )));
                    }
                }
            }
            v
        }
    };
    let l = cholesky(&c, d)?;
    Ok(move |x: &[f32], o: &mut [f32]| {
        // Forward substitution L y = x, in f64.
        let mut y = vec![0.0f64; d];
        for i in 0..d {
            let s: f64 = (0..i).map(|p| l[i * d + p] * y[p]).sum();
            y[i] = (x[i] as f64 - s) / l[i * d + i];
        }
        for (o, v) in o.iter_mut().zip(y) {
            *o = v as f32;
        }
    })
}

/// Prepares base and (optional) queries for `metric`. Domain checks happen before this.
pub fn prepare<'a>(
    metric: &Metric,
    base: MatrixRef<'a>,
    queries: Option<MatrixRef<'a>>,
) -> Result<Prepared<'a>> {
    let borrowed = |m: MatrixRef<'a>| Data::Borrowed(m);
    // Exact space: the original data, except whitened data for Mahalanobis.
    let (exact_base, exact_queries) = match metric {
        Metric::Mahalanobis(cov) => {
            let w = whitener(cov, base)?;
            (
                Data::Owned(map_rows(base, &w)),
                queries.map(|q| Data::Owned(map_rows(q, &w))),
            )
        }
        _ => (borrowed(base), queries.map(borrowed)),
    };
    // Engine space: normalised or square-rooted copies where the metric needs them, then
    // centred when far from the origin (SqL2 kernel only: translation changes nothing there).
    let mut engine: Option<(Matrix, Option<Matrix>)> = match metric {
        Metric::Cosine => {
            let norm = |x: &[f32], o: &mut [f32]| {
                let n = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = (v as f64 / n) as f32;
                }
            };
            Some((map_rows(base, norm), queries.map(|q| map_rows(q, norm))))
        }
        Metric::Hellinger => {
            let root = |x: &[f32], o: &mut [f32]| {
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = v.sqrt();
                }
            };
            Some((map_rows(base, root), queries.map(|q| map_rows(q, root))))
        }
        _ => None,
    };
    if metric.kernel() == Kernel::SqL2 {
        let centred = match &engine {
            Some((b, q)) => centre_if_far(b.view(), q.as_ref().map(|q| q.view())),
            None => centre_if_far(exact_base.view(), exact_queries.as_ref().map(|q| q.view())),
        };
        if centred.is_some() {
            engine = centred;
        }
    }
    // Scale by a power of two (exact) when squares or sums could overflow or underflow f32.
    let (eb, eq) = match &engine {
        Some((b, q)) => (b.view(), q.as_ref().map(|q| q.view())),
        None => (exact_base.view(), exact_queries.as_ref().map(|q| q.view())),
    };
    // Largest magnitude, compared as bits (those of non-negative floats order like them; NaN
    // ignored), block by block: this vectorises, where a per-element parallel fold costs more
    // than the rest of the preparation.
    let max_abs = |m: MatrixRef<'_>| {
        let bits = m
            .as_slice()
            .par_chunks(1 << 16)
            .map(|c| {
                c.iter().fold(0u32, |a, v| {
                    let b = v.to_bits() & 0x7fff_ffff;
                    a.max(if b > 0x7f80_0000 { 0 } else { b })
                })
            })
            .max()
            .unwrap_or(0);
        f32::from_bits(bits)
    };
    let top = max_abs(eb).max(eq.map_or(0.0, max_abs));
    let mut key_scale = 1.0;
    if top > 0.0 && !(2f32.powi(-40)..=2f32.powi(40)).contains(&top) {
        let e = -(top.log2().round() as i32);
        let s = 2f64.powi(e);
        let scale = |m: MatrixRef<'_>| {
            map_rows(m, |x, o| {
                o.iter_mut()
                    .zip(x)
                    .for_each(|(o, &v)| *o = (v as f64 * s) as f32)
            })
        };
        engine = Some((scale(eb), eq.map(scale)));
        key_scale = match metric.kernel() {
            Kernel::SqL2 | Kernel::NegDot => s * s,
            Kernel::L1 | Kernel::Linf => s,
        };
    }
    Ok(Prepared {
        exact_base,
        exact_queries,
        engine,
        key_scale,
    })
}
