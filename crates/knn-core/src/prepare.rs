//! Turning user data into what engines compute on (the engine space) and what the exact
//! re-rank computes on (the exact space).

use crate::error::{KnnError, Result};
use crate::expr::ExprPlan;
use crate::matrix::{CentredRoots, Matrix, MatrixRef};
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

/// Engine-space rows: a copy made here, or Hellinger's centred roots, made only when read
/// (see [`CentredRoots`]).
pub enum EngineRows<'a> {
    /// Transformed values.
    Owned(Matrix),
    /// Transformed values kept elsewhere (a [`PreparedBase`]'s).
    Borrowed(MatrixRef<'a>),
    /// Derived from given rows on first read.
    Roots(CentredRoots<'a>),
}

impl EngineRows<'_> {
    /// The rows.
    pub fn view(&self) -> MatrixRef<'_> {
        match self {
            EngineRows::Owned(m) => m.view(),
            EngineRows::Borrowed(m) => *m,
            EngineRows::Roots(r) => r.view(),
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
    pub engine: Option<(EngineRows<'a>, Option<Matrix>)>,
    /// Engine keys are exact-space keys times this (a power of two; 1 unless the data was
    /// scaled to keep f32 arithmetic away from overflow and underflow).
    pub key_scale: f64,
    /// For [`Metric::Expr`]: the program, its rounding bound and the layout of the engine
    /// space (features of base and queries, see [`crate::expr`]).
    pub expr: Option<ExprPlan>,
    /// Whether the preparation's own pass over the base found no value below zero (NaN aside):
    /// Hellinger's domain check of the base then needs no pass of its own. `false` when that
    /// pass did not look.
    pub base_nonnegative: bool,
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
            Some((b, q)) => q.as_ref().map_or_else(|| b.view(), |q| q.view()),
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

/// Rows from which [`far_centre`] takes the mean of a sample (every 2nd to 8th row).
const SAMPLE_ROWS: usize = 16384;

/// What [`far_centre`] finds in its pass over the base.
struct CentreScan {
    /// The mean of `f(base)` when the data sits far from the origin (see [`far_centre`]).
    centre: Option<Vec<f64>>,
    /// The largest |f(value)|, as f32.
    top: f32,
    /// Each column's smallest and largest value (as given, before `f`).
    range: Vec<(f32, f32)>,
}

/// The mean of `f(base)` (of every 2nd to 8th row from [`SAMPLE_ROWS`] rows on), when that data
/// sits far from the origin relative to its spread
/// (squared mean above `ratio` times the spread): the GEMM form's rounding grows with ‖x‖², so
/// subtracting it keeps candidate keys tight for data such as points near 4e6 with small
/// jitter. `None` when the data is already near the origin. Also returns the largest |f(value)|
/// (as f32; `f` must grow with |x| on the data) and each column's range. One pass over the data
/// (sums and sums of squares per axis): the spread E[x²] − mean² loses digits only when it is
/// far below the squared mean, where the answer is "centre" either way.
fn far_centre(base: MatrixRef<'_>, f: impl Fn(f32) -> f64 + Sync, ratio: f64) -> CentreScan {
    let d = base.dim();
    type Part = (Vec<f64>, Vec<f64>, u32, Vec<(f32, f32)>);
    let empty = || -> Part {
        (
            vec![0.0f64; d],
            vec![0.0f64; d],
            0u32,
            vec![(f32::INFINITY, f32::NEG_INFINITY); d],
        )
    };
    // The largest |value| is taken as bits (non-negative floats order like them; NaN
    // ignored), apart from the sums: a float max in the same loop kept it from vectorising
    // (scalar square roots, 177 ms for 80 000 × 256 on two cores).
    // The mean and spread of every `step`-th row: the centre is only a translation that keeps
    // norms small, and `f` (square roots) is most of the pass's cost (80 000 × 256 on 16
    // cores: 5.8 ms for every row, the range alone about 1 ms).
    let step = (base.rows() / SAMPLE_ROWS).clamp(1, 8);
    let (sums, squares, top, range) = base
        .as_slice()
        .par_chunks(d * 1024)
        .enumerate()
        .map(|(i, c)| {
            let (mut s, mut q, mut top, mut range) = empty();
            for (j, r) in c.chunks(d).enumerate() {
                if (i * 1024 + j) % step == 0 {
                    for ((s, q), &v) in s.iter_mut().zip(q.iter_mut()).zip(r) {
                        let v = f(v);
                        *s += v;
                        *q += v * v;
                    }
                }
                for (m, &v) in range.iter_mut().zip(r) {
                    *m = (m.0.min(v), m.1.max(v));
                }
                top = r.iter().fold(top, |a, v| {
                    let b = v.to_bits() & 0x7fff_ffff;
                    a.max(if b > 0x7f80_0000 { 0 } else { b })
                });
            }
            (s, q, top, range)
        })
        .reduce(empty, |(mut s, mut q, t, mut m), (s2, q2, t2, m2)| {
            s.iter_mut().zip(s2).for_each(|(x, y)| *x += y);
            q.iter_mut().zip(q2).for_each(|(x, y)| *x += y);
            m.iter_mut()
                .zip(m2)
                .for_each(|(x, y)| *x = (x.0.min(y.0), x.1.max(y.1)));
            (s, q, t.max(t2), m)
        });
    // f grows with |x| on the data it is given (the identity, square roots of values ≥ 0).
    let top = (f(f32::from_bits(top)) as f32).abs();
    let n = base.rows().div_ceil(step) as f64;
    let mean: Vec<f64> = sums.iter().map(|s| s / n).collect();
    let spread: f64 = squares
        .iter()
        .zip(&mean)
        .map(|(q, m)| (q / n - m * m).max(0.0))
        .sum();
    let mean_sq: f64 = mean.iter().map(|m| m * m).sum();
    CentreScan {
        centre: (mean_sq > ratio * spread).then_some(mean),
        top,
        range,
    }
}

/// The largest |√x − c| of the centred roots of columns whose given values span `range`: the
/// derived value grows with x (every step of [`CentredRoots::derive`] is monotone), so each
/// column's extremes come from its smallest and largest values.
fn roots_top(range: &[(f32, f32)], centre: &[f64]) -> f32 {
    range
        .iter()
        .zip(centre)
        .map(|(&(lo, hi), &c)| {
            CentredRoots::derive(lo, c)
                .abs()
                .max(CentredRoots::derive(hi, c).abs())
        })
        .fold(0.0, f32::max)
}

/// `f(x) − centre` row by row, computed in f64 and rounded to f32 once: the only rounding is
/// relative to the centred value, as the engines' bounds assume (rounding `f(x)` first and
/// centring after would leave an error of the size of `f(x)`'s rounding outside them).
fn centred(m: MatrixRef<'_>, centre: &[f64], f: impl Fn(f32) -> f64 + Sync) -> Matrix {
    map_rows(m, |x, o| {
        for ((o, &v), c) in o.iter_mut().zip(x).zip(centre) {
            *o = (f(v) - c) as f32;
        }
    })
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
    let w = Whitener::new(cov, base)?;
    Ok(move |x: &[f32], o: &mut [f32]| w.apply(x, o))
}

/// The Cholesky factor `L` behind [`whitener`], kept to whiten later rows the same way.
#[derive(Clone, Debug)]
struct Whitener {
    l: Vec<f64>,
    d: usize,
}

impl Whitener {
    fn new(cov: &Covariance, base: MatrixRef<'_>) -> Result<Self> {
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
        Ok(Whitener {
            l: cholesky(&c, d)?,
            d,
        })
    }

    /// Forward substitution `L y = x`, in f64, rounded once to f32.
    fn apply(&self, x: &[f32], o: &mut [f32]) {
        let (l, d) = (&self.l, self.d);
        let mut y = vec![0.0f64; d];
        for i in 0..d {
            let s: f64 = (0..i).map(|p| l[i * d + p] * y[p]).sum();
            y[i] = (x[i] as f64 - s) / l[i * d + i];
        }
        for (o, v) in o.iter_mut().zip(y) {
            *o = v as f32;
        }
    }
}

/// The engine-space map of a metric whose kernel works on other rows than the exact ones.
#[derive(Clone, Debug)]
enum EngineMap {
    /// The exact rows themselves.
    Same,
    /// Rows scaled to unit length (cosine).
    Normalise,
    /// Square roots (Hellinger near the origin).
    Roots,
    /// Square roots less a centre (Hellinger far from the origin; see [`CentredRoots`]).
    CentredRoots(Vec<f64>),
    /// The exact rows less a centre (squared-L2 kernels far from the origin).
    Centred(Vec<f64>),
}

/// How a metric turns given rows into the rows the exact re-rank sees (the exact space) and
/// the rows the engine computes on (the engine space): fixed by the base alone (whitening,
/// centre), so that it is applied to the base once and to every batch of queries alike.
struct Transform {
    whiten: Option<Whitener>,
    engine: EngineMap,
    /// The largest |value| of the engine base, when the base's scan found it.
    base_top: Option<f32>,
    /// See [`Prepared::base_nonnegative`].
    base_nonnegative: bool,
}

impl Transform {
    /// Reads the base (one pass, plus the covariance for an estimated Mahalanobis); also
    /// returns the base's exact-space rows where they differ from the given ones ([`Transform::exact_rows`]).
    /// Not for expression metrics.
    fn of_base(metric: &Metric, base: MatrixRef<'_>) -> Result<(Self, Option<Matrix>)> {
        let whiten = match metric {
            Metric::Mahalanobis(cov) => Some(Whitener::new(cov, base)?),
            _ => None,
        };
        let exact = whiten
            .as_ref()
            .map(|w| map_rows(base, |x, o| w.apply(x, o)));
        let mut t = Transform {
            whiten,
            engine: EngineMap::Same,
            base_top: None,
            base_nonnegative: false,
        };
        if matches!(metric, Metric::Cosine) {
            t.engine = EngineMap::Normalise;
        } else if metric.kernel() == Kernel::SqL2 {
            // The metric's transform of the exact values (Hellinger: square roots), and how far
            // from the origin they must sit to be centred here. Engines centre exact data
            // themselves when it pays (on the device, with one rounding of their own), but not
            // data derived by a rounding (see `CandidateRequest::exact_data`): square roots are
            // centred here whenever that shrinks their squared norms by half (uniform data: by
            // 9x, and a TF32 or bf16 first try's bound with them, without which its candidate
            // lists do not prove k = 100 of 80 000 points).
            // (Each transform is its own closure, inlined into the passes: through a function
            // pointer the f64 square roots were a call per value, 177 ms for 80 000 × 256 on
            // two cores.)
            let hellinger = matches!(metric, Metric::Hellinger);
            let b = exact.as_ref().map_or(base, Matrix::view);
            let scan = if hellinger {
                far_centre(b, |v: f32| (v as f64).sqrt(), 1.0)
            } else {
                far_centre(b, |v: f32| v as f64, 16.0)
            };
            t.base_top = Some(scan.top);
            // (Each column's smallest value; NaN never lowers it.)
            t.base_nonnegative = scan.range.iter().all(|&(lo, _)| lo >= 0.0);
            t.engine = match (hellinger, scan.centre) {
                (true, Some(c)) => {
                    // The roots' largest magnitude follows from the columns' ranges.
                    t.base_top = Some(roots_top(&scan.range, &c));
                    EngineMap::CentredRoots(c)
                }
                (true, None) => EngineMap::Roots,
                (false, Some(c)) => {
                    t.base_top = None;
                    EngineMap::Centred(c)
                }
                (false, None) => EngineMap::Same,
            };
        }
        Ok((t, exact))
    }

    /// Exact-space rows of `m` (whitened for Mahalanobis, else `None`: the rows as given).
    fn exact_rows(&self, m: MatrixRef<'_>) -> Option<Matrix> {
        self.whiten
            .as_ref()
            .map(|w| map_rows(m, |x, o| w.apply(x, o)))
    }

    /// Engine-space rows of the given rows `given` whose exact-space rows are `exact`
    /// (`None`: the engine space is the exact one), one rounding from the exact values.
    fn engine_rows(&self, given: MatrixRef<'_>, exact: MatrixRef<'_>) -> Option<Matrix> {
        let root = |v: f32| (v as f64).sqrt();
        match &self.engine {
            EngineMap::Same => None,
            EngineMap::Normalise => Some(map_rows(exact, |x, o| {
                let n = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
                // An all-zero row stays zero: its key is 0 to every row (distance 1).
                let n = if n == 0.0 { 1.0 } else { n };
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = (v as f64 / n) as f32;
                }
            })),
            EngineMap::Roots => Some(map_rows(given, |x, o| {
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = v.sqrt();
                }
            })),
            EngineMap::CentredRoots(c) => Some(centred(given, c, root)),
            EngineMap::Centred(c) => Some(centred(exact, c, |v: f32| v as f64)),
        }
    }
}

/// Largest magnitude, compared as bits (those of non-negative floats order like them; NaN
/// ignored); the finite check's when it saw it.
fn max_abs(m: MatrixRef<'_>) -> f32 {
    use crate::matrix::{max_magnitude_bits, INFINITY_BITS};
    if let Some(top) = m.known_top() {
        return top;
    }
    let bits = max_magnitude_bits(m.as_slice(), |b| if b > INFINITY_BITS { 0 } else { b });
    f32::from_bits(bits as u32)
}

/// The power of two engine rows are scaled by when their largest magnitude `top` would let
/// squares or sums overflow or underflow f32 (`None`: no scaling).
fn scale_for(top: f32) -> Option<f64> {
    (top > 0.0 && !(2f32.powi(-40)..=2f32.powi(40)).contains(&top))
        .then(|| 2f64.powi(-(top.log2().round() as i32)))
}

/// `m` times `s` (a power of two: exact).
fn scaled(m: MatrixRef<'_>, s: f64) -> Matrix {
    map_rows(m, |x, o| {
        o.iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = (v as f64 * s) as f32)
    })
}

