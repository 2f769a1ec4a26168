//! Distance functions: what users ask for ([`Metric`]) and what engines compute ([`Kernel`]).
//!
//! Every metric is reduced to one of four kernels on *prepared* data (normalised, square-rooted
//! or whitened as the metric needs), where a smaller kernel key is always a better neighbour.
//! The reported distance is a monotone function of the kernel key ([`Metric::distance_from_key`]).

use crate::error::{KnnError, Result};
use crate::expr::MetricExpr;
use crate::given::Real;
use crate::matrix::{Matrix, MatrixRef};
use rayon::prelude::*;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A distance (or similarity) between two points `x`, `y` of dimension `d`.
#[derive(Clone, Debug, PartialEq)]
pub enum Metric {
    /// Squared Euclidean: `Σ (xᵢ − yᵢ)²`.
    SqL2,
    /// Euclidean: `√Σ (xᵢ − yᵢ)²`.
    L2,
    /// Inner product `Σ xᵢ yᵢ`, a similarity: the **largest** come first; reported as is.
    InnerProduct,
    /// Cosine distance `1 − x·y / (‖x‖ ‖y‖)`, in `[0, 2]`; 1 between an all-zero row and any
    /// row, itself included (scikit-learn's convention).
    Cosine,
    /// Manhattan: `Σ |xᵢ − yᵢ|`.
    L1,
    /// Chebyshev: `maxᵢ |xᵢ − yᵢ|`.
    Linf,
    /// Hellinger, for non-negative inputs: `√(½ Σ (√xᵢ − √yᵢ)²)`.
    Hellinger,
    /// Mahalanobis: `√((x − y)ᵀ Σ⁻¹ (x − y))` for a covariance `Σ`, given or estimated from the
    /// base set (unbiased, divisor n − 1).
    Mahalanobis(Covariance),
    /// User-defined: a per-coordinate accumulation with an optional final step
    /// ([`MetricExpr`], e.g. `acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)`). Engines compute
    /// it through [`crate::Engine::candidates_expr`] on the features of
    /// [`crate::prepare::Prepared::expr`]; it has no [`Kernel`] of its own.
    Expr(Arc<MetricExpr>),
}

/// Where the Mahalanobis covariance comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Covariance {
    /// Estimated from the base points.
    FromBase,
    /// Given, `d × d`, row-major, symmetric positive definite.
    Given(Arc<Matrix>),
}

/// What an engine computes on prepared data; smaller keys are better neighbours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `Σ (xᵢ − yᵢ)²`, usually through the GEMM form `‖x‖² + ‖y‖² − 2 x·y`.
    SqL2,
    /// `−Σ xᵢ yᵢ` (negated so that smaller is better), through GEMM.
    NegDot,
    /// `Σ |xᵢ − yᵢ|`, a direct kernel.
    L1,
    /// `maxᵢ |xᵢ − yᵢ|`, a direct kernel.
    Linf,
}

impl Kernel {
    /// `true` when the kernel is computed as a matrix product (GEMM form).
    pub fn is_gemm(self) -> bool {
        matches!(self, Kernel::SqL2 | Kernel::NegDot)
    }

    /// Rounding bound: `|computed − exact| ≤ bound` for every pair whose computed key is at most
    /// `worst_key`, where `qn = ‖q‖`, `bn_max = max ‖b‖` over the base (norms of the data the
    /// engine saw), `d` the dimension, `u` the unit roundoff of the accumulation (2⁻²⁴ for f32)
    /// and `u_in` that of a rounding applied to the inputs of the products (2⁻⁸ for bf16,
    /// 2⁻¹¹ for tf32, 0 when the products take the f32 values themselves).
    ///
    /// With rounded inputs `x̂ = x(1+ε)`, `|ε| ≤ u_in`, each product is off by at most
    /// `(2u_in + u_in²)|xᵢyᵢ|`, so `|x̂·ŷ − x·y| ≤ (2u_in + u_in²)‖x‖‖y‖`; accumulation adds
    /// `γ ‖x‖‖y‖` with `γ = (d+8)·u / (1 − (d+8)·u)` for any summation order, and the slack of the
    /// `+8` covers norms, the final additions and the preparation step (centring, normalising).
    pub fn error_bound(
        self,
        d: usize,
        qn: f32,
        bn_max: f32,
        worst_key: f32,
        u: f64,
        u_in: f64,
    ) -> f32 {
        self.error_bounds(d, u, u_in).of(qn, bn_max, worst_key)
    }

