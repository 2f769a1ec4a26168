//! The exact re-rank: each candidate's key in f64 from the exact-space rows, the k smallest by
//! (key, id), and whether the row's floor proves them complete.

use crate::engine::{CandidateRows, RowSink};
use crate::given::{lower_floor, GivenRows, Real, RowsFn};
use crate::matrix::MatrixRef;
use crate::metric::Metric;
use crate::topk::TopK;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// One row's candidates as the engine returned them.
pub(super) struct RowCandidates<'c> {
    pub(super) ids: &'c [u32],
    pub(super) keys: &'c [f32],
    pub(super) floor: f32,
    /// See [`Candidates::floor_bounds_rounding`].
    pub(super) floor_bounds_rounding: bool,
    /// The engine's exact keys of `ids`, when it gave them (see
    /// [`Engine::candidates_with_exact`]).
    pub(super) exact: Option<&'c [f64]>,
}

/// Per-thread buffers of the re-rank, so that no row allocates.
#[derive(Default)]
struct RowScratch {
    pairs: Vec<(f64, u32)>,
    ids: Vec<u32>,
    dists: Vec<f32>,
}

thread_local! {
    static ROW_SCRATCH: RefCell<RowScratch> = RefCell::default();
}

// Atomics of 32 bits are laid out as their integers (same size and bit validity) on every
// target this builds for; the views below rely on the alignment being the same too.
const _: () = assert!(std::mem::align_of::<AtomicU32>() == std::mem::align_of::<u32>());
const _: () = assert!(std::mem::align_of::<AtomicU32>() == std::mem::align_of::<f32>());

/// `v` as atomics, so that the rows the engine hands over on its threads are written in place
/// (relaxed stores: plain stores on common hardware).
pub(super) fn as_atomic(v: &mut [u32]) -> &[AtomicU32] {
    // SAFETY: `AtomicU32` has the size and bit validity of `u32` and (asserted above) its
    // alignment; the exclusive borrow of `v` means nothing else reads or writes it meanwhile.
    unsafe { &*(v as *mut [u32] as *const [AtomicU32]) }
}

/// `v` as atomics holding the bits of each `f32` (see [`as_atomic`]).
pub(super) fn as_atomic_f32(v: &mut [f32]) -> &[AtomicU32] {
    // SAFETY: as in `as_atomic`; `f32` has the size and alignment of `u32`, every bit pattern
    // is a valid `f32`, and the stores write `f32::to_bits` values.
    unsafe { &*(v as *mut [f32] as *const [AtomicU32]) }
}

thread_local! {
    /// A query's Hellinger roots (see [`BaseAux`]), reused from row to row.
    static QUERY_ROOTS: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// Largest base (values) whose Hellinger roots are kept as f64 for the run: 2²⁷ values, 1 GiB.
const ROOTS_MAX_VALUES: usize = 1 << 27;

/// Values of the base taken once per run that make a metric's exact keys cheaper, with the
/// same result bit for bit (`Metric::exact_key` computes them per pair).
pub(super) enum BaseAux {
    /// Hellinger: `(v as f64).sqrt()` of every base value, row-major.
    HellingerRoots(Vec<f64>),
    /// Cosine: `Σ v²` (f64, left to right) of every base row.
    CosineNorms(Vec<f64>),
}

impl BaseAux {
    /// Made on the first row that needs it, inside a rayon task: its work goes to threads of
    /// its own, because a rayon join in there could take up another row's task on this thread,
    /// which would wait for this very initialisation (a deadlock seen with 16 threads).
    pub(super) fn new(metric: &Metric, xb: MatrixRef<'_>) -> Option<BaseAux> {
        match metric {
            Metric::Hellinger if xb.as_slice().len() <= ROOTS_MAX_VALUES => {
                let mut roots = vec![0.0f64; xb.as_slice().len()];
                own_threads(&mut roots, xb.as_slice(), 1, |o, v| {
                    o[0] = (v[0] as f64).sqrt()
                });
                Some(BaseAux::HellingerRoots(roots))
            }
            Metric::Cosine => {
                let mut norms = vec![0.0f64; xb.rows()];
                own_threads(&mut norms, xb.as_slice(), xb.dim(), |o, row| {
                    o[0] = sum_sq(row)
                });
                Some(BaseAux::CosineNorms(norms))
            }
            _ => None,
        }
    }
}

/// `f(out[i..i+1], src[i·per..(i+1)·per])` for every `i`, on scoped threads of its own (one
/// per core), not on the rayon pool.
fn own_threads(out: &mut [f64], src: &[f32], per: usize, f: impl Fn(&mut [f64], &[f32]) + Sync) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let part = out.len().div_ceil(threads).max(1024);
    std::thread::scope(|sc| {
        for (o, s) in out.chunks_mut(part).zip(src.chunks(part * per)) {
            let f = &f;
            sc.spawn(move || {
                for (o, s) in o.chunks_mut(1).zip(s.chunks(per)) {
                    f(o, s)
                }
            });
        }
    });
}