/// How engine keys relate to exact keys once engine rows are scaled by `s`.
fn key_scale(metric: &Metric, s: f64) -> f64 {
    match metric.kernel() {
        Kernel::SqL2 | Kernel::NegDot => s * s,
        Kernel::L1 | Kernel::Linf => s,
    }
}

/// Prepares base and (optional) queries for `metric`. Domain checks happen before this.
pub fn prepare<'a>(
    metric: &Metric,
    base: MatrixRef<'a>,
    queries: Option<MatrixRef<'a>>,
) -> Result<Prepared<'a>> {
    if let Metric::Expr(e) = metric {
        // Neither centred nor scaled: the expression is not translation or scale invariant.
        let (plan, engine) = crate::expr::prepare_expr(e, base, queries)?;
        return Ok(Prepared {
            exact_base: Data::Borrowed(base),
            exact_queries: queries.map(Data::Borrowed),
            engine: engine.map(|(b, q)| (EngineRows::Owned(b), q)),
            key_scale: 1.0,
            expr: Some(plan),
            base_nonnegative: false,
        });
    }
    let (t, exact) = Transform::of_base(metric, base)?;
    let exact_base = exact.map_or(Data::Borrowed(base), Data::Owned);
    let exact_queries = queries.map(|q| t.exact_rows(q).map_or(Data::Borrowed(q), Data::Owned));
    let mut engine = match &t.engine {
        EngineMap::Same => None,
        // The base's roots are made when first read (an engine that derives them itself never
        // makes the host pay for them).
        EngineMap::CentredRoots(c) => Some(EngineRows::Roots(CentredRoots::new(base, c.clone()))),
        _ => t
            .engine_rows(base, exact_base.view())
            .map(EngineRows::Owned),
    }
    .map(|b| {
        let q = queries
            .zip(exact_queries.as_ref())
            .and_then(|(q, x)| t.engine_rows(q, x.view()));
        (b, q)
    });
    // Scale by a power of two (exact) when squares or sums could overflow or underflow f32.
    let (eb, eq) = match &engine {
        Some((b, q)) => (b.view(), q.as_ref().map(|q| q.view())),
        None => (exact_base.view(), exact_queries.as_ref().map(|q| q.view())),
    };
    let top = t
        .base_top
        .unwrap_or_else(|| max_abs(eb))
        .max(eq.map_or(0.0, max_abs));
    let mut ks = 1.0;
    if let Some(s) = scale_for(top) {
        engine = Some((EngineRows::Owned(scaled(eb, s)), eq.map(|q| scaled(q, s))));
        ks = key_scale(metric, s);
    }
    Ok(Prepared {
        exact_base,
        exact_queries,
        engine,
        key_scale: ks,
        expr: None,
        base_nonnegative: t.base_nonnegative,
    })
}

