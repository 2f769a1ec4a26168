//! The integer fast path for squared L2 (and L1 on AVX2) at small dimension: 8-bit codes on
//! AVX-512 VNNI, 12-bit codes on AVX2 (the file keeps its first form's name).
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
                    Products::Vnni => micro::block(quads, &blk, qcodes, &mut buf),
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
mod micro {
    use super::{Block, Buffers, LANES, NP};
    use std::arch::x86_64::*;

    /// Dispatches on the number of code words so the product loop is fully unrolled.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI must be available; `blk` holds `NP` panels of `quads` words per lane
    /// and `q` `quads` words per query of `buf`.
    #[inline]
    pub(super) unsafe fn block(quads: usize, blk: &Block<'_>, q: &[u32], buf: &mut Buffers) {
        macro_rules! go {
            ($($n:literal)*) => {
                match quads {
                    $($n => block_n::<$n>(blk, q, buf),)*
                    _ => unreachable!("d ≤ max_dim()"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }

    /// Keys of 64 base points × every query of the unit; keys passing a query's threshold are
    /// compressed into its buffer (see the module docs).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    // `t` indexes the codes of four panels and two queries in step.
    #[allow(clippy::needless_range_loop)]
    unsafe fn block_n<const QUADS: usize>(blk: &Block<'_>, q: &[u32], buf: &mut Buffers) {
        let nq = buf.fill.len();
        debug_assert!(q.len() >= nq * QUADS && blk.codes.len() >= NP * QUADS * LANES);
        let bp = blk.codes.as_ptr() as *const __m512i;
        // The block's codes stay in registers for all queries (16 zmm at d = 16).
        let b: [[__m512i; QUADS]; NP] = std::array::from_fn(|p| {
            std::array::from_fn(|t| _mm512_loadu_si512(bp.add(p * QUADS + t)))
        });
        let init: [__m512i; NP] = std::array::from_fn(|p| {
            _mm512_loadu_si512(blk.init.as_ptr().add(p * LANES) as *const _)
        });
        let iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        // Two queries per step: twice the independent accumulator chains in flight.
        let mut i = 0;
        while i < nq {
            let pair = i + 1 < nq;
            let j = if pair { i + 1 } else { i };
            let (qi, qj) = (q.as_ptr().add(i * QUADS), q.as_ptr().add(j * QUADS));
            let (mut a0, mut a1, mut a2, mut a3) = (init[0], init[1], init[2], init[3]);
            let (mut c0, mut c1, mut c2, mut c3) = (init[0], init[1], init[2], init[3]);
            for t in 0..QUADS {
                let w = _mm512_set1_epi32(*qi.add(t) as i32);
                let v = _mm512_set1_epi32(*qj.add(t) as i32);
                a0 = _mm512_dpbusd_epi32(a0, b[0][t], w);
                a1 = _mm512_dpbusd_epi32(a1, b[1][t], w);
                a2 = _mm512_dpbusd_epi32(a2, b[2][t], w);
                a3 = _mm512_dpbusd_epi32(a3, b[3][t], w);
                c0 = _mm512_dpbusd_epi32(c0, b[0][t], v);
                c1 = _mm512_dpbusd_epi32(c1, b[1][t], v);
                c2 = _mm512_dpbusd_epi32(c2, b[2][t], v);
                c3 = _mm512_dpbusd_epi32(c3, b[3][t], v);
            }
            let thi = _mm512_set1_epi32(*buf.thr.get_unchecked(i));
            let thj = _mm512_set1_epi32(*buf.thr.get_unchecked(j));
            // Usually nothing passes: one compare of the lane-wise maximum per query decides.
            let ti = _mm512_max_epi32(_mm512_max_epi32(a0, a1), _mm512_max_epi32(a2, a3));
            let tj = _mm512_max_epi32(_mm512_max_epi32(c0, c1), _mm512_max_epi32(c2, c3));
            let (hi, hj) = (
                _mm512_cmpgt_epi32_mask(ti, thi),
                _mm512_cmpgt_epi32_mask(tj, thj),
            );
            if hi | hj != 0 {
                if hi != 0 {
                    emit(blk, buf, i, [a0, a1, a2, a3], thi, iota);
                }
                if hj != 0 && pair {
                    emit(blk, buf, j, [c0, c1, c2, c3], thj, iota);
                }
            }
            i += 2;
        }
    }

    /// Appends the keys of `acc` (64 base points, query `i`) above the threshold `th` to the
    /// query's buffer; cuts the buffer when full.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn emit(
        blk: &Block<'_>,
        buf: &mut Buffers,
        i: usize,
        acc: [__m512i; NP],
        th: __m512i,
        iota: __m512i,
    ) {
        let mut m = 0u64;
        for (p, &a) in acc.iter().enumerate() {
            m |= (_mm512_cmpgt_epi32_mask(a, th) as u64) << (16 * p);
        }
        m &= blk.valid;
        if m == 0 {
            return;
        }
        let at = i * buf.cap;
        let mut fill = buf.fill[i];
        for (p, &a) in acc.iter().enumerate() {
            let mp = (m >> (16 * p)) as u16;
            if mp == 0 {
                continue;
            }
            // K' = parity − 2·acc, compressed with its ids.
            let par = _mm512_loadu_si512(blk.parity.as_ptr().add(p * LANES) as *const _);
            let k = _mm512_sub_epi32(par, _mm512_add_epi32(a, a));
            let ids = _mm512_add_epi32(
                _mm512_set1_epi32((blk.first + (p * LANES) as u32) as i32),
                iota,
            );
            debug_assert!(fill + LANES <= buf.cap);
            _mm512_storeu_si512(
                buf.keys.as_mut_ptr().add(at + fill) as *mut _,
                _mm512_maskz_compress_epi32(mp, k),
            );
            _mm512_storeu_si512(
                buf.ids.as_mut_ptr().add(at + fill) as *mut _,
                _mm512_maskz_compress_epi32(mp, ids),
            );
            fill += mp.count_ones() as usize;
        }
        buf.fill[i] = fill;
        if fill >= buf.limit {
            buf.cut(i);
        }
    }
}

/// The AVX2 form of [`micro`]: the same block of `NP` panels, each panel's 16 lanes in two
/// ymm vectors, taken in parts against two queries at a time.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Block, Buffers, LANES, NP};
    use std::arch::x86_64::*;

    /// The block's keys for squared L2 (`L1` false) or L1, dispatched on the number of code
    /// words so the word loop is unrolled.
    ///
    /// # Safety
    /// AVX2 must be available; `blk` holds `NP` panels of `quads` words per lane and `q`
    /// `quads` words per query of `buf`, 16-bit codes.
    #[inline]
    pub(super) unsafe fn block<const L1: bool>(
        quads: usize,
        blk: &Block<'_>,
        q: &[u32],
        buf: &mut Buffers,
    ) {
        macro_rules! go {
            ($($n:literal)*) => {
                match quads {
                    // Squared L2: two halves of 32 points; L1 (twice the registers a vector:
                    // its 16-bit sums) four parts of 16.
                    $($n if L1 => block_n::<$n, 2, true>(blk, q, buf),
                      $n => block_n::<$n, 4, false>(blk, q, buf),)*
                    _ => unreachable!("d ≤ max_dim()"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64)
    }

    /// Keys of 64 base points × every query of the unit, in parts of `PART` vectors of 8
    /// points, each against two queries at a time (each code vector loaded once for both).
    /// Squared L2, as `micro::block_n`: per code word, `vpmaddwd` adds each lane's two i16 ×
    /// i16 products into 32 bits. L1: `acc = Σmin(Q, B) − ⌊ΣB/2⌋`, per code word `vpminsw`
    /// and a 16-bit add; every `RUN` words the 16-bit sums (at most `RUN·2047 < 2¹⁵` each) go
    /// into the 32-bit lanes by `vpmaddwd` by ones.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::needless_range_loop)]
    unsafe fn block_n<const QUADS: usize, const PART: usize, const L1: bool>(
        blk: &Block<'_>,
        q: &[u32],
        buf: &mut Buffers,
    ) {
        const RUN: usize = 8;
        let nq = buf.fill.len();
        debug_assert!(q.len() >= nq * QUADS && blk.codes.len() >= NP * QUADS * LANES);
        let bp = blk.codes.as_ptr();
        let (ones, zero) = (_mm256_set1_epi16(1), _mm256_setzero_si256());
        for part in 0..2 * NP / PART {
            let init: [__m256i; PART] = std::array::from_fn(|h| {
                _mm256_loadu_si256(blk.init.as_ptr().add((part * PART + h) * 8) as *const _)
            });
            // Vector h of this part: lanes 8·(v % 2).. of panel v / 2, v = part·PART + h.
            let at: [usize; PART] = std::array::from_fn(|h| {
                let v = part * PART + h;
                (v / 2) * QUADS * LANES + 8 * (v % 2)
            });
            let mut i = 0;
            while i < nq {
                let pair = i + 1 < nq;
                let j = if pair { i + 1 } else { i };
                let (qi, qj) = (q.as_ptr().add(i * QUADS), q.as_ptr().add(j * QUADS));
                let (mut a, mut c) = (init, init);
                let mut t = 0;
                while t < QUADS {
                    let end = (t + RUN).min(QUADS);
                    let (mut sa, mut sc) = ([zero; PART], [zero; PART]);
                    for u in t..end {
                        let w = _mm256_set1_epi32(*qi.add(u) as i32);
                        let v = _mm256_set1_epi32(*qj.add(u) as i32);
                        for h in 0..PART {
                            let b = _mm256_loadu_si256(bp.add(at[h] + u * LANES) as *const __m256i);
                            if L1 {
                                sa[h] = _mm256_add_epi16(sa[h], _mm256_min_epi16(b, w));
                                sc[h] = _mm256_add_epi16(sc[h], _mm256_min_epi16(b, v));
                            } else {
                                a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(b, w));
                                c[h] = _mm256_add_epi32(c[h], _mm256_madd_epi16(b, v));
                            }
                        }
                    }
                    if L1 {
                        for h in 0..PART {
                            a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(sa[h], ones));
                            c[h] = _mm256_add_epi32(c[h], _mm256_madd_epi16(sc[h], ones));
                        }
                    }
                    t = end;
                }
                for (x, row) in [(&a, i), (&c, j)].into_iter().take(1 + pair as usize) {
                    let th = _mm256_set1_epi32(*buf.thr.get_unchecked(row));
                    // Usually nothing passes: one compare of the lane-wise maximum decides.
                    let mut top = x[0];
                    for &y in &x[1..] {
                        top = _mm256_max_epi32(top, y);
                    }
                    if _mm256_movemask_epi8(_mm256_cmpgt_epi32(top, th)) != 0 {
                        emit(blk, buf, row, x, part * PART, th);
                    }
                }
                i += 2;
            }
        }
    }

    /// Appends the keys of `acc` (vectors `first..` of the block's eight, query `i`) above the
    /// threshold `th` to the query's buffer; cuts the buffer when full.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn emit(
        blk: &Block<'_>,
        buf: &mut Buffers,
        i: usize,
        acc: &[__m256i],
        first: usize,
        th: __m256i,
    ) {
        let at = i * buf.cap;
        let mut fill = buf.fill[i];
        for (h, &a) in (first..).zip(acc) {
            let lanes = (blk.valid >> (8 * h)) as u32 & 0xff;
            let mut m =
                _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, th))) as u32 & lanes;
            if m == 0 {
                continue;
            }
            // K' = parity − 2·acc.
            let par = _mm256_loadu_si256(blk.parity.as_ptr().add(h * 8) as *const _);
            let mut k = [0i32; 8];
            _mm256_storeu_si256(
                k.as_mut_ptr() as *mut _,
                _mm256_sub_epi32(par, _mm256_add_epi32(a, a)),
            );
            let first = blk.first + (h * 8) as u32;
            debug_assert!(fill + 8 <= buf.cap);
            while m != 0 {
                let l = m.trailing_zeros() as usize;
                *buf.keys.get_unchecked_mut(at + fill) = k[l];
                *buf.ids.get_unchecked_mut(at + fill) = first + l as u32;
                fill += 1;
                m &= m - 1;
            }
        }
        buf.fill[i] = fill;
        if fill >= buf.limit {
            buf.cut(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knn_core::Kernel;

    /// Every instruction form this CPU runs gives each pair's integer key exactly, `K =
    /// ‖B‖² − 2·Q·B` of the codes (computed here in i64), with ids, for every base point of a
    /// range that starts and ends inside SIMD blocks, at dimensions on and off word edges, on
    /// codes at both ends of the range.
    #[test]
    fn kernels_give_the_codes_integer_keys() {
        let mut forms = vec![];
        if available() == Some(Products::Vnni) {
            forms.push(Products::Vnni);
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            forms.push(Products::Avx2);
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Values at the ends of the range too (codes ±c).
            match x % 8 {
                0 => -3.0,
                1 => 5.0,
                _ => (x >> 11) as f32 / (1u64 << 53) as f32 * 8.0 - 3.0,
            }
        };
        for (products, kernel) in forms
            .iter()
            .flat_map(|&p| [(p, Kernel::SqL2), (p, Kernel::L1)])
            .filter(|(p, k)| p.takes(*k))
        {
            for d in [1usize, 2, 3, 7, 16, 33, 64, 127, 128] {
                if d > products.max_dim() {
                    continue;
                }
                let (n, m) = (150, 9);
                let base: Vec<f32> = (0..n * d).map(|_| next()).collect();
                let queries: Vec<f32> = (0..m * d).map(|_| next()).collect();
                let (bm, qm) = (
                    MatrixRef::new("base", &base, d).unwrap(),
                    MatrixRef::new("queries", &queries, d).unwrap(),
                );
                let plan = Plan::new(bm, products, kernel).expect("keys fit");
                let br = 5..141;
                let req = CandidateRequest {
                    base: bm,
                    queries: qm,
                    kernel,
                    width: br.len(),
                    exclude: None,
                    precise: false,
                    base_key: None,
                    exact_data: false,
                    exact_from: None,
                };
                let mut tops: Vec<TopK> = (0..m).map(|_| TopK::new(br.len())).collect();
                let codes = QueryCodes::new(&plan, qm);
                fold_unit(&req, &plan, &codes, 0..m, br.clone(), &mut tops);
                let codes = |row: &[f32]| {
                    let mut c = vec![0i16; plan.quads * products.per_word()];
                    plan.quantise(row, &mut c);
                    c
                };
                for (i, top) in tops.into_iter().enumerate() {
                    let q = codes(qm.row(i));
                    let mut want: Vec<(f32, u32)> = br
                        .clone()
                        .map(|j| {
                            let b = codes(bm.row(j));
                            let key: i64 = if kernel == Kernel::L1 {
                                b.iter()
                                    .zip(&q)
                                    .map(|(&u, &v)| (u as i64 - v as i64).abs())
                                    .sum()
                            } else {
                                let bb: i64 = b.iter().map(|&v| v as i64 * v as i64).sum();
                                let qb: i64 =
                                    b.iter().zip(&q).map(|(&u, &v)| u as i64 * v as i64).sum();
                                bb - 2 * qb
                            };
                            (key as f32, j as u32)
                        })
                        .collect();
                    want.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    assert_eq!(
                        top.into_sorted(),
                        want,
                        "{products:?} {kernel:?} d={d} query {i}"
                    );
                }
            }
        }
    }
}