/// `Σ v²` in f64, left to right: the `xx` / `yy` of `Metric::exact_key`'s cosine.
pub(super) fn sum_sq(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |s, &v| s + (v as f64) * (v as f64))
}

/// The cosine exact key of query `q` (with `qq = Σ q²`) against every candidate, appended to
/// `out` as (key, id): `Metric::exact_key`'s value bit for bit (0 with an all-zero row;
/// identical rows −1; else
/// −Σqb / (√qq·√bb), at least −1, with the sums left to right), eight candidates' dot products
/// interleaved.
pub(super) fn cosine_keys(
    q: &[f32],
    qq: f64,
    xb: MatrixRef<'_>,
    norms: &[f64],
    ids: &[u32],
    out: &mut Vec<(f64, u32)>,
) {
    let key = |xy: f64, b: u32| {
        let row = xb.row(b as usize);
        if qq == 0.0 || norms[b as usize] == 0.0 {
            0.0
        } else if q == row {
            -1.0
        } else {
            (-xy / (qq.sqrt() * norms[b as usize].sqrt())).max(-1.0)
        }
    };
    let mut chunks = ids.chunks_exact(8);
    for c in &mut chunks {
        let rows: [&[f32]; 8] = std::array::from_fn(|l| xb.row(c[l] as usize));
        let mut acc = [0.0f64; 8];
        for (j, &a) in q.iter().enumerate() {
            for l in 0..8 {
                acc[l] += (a as f64) * (rows[l][j] as f64);
            }
        }
        out.extend(c.iter().zip(acc).map(|(&b, xy)| (key(xy, b), b)));
    }
    for &b in chunks.remainder() {
        let xy = q
            .iter()
            .zip(xb.row(b as usize))
            .fold(0.0f64, |s, (&a, &v)| s + (a as f64) * (v as f64));
        out.push((key(xy, b), b));
    }
}

/// The Hellinger exact key of query roots `rq` against every candidate (base roots rows of
/// `rb`, `d` each), appended to `out` as (key, id): `Metric::exact_key`'s value bit for bit
/// (the same square roots, differences, squares and left-to-right sum), with eight candidates'
/// sums interleaved so that the f64 additions do not wait on each other.
pub(super) fn hellinger_keys(
    rq: &[f64],
    rb: &[f64],
    d: usize,
    ids: &[u32],
    out: &mut Vec<(f64, u32)>,
) {
    let mut chunks = ids.chunks_exact(8);
    for c in &mut chunks {
        let rows: [&[f64]; 8] = std::array::from_fn(|l| {
            let b = c[l] as usize;
            &rb[b * d..(b + 1) * d]
        });
        let mut acc = [0.0f64; 8];
        for (j, &q) in rq.iter().enumerate() {
            for l in 0..8 {
                let t = q - rows[l][j];
                acc[l] += t * t;
            }
        }
        out.extend(acc.into_iter().zip(c.iter().copied()));
    }
    for &b in chunks.remainder() {
        let row = &rb[b as usize * d..(b as usize + 1) * d];
        let key = rq.iter().zip(row).fold(0.0f64, |a, (&q, &r)| {
            let t = q - r;
            a + t * t
        });
        out.push((key, b));
    }
}