/// A base prepared once for many searches (the index's): its exact-space and engine-space
/// rows made and kept, the transform kept for the queries. Searching with it gives what
/// [`prepare`] of the same base and queries gives, bit for bit ([`PreparedBase::with_queries`]).
pub struct PreparedBase {
    /// `None` for expression metrics, whose preparation reads the queries too.
    transform: Option<Transform>,
    /// Exact-space base when it differs from the given rows (whitened).
    exact: Option<Matrix>,
    /// Engine-space base when it differs from the exact rows (materialised, scaled).
    engine: Option<Matrix>,
    /// The largest |value| of the unscaled engine base.
    top: f32,
    /// The power of two the engine base was scaled by, if any.
    scale: Option<f64>,
    /// See [`Prepared::base_nonnegative`].
    pub base_nonnegative: bool,
    /// Identifies this preparation in engine requests ([`crate::CandidateRequest::base_key`]),
    /// so that engines keep what they derived from it (a device copy) between searches.
    pub key: u64,
}

impl PreparedBase {
    /// Prepares `base` for `metric` (domain checks happen before this), under `key`, a fresh
    /// [`crate::base_key`] (taken before, so that an engine may be given the base under it
    /// meanwhile: [`crate::Engine::prefetch_base`]).
    pub fn new(metric: &Metric, base: MatrixRef<'_>, key: u64) -> Result<Self> {
        if metric.is_expr() {
            return Ok(PreparedBase {
                transform: None,
                exact: None,
                engine: None,
                top: 0.0,
                scale: None,
                base_nonnegative: false,
                key,
            });
        }
        let (t, exact) = Transform::of_base(metric, base)?;
        let xb = exact.as_ref().map_or(base, Matrix::view);
        let engine = t.engine_rows(base, xb);
        let eb = engine.as_ref().map_or(xb, Matrix::view);
        let top = t.base_top.unwrap_or_else(|| max_abs(eb));
        let scale = scale_for(top);
        let engine = match scale {
            Some(s) => Some(scaled(eb, s)),
            None => engine,
        };
        Ok(PreparedBase {
            base_nonnegative: t.base_nonnegative,
            transform: Some(t),
            exact,
            engine,
            top,
            scale,
            key,
        })
    }

