//! [`GridEngine`]: the [`Engine`] face of the grid — index cache, query ordering, floors.

use crate::best::Best;
use crate::build::{counting_sort, GridIndex, MAX_AXES};
use crate::search::{f32_below, search_level, KeyKind, Linf, SqL2, L1};
use knn_core::{
    CandidateRequest, CandidateRows, Candidates, Engine, Kernel, KnnError, Result, RowSink, Threads,
};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// Unit roundoff of f32.
const F32_UNIT: f64 = 1.0 / (1u64 << 24) as f64;
/// Queries per parallel task: consecutive queries (in cell order) share cells in cache.
const QUERY_CHUNK: usize = 256;

/// Exact kNN on a uniform grid with sub-grids for crowded cells, for low dimensions.
///
/// Kernels: squared L2 (so the metrics `sqeuclidean`, `l2`, `hellinger`, `mahalanobis`), L1
/// and L∞. The inner product and cosine (`Kernel::NegDot`) have no distance-to-cell bound and
/// are refused with [`KnnError::Option`]. Any dimension is accepted: beyond d = 3 the three
/// widest coordinates are gridded and the others only enter the keys (exact, but the grid
/// prunes less as d grows; it is meant for d ≤ 3 or so).
///
/// The index of a base is built on first use and cached (one base at a time), keyed by the
/// slice's address, length and dimension and verified against a copy of the values, so a
/// base changed in place or a new one at a reused address is never served a stale grid.
#[derive(Debug, Default)]
pub struct GridEngine {
    /// Its own pool when a thread count was given; else rayon's global pool.
    pool: Threads,
    cache: Mutex<Option<Arc<Cached>>>,
}

/// A built index with what identifies its base.
struct Cached {
    addr: usize,
    dim: usize,
    /// The base values in their original order, compared on every use.
    values: Vec<f32>,
    index: GridIndex,
}

impl std::fmt::Debug for Cached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cached(n={}, d={})", self.index.ids.len(), self.dim)
    }
}

impl GridEngine {
    /// An engine on `threads` threads (`None`: rayon's global pool, one thread per core).
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let pool = Threads::new(threads)?;
        Ok(Self {
            pool,
            cache: Mutex::new(None),
        })
    }

    /// Worker threads used.
    pub fn threads(&self) -> usize {
        self.pool.count()
    }

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// The index of `base`: the cached one when it is the same data, else a new build.
    fn index(&self, base: &[f32], dim: usize) -> Arc<Cached> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.as_ref() {
            if c.addr == base.as_ptr() as usize && c.dim == dim && same_values(&c.values, base) {
                return c.clone();
            }
        }
        *cache = None; // free the old index before building the next
        let built = Arc::new(Cached {
            addr: base.as_ptr() as usize,
            dim,
            values: base.to_vec(),
            index: GridIndex::build(base, dim),
        });
        *cache = Some(built.clone());
        built
    }

    /// Builds (or fetches) the index of `base` and reports its shape: (levels, largest leaf
    /// cell population). For benchmarks and tests.
    pub fn index_shape(&self, base: knn_core::MatrixRef<'_>) -> (usize, usize) {
        self.install(|| self.index(base.as_slice(), base.dim()).index.shape())
    }
}

/// Bitwise equality of two value slices, in parallel, as a branch-free OR of XORs that
/// vectorises and reads both at memory speed (the pipeline calls `candidates` once per round of
/// queries, so this runs often). `-0.0` and `0.0` differ here: that only costs a rebuild.
fn same_values(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.par_chunks(1 << 16)
            .zip(b.par_chunks(1 << 16))
            .all(|(x, y)| {
                x.iter()
                    .zip(y)
                    .fold(0u32, |acc, (p, q)| acc | (p.to_bits() ^ q.to_bits()))
                    == 0
            })
}

impl Engine for GridEngine {
    fn name(&self) -> String {
        "grid".into()
    }

    /// Exactly k: the floor comes from the points and cells the search left out (see
    /// `src/best.rs`), not from extra candidates, and every extra candidate would widen the
    /// searched region.
    fn candidate_width(&self, k: usize, available: usize, _kernel: Kernel) -> usize {
        k.min(available)
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        Ok(self.gather(req, false)?.0)
    }

    /// The exact keys come from the index's own copy of the points (the same f32 values as
    /// the base, read back from cache right after the search), through `req.kernel.exact`;
    /// none for data derived from other rows (`req.exact_from`).
    fn candidates_with_exact(
        &self,
        req: &CandidateRequest<'_>,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        self.gather(req, req.exact_from.is_none())
    }

    /// Rows in the grid's own order (queries sorted by cell), handed over in batches of
    /// `QUERY_CHUNK` right after their search, with the exact keys computed from the index's copy
    /// of the points.
    fn candidate_rows(
        &self,
        req: &CandidateRequest<'_>,
        want_exact: bool,
        sink: &dyn RowSink,
    ) -> Result<()> {
        self.search(req, want_exact && req.exact_from.is_none(), sink)
    }

