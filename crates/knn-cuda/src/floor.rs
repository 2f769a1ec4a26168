//! Floors: proven lower bounds on the exact key of every base point an engine left out.
//!
//! Every method computes keys in IEEE f32 (fused multiply-adds, any summation order), so for a
//! pair (q, b) the computed key k̂ and the exact key k satisfy
//! - squared L2, GEMM form `(‖q‖² + ‖b‖²) − 2 q·b`: |k̂ − k| ≤ γ (‖q‖ + ‖b‖)²,
//! - negated inner product: |k̂ − k| ≤ γ ‖q‖ ‖b‖,
//! - L1 / L∞ (sums / maxima of non-negative terms): |k̂ − k| ≤ γ k̂,
//!
//! with γ = (d+8)u / (1 − (d+8)u), u = 2⁻²⁴ ([`knn_core::Kernel::error_bound`], which the CPU
//! engine uses too). A point left out has a computed key at least the W-th returned one, so
//! `floor = k̂_W − bound(‖q‖, max‖b‖, k̂_W)` bounds its exact key from below.
//!
//! The TF32 tensor-core kernels (GEMM kernels, first tries) round q and b to TF32 first, so the
//! dot product error grows to (2u_in + u_in²)(1+γ)·Σ|qᵢbᵢ| + γ·Σ|qᵢbᵢ| ≤ that·‖q‖‖b‖ with
//! u_in = 2⁻¹¹ ([`TF32_INPUT_UNIT`]); their f32 accumulation may truncate, so γ is taken with
//! 4u ([`TF32_ACC_UNIT`]). Norms stay f32 sums of the unrounded inputs.

use knn_core::{CandidateRequest, Kernel, MatrixRef};
use rayon::prelude::*;

/// Unit roundoff of f32.
pub const F32_UNIT: f64 = 1.0 / (1u64 << 24) as f64;

/// Input rounding of the TF32 kernels (`cvt.rna.tf32.f32`: 10 explicit mantissa bits).
pub const TF32_INPUT_UNIT: f64 = 1.0 / (1u64 << 11) as f64;

/// Accumulation unit assumed for the tensor cores: 4·2⁻²⁴, covering truncation (2⁻²³) with a
/// factor 2 to spare for the alignment of each 8-term block before its addition.
pub const TF32_ACC_UNIT: f64 = 4.0 * F32_UNIT;

/// Largest Euclidean norm of the rows (in f64, rounded up), for the GEMM-form bounds.
pub fn max_norm(m: MatrixRef<'_>) -> f32 {
    centred_max_norm(m, None)
}

/// [`max_norm`] of the rows less `centre` (each difference rounded to f32, as the device does).
pub fn centred_max_norm(m: MatrixRef<'_>, centre: Option<&[f32]>) -> f32 {
    centred_norms(m, centre).into_iter().fold(0.0, f32::max)
}

/// An upper bound on the norm of each row less `centre` (when given): what [`floors`] takes
/// of a query row whose norm it is not given.
pub fn centred_norms(m: MatrixRef<'_>, centre: Option<&[f32]>) -> Vec<f32> {
    (0..m.rows())
        .into_par_iter()
        .with_min_len(1024)
        .map(|i| norm(m.row(i), centre))
        .collect()
}

/// Column means of the rows (f64 sums, rounded to f32).
pub fn mean(m: MatrixRef<'_>) -> Vec<f32> {
    let d = m.dim();
    let sums = m
        .as_slice()
        .par_chunks(d * 1024)
        .map(|c| {
            let mut s = vec![0.0f64; d];
            for r in c.chunks_exact(d) {
                s.iter_mut().zip(r).for_each(|(a, &v)| *a += v as f64);
            }
            s
        })
        .reduce(
            || vec![0.0f64; d],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            },
        );
    let n = m.rows().max(1) as f64;
    sums.iter().map(|s| (s / n) as f32).collect()
}

/// Euclidean norm of `x − centre` (differences rounded to f32, then f64), rounded up.
fn norm(x: &[f32], centre: Option<&[f32]>) -> f32 {
    let s: f64 = match centre {
        Some(c) => x
            .iter()
            .zip(c)
            .map(|(&v, &m)| ((v - m) as f64).powi(2))
            .sum(),
        None => x.iter().map(|&v| (v as f64) * (v as f64)).sum(),
    };
    (s.sqrt() * (1.0 + 1e-6)) as f32
}

/// What an absolute rounding `eta` of each input coordinate (on top of the relative `u_in`)
/// adds to a GEMM-form key's error: with |x̂ᵢ − xᵢ| ≤ u_in|xᵢ| + η,
/// |Σ q̂ᵢb̂ᵢ − Σ qᵢbᵢ| grows by at most η(1 + u_in)(‖q‖₁ + ‖b‖₁) + dη² ≤
/// η(1 + u_in)√d(‖q‖ + ‖b‖) + dη², times (1 + 2γ) for the accumulation, and twice that for
/// squared L2 (`−2 q·b`). 0 when `eta` is 0 and for L1 / L∞.
pub fn input_abs_bound(
    kernel: Kernel,
    d: usize,
    (qn, bn): (f32, f32),
    units: (f64, f64, f64),
) -> f64 {
    InputAbs::new(kernel, d, units).of(qn, bn)
}