    /// [`Kernel::error_bound`] for many rows of the same `d`, `u` and `u_in`: the terms they
    /// share computed once (a floor per row costs a few operations instead of three divisions).
    pub fn error_bounds(self, d: usize, u: f64, u_in: f64) -> ErrorBounds {
        let n = (d + 8) as f64 * u;
        let gamma = n / (1.0 - n);
        ErrorBounds {
            kernel: self,
            gamma,
            input: (2.0 * u_in + u_in * u_in) * (1.0 + gamma),
        }
    }
}

/// The rounding bounds of one kernel, dimension and pair of units ([`Kernel::error_bounds`]).
#[derive(Clone, Copy, Debug)]
pub struct ErrorBounds {
    kernel: Kernel,
    gamma: f64,
    input: f64,
}

impl ErrorBounds {
    /// [`Kernel::error_bound`] of a pair with norms `qn`, at most `bn_max`, and computed key
    /// at most `worst_key`.
    #[inline]
    pub fn of(&self, qn: f32, bn_max: f32, worst_key: f32) -> f32 {
        let (gamma, input) = (self.gamma, self.input);
        let (qn, bn) = (qn as f64, bn_max as f64);
        let b = match self.kernel {
            Kernel::SqL2 => 2.0 * input * qn * bn + gamma * (qn + bn) * (qn + bn),
            Kernel::NegDot => (input + gamma) * qn * bn,
            Kernel::L1 | Kernel::Linf => gamma * (worst_key.abs() as f64),
        };
        // Round the bound itself up a little so it stays a bound once stored in f32.
        (b * (1.0 + 1e-6) + f64::from(f32::MIN_POSITIVE)) as f32
    }

    /// The two constants of [`ErrorBounds::of`], `(γ, input)`, for device kernels that
    /// evaluate it themselves (`prove_rows` in knn-cuda's `common.cuh`).
    pub fn constants(&self) -> (f64, f64) {
        (self.gamma, self.input)
    }
}

impl Kernel {
    /// The kernel key of `x`, `y` in f64 (exact up to f64 rounding). Eight independent
    /// accumulators let the compiler vectorise it.
    pub fn exact<A: Real, B: Real>(self, x: &[A], y: &[B]) -> f64 {
        #[inline(always)]
        fn fold8<A: Real, B: Real>(
            x: &[A],
            y: &[B],
            f: impl Fn(f64, f64) -> f64,
            g: impl Fn(f64, f64) -> f64,
        ) -> f64 {
            let mut acc = [0.0f64; 8];
            let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
            let (xr, yr) = (xc.remainder(), yc.remainder());
            for (a, b) in xc.zip(yc) {
                for l in 0..8 {
                    acc[l] = g(acc[l], f(a[l].get(), b[l].get()));
                }
            }
            let mut s = acc.into_iter().fold(0.0, &g);
            for (&a, &b) in xr.iter().zip(yr) {
                s = g(s, f(a.get(), b.get()));
            }
            s
        }
        let add = |a: f64, b: f64| a + b;
        match self {
            Kernel::SqL2 => fold8(x, y, |a, b| (a - b) * (a - b), add),
            Kernel::NegDot => -fold8(x, y, |a, b| a * b, add),
            Kernel::L1 => fold8(x, y, |a, b| (a - b).abs(), add),
            Kernel::Linf => fold8(x, y, |a, b| (a - b).abs(), f64::max),
        }
    }

    /// The key in f32 computed directly (not in GEMM form): what simple engines use.
    #[inline]
    pub fn direct_f32(self, x: &[f32], y: &[f32]) -> f32 {
        let pairs = x.iter().zip(y);
        match self {
            Kernel::SqL2 => pairs.map(|(a, b)| (a - b) * (a - b)).sum(),
            Kernel::NegDot => -pairs.map(|(a, b)| a * b).sum::<f32>(),
            Kernel::L1 => pairs.map(|(a, b)| (a - b).abs()).sum(),
            Kernel::Linf => pairs.map(|(a, b)| (a - b).abs()).fold(0.0, f32::max),
        }
    }
}

impl Metric {
    /// The built-in metrics that take no parameters (all but Mahalanobis and expressions).
    pub const PLAIN: [Metric; 7] = [
        Metric::SqL2,
        Metric::L2,
        Metric::InnerProduct,
        Metric::Cosine,
        Metric::L1,
        Metric::Linf,
        Metric::Hellinger,
    ];

