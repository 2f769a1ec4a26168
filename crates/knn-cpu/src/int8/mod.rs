//! The integer fast path for squared L2 (and L1 on AVX2) at small dimension: 8-bit codes on
//! AVX-512 VNNI, 12-bit codes on AVX2 (the module keeps its first form's name). The block
//! kernels are in `vnni.rs` and `avx2.rs`, the plan, codes and buffers here.
//!
//! At small `d` a GEMM-form kernel spends as much time turning dot products into keys and
//! selecting them as on the products. Here coordinates are quantised once per request to
//! integer codes on a common grid, `x ≈ m + s·X` (`m` the base's mid-range per dimension, `s`
//! one step for all dimensions, `X ∈ [−c, c]`), and integer products compute the keys exactly:
//! `vpdpbusd` (4 products u8 × s8 per 32-bit lane, twice the products of `vdpbf16ps` per
//! instruction) with `c = 127`; on AVX2, `vpmaddwd` (2 products i16 × i16 per 32-bit lane)
//! with `c = 2047`. (AVX2's 8-bit `vpmaddubsw` saturates its 16-bit pair sums unless
//! `c ≤ 63`: those 7-bit codes left half the rows of normal data at d = 16 unproven.)
//!
//! The rest of this text describes the 8-bit form; the 16-bit one stores base codes as they
//! are (`B`, no offset), so its `dot = Q·B` and `K = K'`.
//!
//! L1 (16-bit form only): `Σ|Q − B| = ΣQ + ΣB − 2·Σmin(Q, B)`, with `vpminsw` and 16-bit adds
//! (eight words of codes `|X| ≤ 2047` at a time, then `vpmaddwd` by ones into the 32-bit
//! lanes): the accumulators start at `−⌊ΣB/2⌋`, so `K' = (ΣB mod 2) − 2·acc` as for squared
//! L2, and `K = K' + ΣQ`. The floor is `s·K − (‖q − q̃‖₁ + max_b ‖b − b̃‖₁)` (per coordinate,
//! `||q − b| − |q̃ − b̃|| ≤ |q − q̃| + |b − b̃|`).
//!
//! Layout: base points sit in SIMD lanes (panels of 16 points, codes stored as `B + 128`, u8);
//! a query's codes (s8) are broadcast. With `dot = Σ (B_i + 128) Q_i = Q·B + 128 ΣQ` the key
//!
//! `K = ‖B‖² − 2 Q·B = K' + 256 ΣQ`, `K' = ‖B‖² − 2·dot`
//!
//! differs from `K'` by a per-query constant. The accumulators start at `−⌊‖B‖²/2⌋`, so they
//! hold `acc = dot − ⌊‖B‖²/2⌋` and `K' = (‖B‖² mod 2) − 2·acc`; `K' < T` implies
//! `acc > ⌊−T/2⌋`: one integer compare per 16 keys against the query's threshold. Keys that
//! pass leave the registers by `vpcompressd` into the query's candidate buffer (no branch per
//! key); a full buffer is cut to the `width` smallest `(K', id)`, whose largest key becomes the
//! new threshold. `s²(‖Q‖² + K) = ‖q̃ − b̃‖²` is the exact squared distance of the quantised
//! points.
//!
//! Exactness: with `E = ‖q − q̃‖ + max_b ‖b − b̃‖` (measured in f64, not assumed), the
//! triangle inequality gives `‖q − b‖² ≥ D̃ − 2√D̃·E` for `D̃ = ‖q̃ − b̃‖²`, so the w-th kept key
//! yields the floor for every point left out (see [`Plan::floor`]).

use knn_core::{CandidateRequest, Kernel, MatrixRef, TopK};
use multiversion::multiversion;
use rayon::prelude::*;
use std::ops::Range;

/// Largest dimension sent to this path: `|K| ≤ 3·d·127²` stays below 2²⁴ (exact in f32 keys)
/// for `d ≤ 346`; beyond 64 the bf16 path is as fast and its relative bound tighter. (The
/// 16-bit keys, up to `3·64·2047²`, round in f32: the floor's `10⁻⁶` margin covers it.)
pub(crate) const VNNI_MAX_DIM: usize = 64;

