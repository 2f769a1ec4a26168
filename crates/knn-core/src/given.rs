//! Values given in f64. Engines compute on their f32 rounding; the exact re-rank computes on
//! the values as given; and every floor an engine proves for the rounded rows is lowered by the
//! most that the rounding can move a key, so that it bounds the given rows' keys.
//!
//! With `y = fl32(x)`, each coordinate moves by at most `aᵢ = u|xᵢ| + η` (`u = 2⁻²⁴`, round to
//! nearest; `η = 2⁻¹⁵⁰` below f32's normal range). Per metric, for a query row `q` and any base
//! row `b`, with `e = u‖x‖ + η√d` bounding `‖y − x‖`:
//! - squared L2 (and L2): `‖x_q − x_b‖ ≥ ‖y_q − y_b‖ − e_q − e_b` (triangle inequality), so a
//!   floor `F` of the rounded keys gives `(max(0, √F − e_q − max e_b))²`;
//! - Hellinger: the same in the space of square roots, where `|√yᵢ − √xᵢ| ≤ (u/2)√xᵢ + √η`;
//! - inner product: `|y_q·y_b − x_q·x_b| ≤ e_q‖x_b‖ + ‖x_q‖e_b + e_q e_b`;
//! - cosine: each row turns by an angle of at most `asin(e/‖x‖) ≤ (π/2)·e/‖x‖`, and the cosine
//!   of the angle between two rows moves by at most the sum of their turns;
//! - L1: `Σ (a_qᵢ + a_bᵢ) = u(‖x_q‖₁ + ‖x_b‖₁) + 2dη`; L∞: `u(max|x_q| + max|x_b|) + 2η`.
//!
//! Rows given in f32 are their own rounding: their terms are 0.

use crate::error::{KnnError, Result};
use crate::metric::Metric;
use rayon::prelude::*;

/// A value type rows may be given in: f32 (what engines compute on) or f64.
pub trait Real: Copy + Send + Sync + PartialEq + 'static {
    /// Relative error of rounding a value of this type to f32 (0 for f32 itself).
    const UNIT: f64;
    /// Absolute error of that rounding below f32's normal range (0 for f32 itself).
    const TINY: f64;
    /// The value in f64 (exact).
    fn get(self) -> f64;
    /// The values as f32, when they are f32.
    fn as_f32(v: &[Self]) -> Option<&[f32]>;
}

impl Real for f32 {
    const UNIT: f64 = 0.0;
    const TINY: f64 = 0.0;
    #[inline(always)]
    fn get(self) -> f64 {
        self as f64
    }
    fn as_f32(v: &[f32]) -> Option<&[f32]> {
        Some(v)
    }
}

impl Real for f64 {
    const UNIT: f64 = 1.0 / (1u64 << 24) as f64;
    // 2⁻¹⁵⁰: half the smallest f32 subnormal.
    const TINY: f64 = f64::from_bits(((1023 - 150) as u64) << 52);
    #[inline(always)]
    fn get(self) -> f64 {
        self
    }
    fn as_f32(_: &[f64]) -> Option<&[f32]> {
        None
    }
}

/// Row-major rows as the caller gave them, in f32 or f64.
#[derive(Clone, Copy, Debug)]
pub enum Given<'a> {
    /// f32 values (engines compute on these themselves).
    F32(&'a [f32]),
    /// f64 values (engines compute on their f32 rounding).
    F64(&'a [f64]),
}

impl Given<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Given::F32(v) => v.len(),
            Given::F64(v) => v.len(),
        }
    }

    /// `true` when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `true` for f64 values.
    pub fn is_f64(&self) -> bool {
        matches!(self, Given::F64(_))
    }
}