    /// The kernel that engines compute for this metric. [`Metric::Expr`] has none: it answers
    /// [`Kernel::L1`], the class of per-coordinate direct kernels, for candidate widths only
    /// (the pipeline hands engines the expression itself, see [`Metric::is_expr`]).
    pub fn kernel(&self) -> Kernel {
        match self {
            Metric::SqL2 | Metric::L2 | Metric::Hellinger | Metric::Mahalanobis(_) => Kernel::SqL2,
            Metric::InnerProduct | Metric::Cosine => Kernel::NegDot,
            Metric::L1 | Metric::Expr(_) => Kernel::L1,
            Metric::Linf => Kernel::Linf,
        }
    }

    /// `true` for a user-defined expression ([`Metric::Expr`]), which engines compute through
    /// [`crate::Engine::candidates_expr`], never through a [`Kernel`].
    pub fn is_expr(&self) -> bool {
        matches!(self, Metric::Expr(_))
    }

    /// `true` for similarities (largest first): only the inner product.
    pub fn is_similarity(&self) -> bool {
        matches!(self, Metric::InnerProduct)
    }

    /// `true` when `dist(x, y) == dist(y, x)` and engines may compute each pair once: every
    /// built-in metric. Expression metrics answer `false`: their engines evaluate one ordered
    /// pair at a time ([`MetricExpr::is_symmetric`] tells whether an expression is symmetric).
    pub fn is_symmetric(&self) -> bool {
        !self.is_expr()
    }

    /// The reported distance for an exact kernel key computed in the metric's exact space
    /// (see [`Metric::exact_key`]).
    pub fn distance_from_key(&self, key: f64) -> f32 {
        self.distance_from_key_f64(key) as f32
    }

    /// [`Metric::distance_from_key`] in f64: the distance reported for rows given in f64.
    pub fn distance_from_key_f64(&self, key: f64) -> f64 {
        match self {
            Metric::SqL2 | Metric::L1 | Metric::Linf => key,
            Metric::L2 | Metric::Mahalanobis(_) => key.max(0.0).sqrt(),
            Metric::InnerProduct => -key,
            Metric::Cosine => (1.0 + key).max(0.0),
            Metric::Hellinger => (0.5 * key).max(0.0).sqrt(),
            Metric::Expr(e) => e.distance(key),
        }
    }

    /// The exact (f64) kernel key of two points of the metric's exact space: the original data,
    /// except for Mahalanobis, whose exact space is the whitened data. Identical vectors give
    /// exactly the key of distance 0.
    pub fn exact_key<A: Real, B: Real>(&self, x: &[A], y: &[B]) -> f64 {
        match self {
            Metric::Cosine => {
                let (mut xy, mut xx, mut yy) = (0.0f64, 0.0f64, 0.0f64);
                let mut same = true;
                for (&a, &b) in x.iter().zip(y) {
                    let (a, b) = (a.get(), b.get());
                    same &= a == b;
                    xy += a * b;
                    xx += a * a;
                    yy += b * b;
                }
                if xx == 0.0 || yy == 0.0 {
                    // An all-zero row is at distance 1 from every row (scikit-learn's
                    // convention), itself and other zero rows included.
                    0.0
                } else if same {
                    -1.0
                } else {
                    (-xy / (xx.sqrt() * yy.sqrt())).max(-1.0)
                }
            }
            Metric::Hellinger => x
                .iter()
                .zip(y)
                .map(|(&a, &b)| {
                    let t = a.get().sqrt() - b.get().sqrt();
                    t * t
                })
                .sum(),
            Metric::Expr(e) => e.key(
                A::as_f32(x).expect("expression metrics are refused for f64 rows (check_given)"),
                B::as_f32(y).expect("expression metrics are refused for f64 rows (check_given)"),
            ),
            m => m.kernel().exact(x, y),
        }
    }