/// Largest dimension of the 16-bit form: its accumulators stay within `1.5·d·2047² < 2³⁰`
/// (above [`OPEN`]), and against the f32 GEMM it replaces it measured 1.3× faster at d = 128
/// (16384 × 4096, k = 16: 124–132 against 162–170 ms, 2-core AVX2).
const AVX2_MAX_DIM: usize = 128;

/// The instructions that compute the products, and so the codes' range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Products {
    /// AVX-512 VNNI `vpdpbusd`, codes in `[−127, 127]`.
    Vnni,
    /// AVX2 `vpmaddwd`, codes in `[−2047, 2047]`.
    Avx2,
}

impl Products {
    /// The largest code magnitude `c`.
    fn max_code(self) -> f32 {
        match self {
            Products::Vnni => 127.0,
            Products::Avx2 => 2047.0,
        }
    }

    /// Largest dimension this form takes.
    pub(crate) fn max_dim(self) -> usize {
        match self {
            Products::Vnni => VNNI_MAX_DIM,
            Products::Avx2 => AVX2_MAX_DIM,
        }
    }

    /// Whether this form computes `kernel`'s keys: squared L2, and L1 with 16-bit codes.
    pub(crate) fn takes(self, kernel: Kernel) -> bool {
        match kernel {
            Kernel::SqL2 => true,
            Kernel::L1 => self == Products::Avx2,
            _ => false,
        }
    }

    /// Fewest queries for which a request quantises the base (a kept plan serves any number):
    /// the codes cost a pass over the base, which the products repay at once with 8-bit codes
    /// (GPU machine's Xeon, 200 000 × 16, 256 queries: 27 ms against 37 ms without the path)
    /// but only over many queries with 16-bit ones (10⁶ × 128, 2-core AVX2: 0.35 s of codes
    /// against ~1.3 ms saved a query; one-off searches of 256 queries lost, of 1000 won).
    pub(crate) fn min_queries(self) -> usize {
        match self {
            Products::Vnni => 1,
            Products::Avx2 => 512,
        }
    }

    /// Codes per 32-bit word.
    fn per_word(self) -> usize {
        match self {
            Products::Vnni => 4,
            Products::Avx2 => 2,
        }
    }

    /// The word of codes `x[..per_word]` as the products read it: u8 `X + 128` (8-bit) or i16
    /// `X` (16-bit) for base points, s8 or i16 for queries.
    fn word(self, x: &[i16], base: bool) -> u32 {
        match self {
            Products::Vnni => {
                let off = if base { 128 } else { 0 };
                u32::from_le_bytes(std::array::from_fn(|j| (x[j] + off) as u8))
            }
            Products::Avx2 => (x[0] as u16 as u32) | (x[1] as u16 as u32) << 16,
        }
    }
}
/// Base points per panel (one zmm of i32 lanes).
const LANES: usize = 16;
/// Panels per micro-kernel block (64 base points).
const NP: usize = 4;
/// Threshold before a query's buffer first fills: below every real accumulator
/// (`|acc| < 2²²` for 8-bit codes at `d ≤ 64`, `< 1.5·128·2047²` for 16-bit ones); padding
/// lanes start at it and only decrease (their codes are 0), so they never pass it.
const OPEN: i32 = -(1 << 30);