/// The f32 rounding of f64 rows of dimension `dim` (`what` names them in errors): the rows
/// engines compute on. NaN and ±inf are refused as [`crate::MatrixRef::new`] refuses them, and
/// so are finite values beyond f32's range, which have no f32 rounding.
pub fn round_to_f32(what: &str, data: &[f64], dim: usize) -> Result<Vec<f32>> {
    crate::matrix::check_shape(what, data.len(), dim)?;
    let out: Vec<f32> = data.par_iter().map(|&v| v as f32).collect();
    // A value out of range rounds to ±inf, as NaN stays NaN: one scan of the rounding finds both.
    if let Some(i) = out.par_iter().position_first(|v| !v.is_finite()) {
        let (row, col, value) = (i / dim, i % dim, data[i]);
        return Err(if value.is_finite() {
            KnnError::Option(format!(
                "{what}: row {row}, column {col} is {value:e}, beyond the float32 range (±3.4e38) \
                 the engines compute in; scale the data down"
            ))
        } else {
            KnnError::NonFinite {
                what: what.into(),
                row,
                col,
                value: value as f32,
            }
        });
    }
    Ok(out)
}

/// What the f32 rounding of one row can move its keys: the row's size in the metric's own
/// terms (`‖x‖`, `‖x‖₁`, `max|xᵢ|`, or `‖√x‖` for Hellinger) and the rounding's bound in the
/// same terms (see the module's formulas).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RowRounding {
    size: f64,
    err: f64,
}

impl RowRounding {
    /// The bound for `row` (`d` values of type `T`) under `metric`.
    pub fn of<T: Real>(metric: &Metric, row: &[T]) -> Self {
        let d = row.len() as f64;
        let (u, eta) = (T::UNIT, T::TINY);
        if u == 0.0 && eta == 0.0 {
            return Self::default();
        }
        let norm = || row.iter().map(|v| v.get() * v.get()).sum::<f64>().sqrt();
        let (size, err) = match metric {
            Metric::L1 => {
                let s: f64 = row.iter().map(|v| v.get().abs()).sum();
                (s, u * s + d * eta)
            }
            Metric::Linf => {
                let s = row.iter().fold(0.0f64, |m, v| m.max(v.get().abs()));
                (s, u * s + eta)
            }
            Metric::Hellinger => {
                let s = row.iter().map(|v| v.get().max(0.0)).sum::<f64>().sqrt();
                (s, 0.5 * u * s + (d * eta).sqrt())
            }
            _ => {
                let s = norm();
                (s, u * s + d.sqrt() * eta)
            }
        };
        // Rounded up a little, so that the bound survives its own f64 arithmetic.
        RowRounding {
            size,
            err: err * (1.0 + 1e-9),
        }
    }

    /// The larger size and the larger error of the two (a bound over several rows).
    pub fn max(self, o: Self) -> Self {
        RowRounding {
            size: self.size.max(o.size),
            err: self.err.max(o.err),
        }
    }

    /// The largest bound over the rows of `data` (dimension `dim`).
    pub fn of_rows<T: Real>(metric: &Metric, data: &[T], dim: usize) -> Self {
        if T::UNIT == 0.0 && T::TINY == 0.0 {
            return Self::default();
        }
        data.par_chunks(dim)
            .map(|r| Self::of(metric, r))
            .reduce(Self::default, Self::max)
    }

    /// `true` when the rows were given in f32 (nothing rounded).
    pub fn is_zero(&self) -> bool {
        self.err == 0.0
    }
}