    /// Short name, as accepted by [`FromStr`].
    pub fn name(&self) -> &'static str {
        match self {
            Metric::SqL2 => "sqeuclidean",
            Metric::L2 => "l2",
            Metric::InnerProduct => "ip",
            Metric::Cosine => "cosine",
            Metric::L1 => "l1",
            Metric::Linf => "linf",
            Metric::Hellinger => "hellinger",
            Metric::Mahalanobis(_) => "mahalanobis",
            Metric::Expr(_) => "expr",
        }
    }

    /// Whether [`Metric::check_domain`] reads the values (only Hellinger's need to be ≥ 0).
    pub fn has_domain(&self) -> bool {
        matches!(self, Metric::Hellinger)
    }

    /// Checks the inputs' values against the metric's domain (Hellinger: ≥ 0; the others take
    /// every finite value, and an all-zero row is at cosine distance 1 from every row); see
    /// also [`Metric::check_shape`]. Expression metrics are checked on base and queries
    /// together when they are prepared.
    pub fn check_domain(&self, what: &str, m: MatrixRef<'_>) -> Result<()> {
        if self.has_domain() {
            // Block by block, a branch-free test each (it vectorises), then the first
            // negative value of the first bad block: an early-exit scan of every value
            // cost ~10 ms on 80 000 × 256.
            const BLOCK: usize = 1 << 14;
            let x = m.as_slice();
            let bad = x
                .par_chunks(BLOCK)
                .position_first(|c| c.iter().fold(false, |a, &v| a | (v < 0.0)));
            if let Some(i) = bad.and_then(|b| {
                let at = b * BLOCK;
                x[at..].iter().position(|&v| v < 0.0).map(|i| at + i)
            }) {
                return Err(KnnError::Negative {
                    what: what.into(),
                    row: i / m.dim(),
                    col: i % m.dim(),
                    value: m.as_slice()[i].into(),
                });
            }
        }
        Ok(())
    }

    /// Checks the metric's own data against the dimension `d` of the inputs (a given
    /// covariance must be d × d). Cheap; comes before any pass over the values.
    pub fn check_shape(&self, d: usize) -> Result<()> {
        match self {
            Metric::Mahalanobis(Covariance::Given(c)) if c.rows() != d || c.dim() != d => {
                Err(KnnError::Covariance(format!(
                    "covariance is {}×{}, the data has d={d}",
                    c.rows(),
                    c.dim()
                )))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Metric::Expr(e) => write!(f, "expr '{e}'"),
            m => f.write_str(m.name()),
        }
    }
}

impl FromStr for Metric {
    type Err = KnnError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "sqeuclidean" | "sql2" | "l2sq" | "squared_l2" => Metric::SqL2,
            "l2" | "euclidean" => Metric::L2,
            "ip" | "inner_product" | "dot" => Metric::InnerProduct,
            "cosine" | "cos" => Metric::Cosine,
            "l1" | "manhattan" | "cityblock" => Metric::L1,
            "linf" | "chebyshev" | "l_inf" => Metric::Linf,
            "hellinger" => Metric::Hellinger,
            "mahalanobis" => Metric::Mahalanobis(Covariance::FromBase),
            _ => {
                return Err(KnnError::Option(format!(
                    "unknown metric '{s}': the metrics are l2 (euclidean), sqeuclidean, ip (inner product), cosine, l1 (manhattan), linf (chebyshev), hellinger, mahalanobis; for a distance of your own, write it with --metric-expr (e.g. --metric-expr 'acc + abs(x - y)')"
                )))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block-wise domain check names the first negative value, in any block.
    #[test]
    fn hellinger_domain_names_the_first_negative_value() {
        let d = 7;
        let mut v = vec![0.5f32; 9500 * d]; // five blocks of 2^14 values
        assert!(Metric::Hellinger
            .check_domain("base", MatrixRef::new("base", &v, d).unwrap())
            .is_ok());
        for at in [0, 6, (1 << 14) - 1, 3 * (1 << 14) + 17, v.len() - 1] {
            let mut w = v.clone();
            w[at] = -1.0;
            w[v.len() - 1] = -2.0; // a later one, never the answer unless `at` is it
            let err = Metric::Hellinger
                .check_domain("base", MatrixRef::new("base", &w, d).unwrap())
                .unwrap_err();
            match err {
                KnnError::Negative {
                    row, col, value, ..
                } => {
                    assert_eq!((row, col), (at / d, at % d), "at {at}");
                    assert_eq!(value, if at == v.len() - 1 { -2.0 } else { -1.0 });
                }
                e => panic!("{e}"),
            }
        }
        v[5] = -0.0; // not negative
        assert!(Metric::Hellinger
            .check_domain("base", MatrixRef::new("base", &v, d).unwrap())
            .is_ok());
    }
}