    /// All queries of a round in one call: the queries are sorted by cell, and the more of
    /// them, the more consecutive queries share cells in cache.
    fn min_round_queries(&self) -> usize {
        1 << 20
    }
}

impl GridEngine {
    /// Candidates of `req` in the caller's row order, with their exact keys when `exact` is
    /// set.
    fn gather(
        &self,
        req: &CandidateRequest<'_>,
        exact: bool,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        let (nq, width) = (req.queries.rows(), req.width);
        let mut ids = vec![0u32; nq * width];
        let mut keys = vec![0f32; nq * width];
        let mut exact_keys = vec![0f64; if exact { nq * width } else { 0 }];
        let mut floor = vec![f32::INFINITY; nq];
        let write = Scatter {
            nq,
            width,
            exact,
            out: RowWriter {
                ids: SyncPtr(ids.as_mut_ptr()),
                keys: SyncPtr(keys.as_mut_ptr()),
                exact: SyncPtr(exact_keys.as_mut_ptr()),
                floor: SyncPtr(floor.as_mut_ptr()),
            },
        };
        self.search(req, exact, &write)?;
        let exact_keys = exact.then_some(exact_keys);
        Ok((
            Candidates {
                width,
                ids,
                keys,
                floor,
                // Floors from the cells left out, not the keys' rounding.
                floor_bounds_rounding: false,
            },
            exact_keys,
        ))
    }

    /// Searches every query of `req`, handing the rows to `sink` (with exact keys when
    /// `exact` is set).
    fn search(&self, req: &CandidateRequest<'_>, exact: bool, sink: &dyn RowSink) -> Result<()> {
        if req.kernel == Kernel::NegDot {
            return Err(KnnError::Option(
                "the grid method supports l2, sqeuclidean, hellinger, mahalanobis, l1 and linf; \
                 the inner product and cosine have no distance-to-cell bound (use the cpu method)"
                    .into(),
            ));
        }
        if req.base.rows() == 0 {
            return Err(KnnError::EmptyBase);
        }
        if req.queries.dim() != req.base.dim() {
            return Err(KnnError::DimMismatch {
                base: req.base.dim(),
                queries: req.queries.dim(),
            });
        }
        if req.width == 0 || req.width > req.available() {
            return Err(KnnError::KTooLarge {
                k: req.width,
                n: req.available(),
                hint: " (candidate width)".into(),
            });
        }
        self.install(|| {
            let cached = self.index(req.base.as_slice(), req.base.dim());
            let ix = &cached.index;
            match (req.kernel, ix.d) {
                (Kernel::SqL2, 1) => run::<SqL2, 1>(ix, req, exact, sink),
                (Kernel::SqL2, 2) => run::<SqL2, 2>(ix, req, exact, sink),
                (Kernel::SqL2, 3) => run::<SqL2, 3>(ix, req, exact, sink),
                (Kernel::SqL2, _) => run::<SqL2, 0>(ix, req, exact, sink),
                (Kernel::L1, 1) => run::<L1, 1>(ix, req, exact, sink),
                (Kernel::L1, 2) => run::<L1, 2>(ix, req, exact, sink),
                (Kernel::L1, 3) => run::<L1, 3>(ix, req, exact, sink),
                (Kernel::L1, _) => run::<L1, 0>(ix, req, exact, sink),
                (Kernel::Linf, 1) => run::<Linf, 1>(ix, req, exact, sink),
                (Kernel::Linf, 2) => run::<Linf, 2>(ix, req, exact, sink),
                (Kernel::Linf, 3) => run::<Linf, 3>(ix, req, exact, sink),
                (Kernel::Linf, _) => run::<Linf, 0>(ix, req, exact, sink),
                (Kernel::NegDot, _) => unreachable!("refused above"),
            }
            Ok(())
        })
    }
}

/// Rounding bound of a direct f32 key whose computed value is `worst`: every term is
/// non-negative, so `|computed − exact| ≤ γ·exact` with `γ ≈ (d+2)·u` for any summation order;
/// [`Kernel::error_bound`]'s relative form (`(d+8)·u`, for L1 and L∞) covers it with the same
/// slack for the preparation step as the other engines.
fn rounding_bound(d: usize, worst: f32) -> f32 {
    Kernel::L1.error_bound(d, 0.0, 0.0, worst, F32_UNIT, 0.0)
}

/// The largest f32 not above `x`.
fn round_down(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) > x {
        f.next_down()
    } else {
        f
    }
}