/// What stays fixed across the rows of one pipeline run.
pub(super) struct Rerank<'m, 'x> {
    pub(super) metric: &'m Metric,
    pub(super) xb: MatrixRef<'x>,
    /// Per-base values that make the exact keys cheaper (see [`BaseAux`]), taken on the first
    /// row that needs them: none when the engine gives every exact key.
    pub(super) aux: &'x OnceLock<Option<BaseAux>>,
    /// Whether this call's rows are many enough to pay for `aux` (a pass over the whole base)
    /// when it is not made yet: the few rows a first try left unproven are re-ranked pair by
    /// pair instead (making Hellinger's roots of 80 000 × 256 values for two such rows, and
    /// freeing them, took ~30 ms of a 75 ms GPU graph).
    pub(super) aux_pays: bool,
    /// The queries are the base rows (a graph): a query's values are its base row's.
    pub(super) self_join: bool,
    /// Queries of the exact space (read only when the engine gives no exact keys).
    pub(super) xq: MatrixRef<'x>,
    pub(super) k: usize,
    pub(super) key_scale: f64,
    /// `true` when the candidate lists hold every available point.
    pub(super) complete: bool,
    /// The rows as given, when some came in f64: exact keys are theirs, and floors are
    /// lowered by their rounding (see [`crate::given`]).
    pub(super) given: Option<&'x GivenRows<'x>>,
}

impl Rerank<'_, '_> {
    fn aux(&self) -> Option<&BaseAux> {
        if self.aux_pays {
            self.aux.get_or_init(|| BaseAux::new(self.metric, self.xb))
        } else {
            self.aux.get()?
        }
        .as_ref()
    }

    /// Re-ranks the row of query `qi` exactly into `ids_out` / `dists_out` (`k` each) and returns `true`
    /// when its floor proves it complete; `false` leaves the outputs unspecified (the row is
    /// asked again). `scratch` is reused across rows, so no row allocates.
    fn row(
        &self,
        qi: usize,
        c: &RowCandidates<'_>,
        scratch: &mut Vec<(f64, u32)>,
        ids_out: &mut [u32],
        dists_out: &mut [f32],
    ) -> bool {
        let (k, width) = (self.k, c.ids.len());
        scratch.clear();
        // The engine's rounding bound, recovered from its floor where the engine says it is
        // one: a candidate whose key less that bound exceeds an exact k-th key cannot enter
        // the top k.
        let slack = if c.floor_bounds_rounding && (c.floor as f64).is_finite() {
            c.keys[width - 1] as f64 - c.floor as f64
        } else {
            f64::INFINITY
        };
        // The floor in exact terms: what every point left out reaches at least.
        let mut floor = c.floor as f64 / self.key_scale;
        if let Some(g) = self.given {
            let qr = g.query_rounding(self.metric, qi);
            let lower = |f: f64| lower_floor(self.metric, f, qr, g.base_rounding);
            floor = lower_floor(self.metric, floor, qr, g.base_rounding);
            g.with_rows(
                qi,
                GivenKeys {
                    metric: self.metric,
                    c,
                    lower: &lower,
                    slack,
                    key_scale: self.key_scale,
                    k,
                    out: scratch,
                },
            );
        } else if let Some(exact) = c.exact {
            scratch.extend(exact.iter().copied().zip(c.ids.iter().copied()));
        } else if let Metric::Expr(e) = self.metric {
            // Expression keys are chains of dependent f64 operations: every candidate at once,
            // several chains interleaved, beats stopping early one key at a time.
            e.keys(self.xq.row(qi), self.xb, c.ids, scratch);
        } else if let Some(BaseAux::HellingerRoots(roots)) = self.aux() {
            let d = self.xb.dim();
            QUERY_ROOTS.with_borrow_mut(|own| {
                let rq = if self.self_join {
                    &roots[qi * d..(qi + 1) * d]
                } else {
                    own.clear();
                    own.extend(self.xq.row(qi).iter().map(|&v| (v as f64).sqrt()));
                    &own[..]
                };
                hellinger_keys(rq, roots, d, c.ids, scratch);
            });
        } else if let Some(BaseAux::CosineNorms(norms)) = self.aux() {
            let q = self.xq.row(qi);
            let qq = if self.self_join { norms[qi] } else { sum_sq(q) };
            cosine_keys(q, qq, self.xb, norms, c.ids, scratch);
        } else {
            let q = self.xq.row(qi);
            let mut kth_bound = f64::INFINITY;
            for (&b, &key) in c.ids.iter().zip(c.keys) {
                if scratch.len() >= k && key as f64 - slack > kth_bound {
                    break;
                }
                scratch.push((self.metric.exact_key(q, self.xb.row(b as usize)), b));
                if scratch.len() == k {
                    kth_bound = scratch
                        .iter()
                        .map(|e| e.0)
                        .fold(f64::NEG_INFINITY, f64::max)
                        * self.key_scale;
                }
            }
        }
        let by_key = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        if k < scratch.len() {
            scratch.select_nth_unstable_by(k - 1, by_key);
            scratch.truncate(k);
        }
        scratch.sort_unstable_by(by_key);
        let kth = scratch[k - 1].0;
        if !(kth < floor || self.complete) {
            return false;
        }
        finish_row(self.metric, scratch, ids_out, dists_out);
        true
    }
}