/// [`input_abs_bound`] for many rows of one kernel, dimension and units: the terms they share
/// (a division and a square root) computed once, the same bits per row.
#[derive(Clone, Copy, Debug)]
pub struct InputAbs {
    /// η(1 + u_in)√d, dη², 1 + 2γ, and the kernel's factor (0: no term).
    a: f64,
    c: f64,
    g2: f64,
    k: f64,
}

impl InputAbs {
    pub fn new(kernel: Kernel, d: usize, (u, u_in, eta): (f64, f64, f64)) -> Self {
        let n = (d + 8) as f64 * u;
        let gamma = n / (1.0 - n);
        let k = match kernel {
            _ if eta == 0.0 => 0.0,
            Kernel::SqL2 => 2.0,
            Kernel::NegDot => 1.0,
            Kernel::L1 | Kernel::Linf => 0.0,
        };
        InputAbs {
            a: eta * (1.0 + u_in) * (d as f64).sqrt(),
            c: d as f64 * eta * eta,
            g2: 1.0 + 2.0 * gamma,
            k,
        }
    }

    /// `(a, c, g2, k)`, for device kernels that evaluate [`InputAbs::of`] themselves
    /// (`prove_rows` in `common.cuh`).
    pub fn constants(&self) -> (f64, f64, f64, f64) {
        (self.a, self.c, self.g2, self.k)
    }

    /// The term for a query of norm `qn` against base rows of norms at most `bn`.
    #[inline]
    pub fn of(&self, qn: f32, bn: f32) -> f64 {
        if self.k == 0.0 {
            return 0.0;
        }
        let dot = (self.a * (qn as f64 + bn as f64) + self.c) * self.g2 * (1.0 + 1e-6);
        self.k * dot
    }
}

/// The largest f32 not above `x`, so that a floor stays a floor after rounding.
fn round_down(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) > x {
        f.next_down()
    } else {
        f
    }
}

/// Per-row floors for rows of `req.width` sorted keys computed with accumulation unit `u` and
/// input rounding `u_in` (`F32_UNIT, 0.0` for the FP32 kernels; `TF32_ACC_UNIT,
/// TF32_INPUT_UNIT` for the tensor-core ones) plus `eta` absolute per coordinate (f16 inputs'
/// subnormals, [`input_abs_bound`]), on data centred by `centre` when given (`bn_max`
/// is then the largest norm of the centred base rows). Row i's W-th key is
/// `keys[i·stride + stride − 1]` (`stride` = the width for whole rows, 1 for the W-th keys
/// alone). Every point left out of row i has a computed key at least min(its W-th key,
/// `cut[i]`). `qn`, when given, bounds each query row's norm from above (measured where the
/// rows were made, see `hellinger_roots`); else the norms are taken of the rows here.
pub fn floors(
    req: &CandidateRequest<'_>,
    (keys, stride): (&[f32], usize),
    cut: &[f32],
    (bn_max, qn): (f32, Option<&[f32]>),
    centre: Option<&[f32]>,
    (u, u_in, eta): (f64, f64, f64),
) -> Vec<f32> {
    let w = req.width;
    let d = req.base.dim();
    // One row per cut (the request's own queries may lie in device memory instead).
    let nq = cut.len();
    if w >= req.available() {
        return vec![f32::INFINITY; nq];
    }
    let bounds = req.kernel.error_bounds(d, u, u_in);
    let abs = InputAbs::new(req.kernel, d, (u, u_in, eta));
    let floor = |i: usize, qn: f32| {
        let kth = keys[i * stride + stride - 1].min(cut[i]);
        let bound = bounds.of(qn, bn_max, kth) as f64 + abs.of(qn, bn_max);
        let f = round_down(kth as f64 - bound);
        if f.is_nan() {
            f32::NEG_INFINITY
        } else {
            f
        }
    };
    // Rows whose norm is known cost a few operations each, on this thread: a parallel pass
    // costs more to start (about 0.1 ms on the 16-core GPU machine) than 4096 of them.
    match (req.kernel.is_gemm(), qn) {
        (true, Some(n)) => (0..nq).map(|i| floor(i, n[i])).collect(),
        (false, _) => (0..nq).map(|i| floor(i, 0.0)).collect(),
        (true, None) if nq * d < SERIAL_WORK => (0..nq)
            .map(|i| floor(i, norm(req.queries.row(i), centre)))
            .collect(),
        (true, None) => (0..nq)
            .into_par_iter()
            .map(|i| floor(i, norm(req.queries.row(i), centre)))
            .collect(),
    }
}

/// Values read below which the floors take the rows' norms on one thread.
const SERIAL_WORK: usize = 1 << 16;