/// Runs every query of `req` through the grid: queries in root-cell order, in parallel chunks,
/// each chunk's rows announced to `sink` before its search and handed over right after. With `want_exact`, also the exact key
/// (`req.kernel.exact`) of every candidate, computed from the index's copy of its coordinates.
fn run<K: KeyKind, const D: usize>(
    ix: &GridIndex,
    req: &CandidateRequest<'_>,
    want_exact: bool,
    sink: &dyn RowSink,
) {
    debug_assert_eq!(K::KERNEL, req.kernel);
    let nq = req.queries.rows();
    let width = req.width;
    let d = ix.d;
    let available = req.available();
    let root = &ix.root;
    let axes_of = |q: &[f32]| -> [f32; MAX_AXES] {
        std::array::from_fn(|j| if j < ix.g { q[ix.axes[j]] } else { 0.0 })
    };
    // Queries sorted by root cell (then index) with a counting sort, coordinates and original
    // index together: neighbours in the grid run one after another, read sequentially.
    let cell_of: Vec<u32> = req
        .queries
        .as_slice()
        .par_chunks(d)
        .with_min_len(4096)
        .map(|q| {
            let qa = axes_of(q);
            let mut c = 0usize;
            for j in (0..ix.g).rev() {
                c = c * root.res[j] + root.axis_cell(j, qa[j]);
            }
            c as u32
        })
        .collect();
    let mut sorted_q = vec![0f32; nq * d];
    let mut order = vec![0u32; nq];
    counting_sort(
        req.queries.as_slice(),
        None,
        0,
        d,
        &cell_of,
        root.cells(),
        &mut sorted_q,
        &mut order,
    );
    drop(cell_of);

    order
        .par_chunks(QUERY_CHUNK)
        .zip(sorted_q.par_chunks(QUERY_CHUNK * d))
        .for_each(|(ord, qs)| {
            sink.upcoming(ord);
            let mut best = Best::new(width, &ix.ids);
            let m = ord.len();
            let (mut ids, mut keys) = (vec![0u32; m * width], vec![0f32; m * width]);
            let mut exact = vec![0f64; if want_exact { m * width } else { 0 }];
            let mut floors = vec![0f32; m];
            for (i, (&qi, q)) in ord.iter().zip(qs.chunks_exact(d)).enumerate() {
                let qi = qi as usize;
                best.reset(req.exclude.map(|e| e[qi]));
                search_level::<K, D>(ix, root, q, &axes_of(q), &mut best);
                // Final selection first: it may evict pairs into the runner-up.
                best.finish();
                // Left out: examined points (computed key ≥ runner-up, so exact key ≥
                // runner-up − its rounding bound) and skipped regions (proven bounds).
                let r = best.runner_up;
                let examined = if r.is_finite() {
                    r as f64 - rounding_bound(d, r) as f64
                } else {
                    f64::INFINITY
                };
                floors[i] = if width < available {
                    round_down(examined).min(f32_below(best.skipped))
                } else {
                    f32::INFINITY
                };
                let items = best.selected();
                debug_assert_eq!(items.len(), width);
                for (t, (k, pos)) in items.enumerate() {
                    let at = i * width + t;
                    keys[at] = k;
                    ids[at] = ix.ids[pos as usize];
                    if want_exact {
                        let p = &ix.points[pos as usize * d..(pos as usize + 1) * d];
                        exact[at] = if D > 0 {
                            K::exact(q, p)
                        } else {
                            req.kernel.exact(q, p)
                        };
                    }
                }
            }
            sink.take(CandidateRows {
                rows: ord,
                width,
                ids: &ids,
                keys: &keys,
                floor: &floors,
                floor_bounds_rounding: false,
                exact: want_exact.then_some(&exact[..]),
            });
        });
}

/// A raw pointer that may cross threads: the query loop writes disjoint rows through it.
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);
// SAFETY: only used by `Scatter`, where every row is written by exactly one query.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

/// Where `GridEngine::gather` writes its rows (caller order).
struct Scatter {
    nq: usize,
    width: usize,
    exact: bool,
    out: RowWriter,
}

impl RowSink for Scatter {
    fn take(&self, b: CandidateRows<'_>) {
        let (out, width) = (&self.out, self.width);
        assert!(b.is_consistent() && b.width == width && b.exact.is_some() == self.exact);
        for (i, &qi) in b.rows.iter().enumerate() {
            let qi = qi as usize;
            assert!(qi < self.nq);
            let at = qi * width;
            let from = i * width..(i + 1) * width;
            // SAFETY: `GridEngine::search` hands over each row `qi < nq` once (its queries
            // are a permutation of `0..nq`), so no two writes alias, and the lengths asserted
            // above keep every write inside the vectors, which outlive the search and are not
            // otherwise accessed during it.
            unsafe {
                *out.floor.0.add(qi) = b.floor[i];
                let (ids, keys) = (&b.ids[from.clone()], &b.keys[from.clone()]);
                std::ptr::copy_nonoverlapping(ids.as_ptr(), out.ids.0.add(at), width);
                std::ptr::copy_nonoverlapping(keys.as_ptr(), out.keys.0.add(at), width);
                if let Some(e) = b.exact {
                    let e = &e[from];
                    std::ptr::copy_nonoverlapping(e.as_ptr(), out.exact.0.add(at), width);
                }
            }
        }
    }
}

/// The vectors of [`Scatter`].
struct RowWriter {
    ids: SyncPtr<u32>,
    keys: SyncPtr<f32>,
    exact: SyncPtr<f64>,
    floor: SyncPtr<f32>,
}