    /// Whether queries whose values are all at most `top` in magnitude are searched as given:
    /// nothing whitened, normalised, square-rooted, centred or scaled, so that the exact
    /// re-rank and the engines see the query rows themselves (keys at scale 1). An engine may
    /// then read such queries where they lie, a GPU's memory. (`top` only grows the base's
    /// largest magnitude, which is at least 2⁻⁴⁰ here, so a bound on it is as good as the value.)
    pub fn searches_queries_as_given(&self, top: f32) -> bool {
        let plain = self
            .transform
            .as_ref()
            .is_some_and(|t| t.whiten.is_none() && matches!(t.engine, EngineMap::Same));
        plain
            && self.exact.is_none()
            && self.engine.is_none()
            && self.scale.is_none()
            && self.top > 0.0
            && top.is_finite()
            && scale_for(self.top.max(top)).is_none()
    }

    /// The rows engines compute on: the prepared copy, or `base` itself (the rows this was
    /// made from) where the engine space is the given one.
    pub fn engine_base<'a>(&'a self, base: MatrixRef<'a>) -> MatrixRef<'a> {
        match (&self.engine, &self.exact) {
            (Some(m), _) | (None, Some(m)) => m.view(),
            (None, None) => base,
        }
    }

    /// The exact keys ([`Metric::exact_key`], in the metric's exact space: whitened rows for
    /// Mahalanobis, else the rows themselves) that the re-rank of a search of `queries` against
    /// `base` (the rows this was made from) selects by: entry `i·k + j` is the key of query
    /// `i` and base row `ids[i·k + j]`. Ids must be rows of `base`, `k` per query.
    pub fn exact_keys(
        &self,
        metric: &Metric,
        base: MatrixRef<'_>,
        queries: MatrixRef<'_>,
        ids: &[u32],
        k: usize,
    ) -> Vec<f64> {
        let xb = self.exact.as_ref().map_or(base, Matrix::view);
        let whitened = self.transform.as_ref().and_then(|t| t.exact_rows(queries));
        let xq = whitened.as_ref().map_or(queries, Matrix::view);
        let d = xb.dim();
        crate::search::f32_pair_keys(metric, xq.as_slice(), xb.as_slice(), d, ids, k)
    }