/// The exact keys of one row's candidates from the rows as given (see [`Rerank::given`]), in
/// the engine's order, stopping once no later candidate can enter the top k.
struct GivenKeys<'a, L: Fn(f64) -> f64> {
    metric: &'a Metric,
    c: &'a RowCandidates<'a>,
    /// The given rows' lower bound of a key from the rounded rows' one (exact terms).
    lower: &'a L,
    /// The engine's rounding bound (engine terms).
    slack: f64,
    key_scale: f64,
    k: usize,
    out: &'a mut Vec<(f64, u32)>,
}

impl<L: Fn(f64) -> f64> RowsFn<()> for GivenKeys<'_, L> {
    fn call<A: Real, B: Real>(self, q: &[A], base: &[B], d: usize) {
        let mut kth = f64::INFINITY;
        for (&b, &key) in self.c.ids.iter().zip(self.c.keys) {
            if self.out.len() >= self.k
                && (self.lower)((key as f64 - self.slack) / self.key_scale) > kth
            {
                break;
            }
            let row = &base[b as usize * d..(b as usize + 1) * d];
            self.out.push((self.metric.exact_key(q, row), b));
            if self.out.len() == self.k {
                kth = self
                    .out
                    .iter()
                    .map(|e| e.0)
                    .fold(f64::NEG_INFINITY, f64::max);
            }
        }
    }
}

/// Where the pipeline takes the rows of one engine call (see [`RowSink`]): each row re-ranked
/// as it comes and written in place when proven, the others collected to be asked again.
pub(super) struct Collector<'a> {
    pub(super) rerank: &'a Rerank<'a, 'a>,
    /// Request row `j` is query `start + j`, or `pending[j]` when the queries were gathered.
    pub(super) start: usize,
    pub(super) pending: Option<&'a [u32]>,
    /// Rows in the request.
    pub(super) requested: usize,
    /// Output row `i` is query `first + i`.
    pub(super) first: usize,
    pub(super) width: usize,
    pub(super) out_ids: &'a [AtomicU32],
    pub(super) out_dists: &'a [AtomicU32],
    /// Request rows whose floor did not prove them.
    pub(super) failed: Mutex<Vec<u32>>,
    pub(super) handed: AtomicUsize,
    pub(super) malformed: AtomicBool,
}

impl Collector<'_> {
    /// Query of request row `j`.
    fn query_of(&self, j: usize) -> usize {
        self.pending.map_or(self.start + j, |p| p[j] as usize)
    }
    /// Where the output row of request row `j` starts.
    fn out_at(&self, j: usize) -> usize {
        (self.query_of(j) - self.first) * self.rerank.k
    }
}

impl RowSink for Collector<'_> {
    /// The rows land at scattered places of the output: reads of their first and last values
    /// bring those lines (and their pages' translations) into cache while the engine computes
    /// the rows, so the writes later hit. Plain reads, not prefetch instructions: a prefetch
    /// that misses the TLB may be dropped, and these lines are spread over far more pages than
    /// the TLB holds (measured on the grid at k = 1: writing a row cost 3x less after reads
    /// than after prefetches).
    fn upcoming(&self, rows: &[u32]) {
        let (k, mut acc) = (self.rerank.k, 0u32);
        for &j in rows {
            if (j as usize) < self.requested {
                let at = self.out_at(j as usize);
                acc ^= self.out_ids[at].load(Relaxed) ^ self.out_ids[at + k - 1].load(Relaxed);
                acc ^= self.out_dists[at].load(Relaxed) ^ self.out_dists[at + k - 1].load(Relaxed);
            }
        }
        std::hint::black_box(acc);
    }

    fn take(&self, b: CandidateRows<'_>) {
        let width = self.width;
        if !b.is_consistent()
            || b.width != width
            || b.rows.iter().any(|&j| j as usize >= self.requested)
        {
            self.malformed.store(true, Relaxed);
            return;
        }
        let mut lost = Vec::new();
        ROW_SCRATCH.with_borrow_mut(|s| {
            let RowScratch { pairs, ids, dists } = s;
            ids.resize(self.rerank.k, 0);
            dists.resize(self.rerank.k, 0.0);
            for (i, &j) in b.rows.iter().enumerate() {
                let c = RowCandidates {
                    ids: &b.ids[i * width..(i + 1) * width],
                    keys: &b.keys[i * width..(i + 1) * width],
                    floor: b.floor[i],
                    floor_bounds_rounding: b.floor_bounds_rounding,
                    exact: b.exact.map(|e| &e[i * width..(i + 1) * width]),
                };
                if self
                    .rerank
                    .row(self.query_of(j as usize), &c, pairs, ids, dists)
                {
                    let at = self.out_at(j as usize);
                    for (t, (&id, &dist)) in ids.iter().zip(dists.iter()).enumerate() {
                        self.out_ids[at + t].store(id, Relaxed);
                        self.out_dists[at + t].store(dist.to_bits(), Relaxed);
                    }
                } else {
                    lost.push(j);
                }
            }
        });
        if !lost.is_empty() {
            self.failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(lost);
        }
        self.handed.fetch_add(b.rows.len(), Relaxed);
    }
}