/// The products this CPU computes the path with: AVX-512 VNNI, else AVX2 on a CPU without
/// AVX-512 (where AVX-512's f32 FMA computes as many products an instruction as `vpmaddwd`),
/// else none (checked once; `CpuEngine::without_int8` keeps an engine off the path).
pub(crate) fn available() -> Option<Products> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<Option<Products>> = OnceLock::new();
        *HAS.get_or_init(|| {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
            {
                Some(Products::Vnni)
            } else if std::arch::is_x86_feature_detected!("avx2")
                && !std::arch::is_x86_feature_detected!("avx512f")
            {
                Some(Products::Avx2)
            } else {
                None
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The quantised base of one request.
pub(crate) struct Plan {
    /// The instructions of the products (and the codes' range).
    products: Products,
    /// The keys: squared L2 or L1.
    kernel: Kernel,
    /// Grid centre `m` per dimension.
    centre: Vec<f32>,
    /// Grid step `s`, and its inverse used to round.
    step: f32,
    inv_step: f32,
    /// Words of codes per point (`d.div_ceil(per_word)`).
    quads: usize,
    /// Panels of 16 points: word `(panel·quads + t)·16 + lane` holds codes `4t..4t+4` (16-bit:
    /// `2t..2t+2`) of point `16·panel + lane` as u8 `B_i + 128` (16-bit: i16 `B_i`; zero
    /// padded); `NP − 1` extra zero panels at the end so every block of `NP` panels exists.
    codes: Vec<u32>,
    /// Per panel lane: `−⌊‖B‖²/2⌋` (L1: `−⌊ΣB/2⌋`; accumulator start; [`OPEN`] on padding
    /// lanes).
    init: Vec<i32>,
    /// Per panel lane: `‖B‖² mod 2` (L1: `ΣB mod 2`).
    parity: Vec<i32>,
    /// `max_b ‖b − b̃‖` (L1: `‖b − b̃‖₁`), rounded up.
    base_err: f64,
    /// Added to each computed `‖x − x̃‖` (or `‖x − x̃‖₁`): covers the f64 rounding of `m + s·X`
    /// (absolute, so a relative margin alone would not cover it where `x ≈ x̃` far from the
    /// origin).
    slack: f64,
}

impl Plan {
    /// Quantises `base` for `products` and `kernel`'s keys; `None` when the form does not take
    /// the kernel or the keys could overflow f32 (the bf16, f32 or direct path then runs).
    pub(crate) fn new(base: MatrixRef<'_>, products: Products, kernel: Kernel) -> Option<Self> {
        if !products.takes(kernel) {
            return None;
        }
        let c = products.max_code() as f64;
        let d = base.dim();
        let (lo, hi) = base
            .as_slice()
            .par_chunks(d * 4096)
            .map(|c| {
                let (mut lo, mut hi) = (vec![f32::INFINITY; d], vec![f32::NEG_INFINITY; d]);
                for r in c.chunks(d) {
                    for i in 0..d {
                        lo[i] = lo[i].min(r[i]);
                        hi[i] = hi[i].max(r[i]);
                    }
                }
                (lo, hi)
            })
            .reduce(
                || (vec![f32::INFINITY; d], vec![f32::NEG_INFINITY; d]),
                |(mut a, mut b), (c, e)| {
                    a.iter_mut().zip(c).for_each(|(x, y)| *x = x.min(y));
                    b.iter_mut().zip(e).for_each(|(x, y)| *x = x.max(y));
                    (a, b)
                },
            );
        let centre: Vec<f32> = lo
            .iter()
            .zip(&hi)
            .map(|(&l, &h)| ((l as f64 + h as f64) / 2.0) as f32)
            .collect();
        let half_range = lo
            .iter()
            .zip(&hi)
            .map(|(&l, &h)| (h as f64 - l as f64) / 2.0)
            .fold(0.0f64, f64::max);
        let step = if half_range > 0.0 && half_range.is_finite() {
            (half_range / c) as f32
        } else {
            1.0
        };
        // Keys s²·(‖Q‖² + K) up to s²·4·d·c² must stay far from f32 overflow.
        if !(step as f64).is_normal()
            || (step as f64).powi(2) * 4.0 * d as f64 * c * c > f32::MAX as f64 / 16.0
        {
            return None;
        }
        let per = products.per_word();
        let quads = d.div_ceil(per);
        let n = base.rows();
        let panels = n.div_ceil(LANES) + NP - 1;
        let mut plan = Plan {
            products,
            kernel,
            centre,
            step,
            inv_step: 1.0 / step,
            quads,
            // Huge pages, made on every core: 4 KiB pages faulted in one at a time took a third
            // of the codes' making (10⁶ × 128 points, 2-core AVX2).
            codes: knn_core::pages::zeroed_huge(panels * quads * LANES),
            init: vec![OPEN; panels * LANES],
            parity: vec![0; panels * LANES],
            base_err: 0.0,
            slack: 0.0,
        };
        // Each computed difference e_i = v_i − fl(m_i + s·X_i) is off by at most
        // δ = 2⁻⁵³·(|m| + c·s) (s·X is exact; the final subtraction's own rounding is relative
        // and covered by the 1e-9 margin), so the vector norm is off by at most √d·δ (the L1
        // norm by d·δ).
        let big = plan
            .centre
            .iter()
            .map(|&m| (m as f64).abs())
            .fold(0.0, f64::max)
            + c * step as f64;
        let terms = if kernel == Kernel::L1 {
            d as f64
        } else {
            (d as f64).sqrt()
        };
        plan.slack = terms * 2.0 * big * f64::EPSILON;
        let (mut codes, mut init, mut parity) = (
            std::mem::take(&mut plan.codes),
            std::mem::take(&mut plan.init),
            std::mem::take(&mut plan.parity),
        );
        let err = codes
            .par_chunks_mut(quads * LANES)
            .zip(init.par_chunks_mut(LANES))
            .zip(parity.par_chunks_mut(LANES))
            .enumerate()
            .map(|(panel, ((codes, init), parity))| {
                let mut worst = 0.0f64;
                let mut x = vec![0i16; quads * per];
                for lane in 0..LANES {
                    let i = panel * LANES + lane;
                    if i >= n {
                        break;
                    }
                    worst = worst.max(plan.quantise(base.row(i), &mut x));
                    // ‖B‖² (L1: ΣB) = 2·⌊·/2⌋ + parity, for K' = parity − 2·acc.
                    let norm: i32 = match kernel {
                        Kernel::L1 => x.iter().map(|&v| v as i32).sum(),
                        _ => x.iter().map(|&v| v as i32 * v as i32).sum(),
                    };
                    init[lane] = -norm.div_euclid(2);
                    parity[lane] = norm.rem_euclid(2);
                    for (t, q) in x.chunks_exact(per).enumerate() {
                        codes[t * LANES + lane] = products.word(q, true);
                    }
                }
                worst
            })
            .reduce(|| 0.0, f64::max);
        plan.codes = codes;
        plan.init = init;
        plan.parity = parity;
        plan.base_err = err;
        Some(plan)
    }

    /// Codes of `x` (zero padded to `quads·per_word`), returning an upper bound on `‖x − x̃‖`
    /// (L1: `‖x − x̃‖₁`; x̃ = m + s·X).
    fn quantise(&self, x: &[f32], out: &mut [i16]) -> f64 {
        let c = self.products.max_code();
        let (sq, abs) = quantise(x, &self.centre, self.inv_step, self.step, c, out);
        let norm = if self.kernel == Kernel::L1 {
            abs
        } else {
            sq.sqrt()
        };
        norm * (1.0 + 1e-9) + self.slack
    }

    /// For one query: `(o, a, e)` such that `a·(o + K)` is the exact key of the quantised
    /// points (squared L2: `o = ‖Q‖²`, `a = s²`; L1: `o = 0`, `a = s`), and `e = ‖q − q̃‖ +
    /// max_b ‖b − b̃‖` (L1: the same in the L1 norm), for [`Plan::floor`].
    pub(crate) fn query_terms(&self, q: &[f32]) -> (i64, f64, f64) {
        let mut x = vec![0i16; self.quads * self.products.per_word()];
        let err = self.quantise(q, &mut x);
        let s = self.step as f64;
        let (o, a) = match self.kernel {
            Kernel::L1 => (0, s),
            _ => (x.iter().map(|&v| v as i64 * v as i64).sum(), s * s),
        };
        (o, a, err + self.base_err)
    }

    /// A lower bound on `‖q − b‖²` for every point whose quantised squared distance is at
    /// least `dw`, given `e = ‖q − q̃‖ + max ‖b − b̃‖`: `‖q − b‖ ≥ √D̃ − e`, so
    /// `‖q − b‖² ≥ D̃ − 2√D̃·e`, which grows with `D̃` once `√D̃ ≥ e` (below, the bound is
    /// negative and 0 holds). Margins cover the f32 rounding of the reported keys (the
    /// pipeline infers its per-key slack from `key_w − floor`) and of the exact keys.
    ///
    /// L1: `Σ|q − b| ≥ D̃ − e` coordinate by coordinate, the same margins.
    pub(crate) fn floor(&self, dw: f64, e: f64) -> f64 {
        if self.kernel == Kernel::L1 {
            return dw * (1.0 - 1e-6) - e * (1.0 + 1e-6) - f64::from(f32::MIN_POSITIVE);
        }
        dw * (1.0 - 1e-6) - 2.0 * dw.sqrt() * e * (1.0 + 1e-6) - f64::from(f32::MIN_POSITIVE)
    }
}

/// Codes of `x` (zero padded to `out.len()`) on the grid `m + s·X`, returning the computed
/// `‖x − x̃‖²` and `‖x − x̃‖₁` in f64 ([`Plan::quantise`] turns them into a bound on the norm).
/// Eight f64 partial sums of each so it vectorises.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl", "x86_64+avx2+fma"))]
fn quantise(
    x: &[f32],
    centre: &[f32],
    inv_step: f32,
    step: f32,
    c: f32,
    out: &mut [i16],
) -> (f64, f64) {
    out.fill(0);
    let (mut acc, mut abs) = ([0.0f64; 8], [0.0f64; 8]);
    let one = |v: f32, m: f32| {
        // Round to nearest (even) by the 1.5·2²³ trick: no libm call, exact for |x| ≤ 2047.
        let x = ((v - m) * inv_step).clamp(-c, c);
        let code = (x + 12_582_912.0) - 12_582_912.0;
        let e = v as f64 - (m as f64 + step as f64 * code as f64);
        (code as i16, e)
    };
    let n = x.len() / 8 * 8;
    for ((xc, mc), oc) in x[..n]
        .chunks_exact(8)
        .zip(centre[..n].chunks_exact(8))
        .zip(out[..n].chunks_exact_mut(8))
    {
        for l in 0..8 {
            let (c, e) = one(xc[l], mc[l]);
            oc[l] = c;
            acc[l] += e * e;
            abs[l] += e.abs();
        }
    }
    for i in n..x.len() {
        let (c, e) = one(x[i], centre[i]);
        out[i] = c;
        acc[0] += e * e;
        abs[0] += e.abs();
    }
    (acc.iter().sum(), abs.iter().sum())
}

/// Order-preserving packing of `(K', id)` into one integer.
#[inline]
fn pack(key: i32, id: u32) -> u64 {
    (((key as u32) ^ 0x8000_0000) as u64) << 32 | id as u64
}

#[inline]
fn unpack(v: u64) -> (i32, u32) {
    ((((v >> 32) as u32) ^ 0x8000_0000) as i32, v as u32)
}

/// The filter value for a threshold key `t`: keys `K' < t` have `acc > ⌊−t/2⌋`.
#[inline]
fn filter(t: i32) -> i32 {
    (-(t as i64)).div_euclid(2) as i32
}

/// Per-query candidate buffers of one work unit: keys `K'` and ids, `cap` slots each, the fill
/// and the accumulator threshold.
struct Buffers {
    width: usize,
    /// Fill at which a buffer is cut back to `width`.
    limit: usize,
    cap: usize,
    keys: Vec<i32>,
    ids: Vec<u32>,
    fill: Vec<usize>,
    thr: Vec<i32>,
    skip: Vec<u32>,
    scratch: Vec<u64>,
}

impl Buffers {
    fn new(nq: usize, width: usize, skip: Vec<u32>) -> Self {
        let limit = (2 * width).max(32);
        // One block appends at most NP·16 keys after a fill below `limit`.
        let cap = limit + NP * LANES;
        Buffers {
            width,
            limit,
            cap,
            keys: vec![0; nq * cap],
            ids: vec![0; nq * cap],
            fill: vec![0; nq],
            thr: vec![OPEN; nq],
            skip,
            scratch: Vec::with_capacity(cap),
        }
    }

    /// Keeps the `width` smallest `(K', id)` of query `i` (dropping its excluded id); once
    /// `width` are held, the largest sets the threshold.
    #[inline(never)]
    fn cut(&mut self, i: usize) {
        let (keys, ids) = (
            &mut self.keys[i * self.cap..(i + 1) * self.cap],
            &mut self.ids[i * self.cap..(i + 1) * self.cap],
        );
        let v = &mut self.scratch;
        v.clear();
        let skip = self.skip[i];
        v.extend(
            keys.iter()
                .zip(ids.iter())
                .take(self.fill[i])
                .filter(|&(_, &id)| id != skip)
                .map(|(&k, &id)| pack(k, id)),
        );
        if v.len() > self.width {
            v.select_nth_unstable(self.width - 1);
            v.truncate(self.width);
        }
        for (j, &e) in v.iter().enumerate() {
            (keys[j], ids[j]) = unpack(e);
        }
        self.fill[i] = v.len();
        if v.len() == self.width {
            let worst = v.iter().max().map(|&e| unpack(e).0).expect("width > 0");
            self.thr[i] = filter(worst);
        }
    }
}

/// The codes of every query of a request, made once per request (its work units then read
/// their rows): `quads` words per query, and per query the shift from `K'` to `K`: `256·ΣQ`
/// for 8-bit codes, `ΣQ` for L1, 0 for 16-bit squared L2.
pub(crate) struct QueryCodes {
    words: Vec<u32>,
    shift: Vec<i32>,
}

impl QueryCodes {
    pub(crate) fn new(plan: &Plan, queries: MatrixRef<'_>) -> Self {
        let (quads, per) = (plan.quads, plan.products.per_word());
        let mut words = vec![0u32; queries.rows() * quads];
        let mut shift = vec![0i32; queries.rows()];
        words
            .par_chunks_mut(quads.max(1))
            .zip(shift.par_iter_mut())
            .enumerate()
            .for_each_init(
                || vec![0i16; quads * per],
                |x, (r, (out, shift))| {
                    plan.quantise(queries.row(r), x);
                    // K = K' + 256·ΣQ (8-bit codes), K' + ΣQ (L1), K' (16-bit squared L2).
                    let sum = || x.iter().map(|&v| v as i32).sum::<i32>();
                    if plan.kernel == Kernel::L1 {
                        *shift = sum();
                    } else if plan.products == Products::Vnni {
                        *shift = 256 * sum();
                    }
                    for (o, q) in out.iter_mut().zip(x.chunks_exact(per)) {
                        *o = plan.products.word(q, false);
                    }
                },
            );
        QueryCodes { words, shift }
    }
}

/// Folds the integer keys `K` of `queries[qr] × base[br]` into `tops`, like `gemm::fold_unit`.
pub(crate) fn fold_unit(
    req: &CandidateRequest<'_>,
    plan: &Plan,
    codes: &QueryCodes,
    qr: Range<usize>,
    br: Range<usize>,
    tops: &mut [TopK],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let quads = plan.quads;
        let nq = qr.len();
        let qcodes = &codes.words[qr.start * quads..qr.end * quads];
        let shift = &codes.shift[qr.clone()];
        let skip: Vec<u32> = (0..nq)
            .map(|i| req.exclude.map_or(u32::MAX, |e| e[qr.start + i]))
            .collect();
        let width = req.width.max(1);
        let mut buf = Buffers::new(nq, width, skip);
        // Blocks of NP panels from the panel holding `br.start`; lanes outside `br` masked.
        let mut p0 = br.start / LANES;
        while p0 * LANES < br.end {
            let first = p0 * LANES;
            let valid = (0..NP * LANES).fold(0u64, |m, j| {
                m | (((first + j >= br.start && first + j < br.end) as u64) << j)
            });
            let blk = Block {
                codes: &plan.codes[p0 * quads * LANES..(p0 + NP) * quads * LANES],
                init: &plan.init[p0 * LANES..(p0 + NP) * LANES],
                parity: &plan.parity[p0 * LANES..(p0 + NP) * LANES],
                first: first as u32,
                valid,
            };
            // SAFETY: `available()` found the plan's instructions before this path was chosen;
            // the slices hold NP panels and `qcodes` `quads` words per query.
            unsafe {
                match plan.products {
                    Products::Vnni => vnni::block(quads, &blk, qcodes, &mut buf),
                    Products::Avx2 if plan.kernel == Kernel::L1 => {
                        avx2::block::<true>(quads, &blk, qcodes, &mut buf)
                    }
                    Products::Avx2 => avx2::block::<false>(quads, &blk, qcodes, &mut buf),
                }
            };
            p0 += NP;
        }
        for (i, top) in tops.iter_mut().enumerate() {
            buf.cut(i);
            let at = i * buf.cap;
            for j in 0..buf.fill[i] {
                top.push((buf.keys[at + j] + shift[i]) as f32, buf.ids[at + j]);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (req, plan, codes, qr, br, tops);
        unreachable!("int8 path is only chosen on x86-64");
    }
}

/// `NP` consecutive panels (64 base points) for one micro-kernel call.
struct Block<'a> {
    codes: &'a [u32],
    init: &'a [i32],
    parity: &'a [i32],
    /// Id of lane 0.
    first: u32,
    /// Lanes inside the unit's base range.
    valid: u64,
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod vnni;

#[cfg(test)]
mod tests;