/// A lower bound of the key (in the metric's exact terms, see [`Metric::exact_key`]) between
/// the given query whose rounding is `q` and any base row whose roundings are at most `b`,
/// when `floor` bounds the key between their f32 roundings from below.
pub fn lower_floor(metric: &Metric, floor: f64, q: RowRounding, b: RowRounding) -> f64 {
    if q.is_zero() && b.is_zero() {
        return floor;
    }
    let slack = match metric {
        Metric::SqL2 | Metric::L2 | Metric::Hellinger => {
            let root = floor.max(0.0).sqrt() - (q.err + b.err);
            return if floor <= 0.0 || root <= 0.0 {
                floor.min(0.0)
            } else {
                root * root * (1.0 - 1e-12)
            };
        }
        Metric::InnerProduct => q.err * b.size + q.size * b.err + q.err * b.err,
        Metric::Cosine => {
            let turn = |r: RowRounding| {
                if r.size == 0.0 {
                    0.0
                } else {
                    std::f64::consts::FRAC_PI_2 * r.err / r.size
                }
            };
            (turn(q) + turn(b)).min(2.0)
        }
        Metric::L1 | Metric::Linf => q.err + b.err,
        // Refused for f64 rows before any work (see `check_given`).
        Metric::Mahalanobis(_) | Metric::Expr(_) => f64::INFINITY,
    };
    floor - slack * (1.0 + 1e-9) - floor.abs() * 1e-12
}

/// Refuses metrics whose exact space is not the given values for f64 rows: Mahalanobis (its
/// exact space is the whitened rows) and expressions (their programs take f32 values).
pub fn check_given(metric: &Metric, f64_rows: bool) -> Result<()> {
    if !f64_rows {
        return Ok(());
    }
    match metric {
        Metric::Mahalanobis(_) | Metric::Expr(_) => Err(KnnError::Option(format!(
            "the {} metric takes float32 values; exactness for float64 values is proven for the \
             other metrics only: convert the data to float32 (its rounding then is the data)",
            metric.name()
        ))),
        _ => Ok(()),
    }
}

/// Checks rows given in f64 against the metric's domain on their own values (Hellinger:
/// ≥ 0), as [`Metric::check_domain`] checks f32 rows: a value such as −1e-50 rounds to −0 in
/// f32 and would pass there.
pub fn check_given_domain(metric: &Metric, what: &str, data: &[f64], dim: usize) -> Result<()> {
    if *metric != Metric::Hellinger || dim == 0 {
        return Ok(());
    }
    match data.par_iter().position_first(|&v| v < 0.0) {
        Some(i) => Err(KnnError::Negative {
            what: what.into(),
            row: i / dim,
            col: i % dim,
            value: data[i],
        }),
        None => Ok(()),
    }
}

/// The rows as given, for a pipeline run whose base or queries came in f64: the exact re-rank
/// reads these, and lowers every floor by their rounding (see the module's formulas).
#[derive(Clone, Copy, Debug)]
pub struct GivenRows<'a> {
    /// Base rows as given.
    pub base: Given<'a>,
    /// Query rows as given; `None` for a self-join (the base rows).
    pub queries: Option<Given<'a>>,
    /// Values per row.
    pub dim: usize,
    /// The largest rounding of a base row ([`RowRounding::of_rows`]).
    pub base_rounding: RowRounding,
}

impl GivenRows<'_> {
    /// The given rounding of query `qi`.
    pub fn query_rounding(&self, metric: &Metric, qi: usize) -> RowRounding {
        let (d, at) = (self.dim, qi * self.dim);
        match self.queries.unwrap_or(self.base) {
            Given::F32(_) => RowRounding::default(),
            Given::F64(q) => RowRounding::of(metric, &q[at..at + d]),
        }
    }

    /// `f(query qi, base)` on the rows in their own types.
    pub fn with_rows<R>(&self, qi: usize, f: impl RowsFn<R>) -> R {
        self.with_query_rows(qi..qi + 1, f)
    }

    /// `f(queries rows, base)` on the rows in their own types: the query rows one after
    /// another, `dim` values each.
    pub fn with_query_rows<R>(&self, rows: std::ops::Range<usize>, f: impl RowsFn<R>) -> R {
        let (d, at) = (self.dim, rows.start * self.dim..rows.end * self.dim);
        match (self.queries.unwrap_or(self.base), self.base) {
            (Given::F32(q), Given::F32(b)) => f.call(&q[at], b, d),
            (Given::F32(q), Given::F64(b)) => f.call(&q[at], b, d),
            (Given::F64(q), Given::F32(b)) => f.call(&q[at], b, d),
            (Given::F64(q), Given::F64(b)) => f.call(&q[at], b, d),
        }
    }
}