/// The chosen k (selected by exact f64 key, sorted by (key, id)) as reported, into `ids` and
/// `dists`: f32 distances, ordered by (distance, id) — by decreasing similarity for the inner
/// product. Rounding to f32 can make distinct keys equal, so the order is fixed after rounding
/// (an insertion sort: the rows arrive sorted but for such groups).
pub(super) fn finish_row(
    metric: &Metric,
    exact: &[(f64, u32)],
    ids: &mut [u32],
    dists: &mut [f32],
) {
    let sign = if metric.is_similarity() { -1.0f32 } else { 1.0 };
    let before = |a: (f32, u32), b: (f32, u32)| {
        (sign * a.0)
            .total_cmp(&(sign * b.0))
            .then(a.1.cmp(&b.1))
            .is_lt()
    };
    for (t, e) in exact.iter().enumerate() {
        let item = (metric.distance_from_key(e.0), e.1);
        let mut p = t;
        while p > 0 && before(item, (dists[p - 1], ids[p - 1])) {
            dists[p] = dists[p - 1];
            ids[p] = ids[p - 1];
            p -= 1;
        }
        dists[p] = item.0;
        ids[p] = item.1;
    }
}

/// [`exact_scan`] of query `qi` over rows as given.
pub(super) fn exact_scan_given(
    metric: &Metric,
    given: &GivenRows<'_>,
    qi: usize,
    k: usize,
    skip: Option<u32>,
) -> Vec<(f64, u32)> {
    struct Scan<'m> {
        metric: &'m Metric,
        skip: Option<u32>,
        k: usize,
    }
    impl RowsFn<Vec<(f64, u32)>> for Scan<'_> {
        fn call<A: Real, B: Real>(self, q: &[A], base: &[B], d: usize) -> Vec<(f64, u32)> {
            let mut best = TopK::<f64>::new(self.k);
            for (row, b) in base.chunks_exact(d).zip(0u32..) {
                if Some(b) != self.skip {
                    best.push(self.metric.exact_key(q, row), b);
                }
            }
            best.into_sorted()
        }
    }
    given.with_rows(qi, Scan { metric, skip, k })
}

/// The k smallest exact keys of one query over the whole base, sorted by (key, id).
pub(crate) fn exact_scan(
    metric: &Metric,
    base: MatrixRef<'_>,
    q: &[f32],
    k: usize,
    skip: Option<u32>,
) -> Vec<(f64, u32)> {
    let mut best = TopK::<f64>::new(k);
    match metric {
        Metric::Expr(e) => {
            // Keys of a block of rows at a time (the expression's evaluator works on blocks).
            let ids: Vec<u32> = (0..base.rows() as u32)
                .filter(|&b| Some(b) != skip)
                .collect();
            let mut keys = Vec::with_capacity(EXPR_BLOCK.min(ids.len()));
            for block in ids.chunks(EXPR_BLOCK) {
                keys.clear();
                e.keys(q, base, block, &mut keys);
                keys.iter().for_each(|&(key, id)| best.push(key, id));
            }
        }
        _ => {
            for b in (0..base.rows() as u32).filter(|&b| Some(b) != skip) {
                best.push(metric.exact_key(q, base.row(b as usize)), b);
            }
        }
    }
    best.into_sorted()
}

/// Rows whose expression keys [`exact_scan`] computes at a time.
const EXPR_BLOCK: usize = 4096;