    /// The preparation of `base` (the rows this was made from) with `queries` (`None`: a
    /// self-join), as [`prepare`] would make it, the base's part reused; `None` when the
    /// queries change it (an expression metric, or queries whose magnitude calls for
    /// another scaling): then [`prepare`] both.
    pub fn with_queries<'a>(
        &'a self,
        metric: &Metric,
        base: MatrixRef<'a>,
        queries: Option<MatrixRef<'a>>,
    ) -> Option<Prepared<'a>> {
        let t = self.transform.as_ref()?;
        let exact_queries = queries.map(|q| t.exact_rows(q).map_or(Data::Borrowed(q), Data::Owned));
        let engine_queries = queries
            .zip(exact_queries.as_ref())
            .and_then(|(q, x)| t.engine_rows(q, x.view()));
        let eq = engine_queries
            .as_ref()
            .map(Matrix::view)
            .or(exact_queries.as_ref().map(Data::view));
        let top = self.top.max(eq.map_or(0.0, max_abs));
        if scale_for(top) != self.scale {
            return None;
        }
        let exact_base = match &self.exact {
            Some(m) => Data::Borrowed(m.view()),
            None => Data::Borrowed(base),
        };
        let engine_queries = match (self.scale, eq) {
            (Some(s), Some(q)) => Some(scaled(q, s)),
            _ => engine_queries,
        };
        let engine = self
            .engine
            .as_ref()
            .map(|b| (EngineRows::Borrowed(b.view()), engine_queries));
        Some(Prepared {
            exact_base,
            exact_queries,
            engine,
            key_scale: self.scale.map_or(1.0, |s| key_scale(metric, s)),
            expr: None,
            base_nonnegative: self.base_nonnegative,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hellinger's centred roots are left for the engines to make, and their largest magnitude
    /// (which decides the scaling) is the made values' own.
    #[test]
    fn hellinger_roots_are_derived_with_their_top() {
        let d = 9;
        for (scale, offset) in [(1.0f32, 0.0f32), (1e-30, 0.0), (1.0, 4e6), (1e-3, 1e-25)] {
            let v: Vec<f32> = (0..500 * d)
                .map(|i| offset + scale * ((i * 7919) % 997) as f32)
                .collect();
            let b = MatrixRef::new("b", &v, d).unwrap();
            let prep = prepare(&Metric::Hellinger, b, None).unwrap();
            let eb = prep.engine_base();
            let scan = far_centre(b, |x| (x as f64).sqrt(), 1.0);
            let c = scan.centre.expect("these data sit far from the origin");
            let top = roots_top(&scan.range, &c);
            let made: Vec<f32> = v
                .iter()
                .enumerate()
                .map(|(i, &x)| CentredRoots::derive(x, c[i % d]))
                .collect();
            let max = made.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert_eq!(top.to_bits(), max.to_bits(), "scale {scale}");
            if prep.key_scale == 1.0 {
                assert!(!eb.centred_roots().unwrap().made);
                assert_eq!(eb.as_slice(), &made[..]);
            } else {
                // Scaled data is a copy made here.
                assert!(eb.centred_roots().is_none());
                assert!(!(2f32.powi(-40)..=2f32.powi(40)).contains(&max));
            }
        }
    }
}