/// A computation on query rows and the base rows (`dim` values each), generic over the types
/// they were given in (see [`GivenRows::with_rows`]).
pub trait RowsFn<R> {
    /// Runs on query `q` and base `base`.
    fn call<A: Real, B: Real>(self, q: &[A], base: &[B], dim: usize) -> R;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::Metric;

    /// Small deterministic generator (xorshift), values in [0, 1).
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    }

    /// The tightest floor of the rounded rows' key, lowered, bounds the given rows' key: for
    /// every metric that takes f64 rows, on rows near the origin, far from it, tiny (below
    /// f32's normal range) and of mixed sign.
    #[test]
    fn lowered_floors_bound_the_given_keys() {
        let d = 9;
        let metrics = Metric::PLAIN;
        type Shape = (&'static str, fn(f64) -> f64);
        let shapes: [Shape; 4] = [
            ("unit", |v| v),
            ("far", |v| 1.0e4 + v * 1e-6),
            ("tiny", |v| v * 1e-41),
            ("signed", |v| (v - 0.5) * 3.0),
        ];
        for metric in &metrics {
            for (name, shape) in shapes {
                if name == "signed" && *metric == Metric::Hellinger {
                    continue; // its domain: values ≥ 0
                }
                for seed in 0..200u64 {
                    let x: Vec<f64> = values(2 * d, seed).into_iter().map(shape).collect();
                    let (xq, xb) = x.split_at(d);
                    let y: Vec<f64> = x.iter().map(|&v| v as f32 as f64).collect();
                    let (yq, yb) = y.split_at(d);
                    let floor = metric.exact_key(yq, yb);
                    let lowered = lower_floor(
                        metric,
                        floor,
                        RowRounding::of(metric, xq),
                        RowRounding::of(metric, xb),
                    );
                    let truth = metric.exact_key(xq, xb);
                    assert!(
                        lowered <= truth,
                        "{} on {name} (seed {seed}): lowered floor {lowered:e} above the key {truth:e}",
                        metric.name()
                    );
                }
            }
        }
    }

    /// Rows given in f32 are their own rounding: floors stay as they are.
    #[test]
    fn f32_rows_keep_their_floors() {
        let r = RowRounding::of(&Metric::L2, &[1.0f32, 2.0]);
        assert!(r.is_zero());
        assert_eq!(lower_floor(&Metric::L2, 3.5, r, r), 3.5);
    }

    #[test]
    fn rounding_errors_name_row_and_column() {
        let err = round_to_f32("base", &[1.0, 2.0, f64::NAN, 4.0], 2).unwrap_err();
        assert!(err.to_string().contains("row 1, column 0"), "{err}");
        let err = round_to_f32("base", &[1.0, -1e39], 2).unwrap_err();
        assert!(
            err.to_string().contains("row 0, column 1 is -1e39"),
            "{err}"
        );
        let err = round_to_f32("queries", &[1.0, 2.0, 3.0], 2).unwrap_err();
        assert!(err.to_string().contains("queries"), "{err}");
        assert!(round_to_f32("base", &[1.0], 0).is_err());
        assert_eq!(
            round_to_f32("base", &[0.1, 2.0], 2).unwrap(),
            vec![0.1f32, 2.0]
        );
    }

    #[test]
    fn mahalanobis_and_expressions_refuse_f64() {
        let m = Metric::Mahalanobis(crate::metric::Covariance::FromBase);
        assert!(check_given(&m, true).is_err());
        assert!(check_given(&m, false).is_ok());
        assert!(check_given(&Metric::L1, true).is_ok());
    }
}
