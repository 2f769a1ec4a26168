//! [`CpuEngine`]: splits the work into units of (query tile × base range), runs them on rayon,
//! merges the per-unit top-k lists.

use crate::symmetric::SymmetricStats;
use knn_core::{
    CandidateRequest, Candidates, Engine, ExprPlan, GraphRequest, Kernel, KnnError, MatrixRef,
    Result, Symmetry, Threads,
};
use std::sync::{Arc, Mutex};

/// Queries per work unit: the GEMM block is `QUERY_TILE × BASE_TILE` f32 (512 KiB, in L2).
pub(crate) const QUERY_TILE: usize = 256;
/// Base points per GEMM block.
pub(crate) const BASE_TILE: usize = 512;
/// Unit roundoff of f32.
pub(crate) const F32_UNIT: f64 = 1.0 / (1u64 << 24) as f64;

/// The multithreaded CPU engine.
#[derive(Clone, Debug, Default)]
pub struct CpuEngine {
    /// Its own pool when a thread count was given; else rayon's global pool (one per core).
    pool: Threads,
    /// Never use the bf16 or int8 fast paths (for comparison and tests).
    f32_only: bool,
    /// Never use the int8 fast path (for comparison and tests).
    no_int8: bool,
    /// Whether kNN graphs compute each unordered pair once ([`Engine::graph_candidates`]).
    symmetry: Symmetry,
    /// The GEMM plans of the base last searched (shared by clones).
    plans: Arc<Mutex<BasePlans>>,
}

/// The GEMM plans (mean, squared norms, norm bound: a pass over every base row each) of one
/// base, by (kernel, bf16), and its integer codes, kept for the base the pipeline names by
/// [`CandidateRequest::base_key`]: an index's searches derive them once, not once a call
/// (0.2 s of a 268-query search against 10⁶ × 128 rows on 2 cores). A request for another base
/// replaces them; a few bytes a base row, and `d` or `2d` bytes for the codes.
#[derive(Default)]
struct BasePlans {
    key: Option<u64>,
    gemm: Vec<((Kernel, bool), Arc<GemmPlan>)>,
    /// The integer path's plan once made (`Some(None)`: the base's keys could overflow it).
    int8: Option<Option<Arc<crate::int8::Plan>>>,
}

impl BasePlans {
    /// Ready to keep plans of the base keyed `key`: another base's are dropped.
    fn keep_for(&mut self, key: u64) {
        if self.key != Some(key) {
            *self = BasePlans {
                key: Some(key),
                ..BasePlans::default()
            };
        }
    }
}

impl std::fmt::Debug for BasePlans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasePlans")
            .field("key", &self.key)
            .field("plans", &self.gemm.len())
            .finish()
    }
}

impl CpuEngine {
    /// An engine on `threads` threads (`None`: all cores).
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let pool = Threads::new(threads)?;
        Ok(Self {
            pool,
            f32_only: false,
            no_int8: false,
            symmetry: Symmetry::Auto,
            plans: Arc::default(),
        })
    }

    /// `req`'s integer plan, when the request takes the integer path (first tries of a kernel
    /// at a dimension the CPU's form takes): kept like the GEMM plans, and made only for a
    /// request of at least the form's [`Products::min_queries`](crate::int8::Products::min_queries).
    fn int8_plan(&self, req: &CandidateRequest<'_>) -> Option<Arc<crate::int8::Plan>> {
        let products = crate::int8::available()?;
        if !self.int8_for(req.kernel) || req.precise || req.base.dim() > products.max_dim() {
            return None;
        }
        let enough = req.queries.rows() >= products.min_queries();
        let make = || crate::int8::Plan::new(req.base, products, req.kernel).map(Arc::new);
        let Some(key) = req.base_key else {
            return enough.then(make).flatten();
        };
        {
            let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
            if let (Some(k), Some(plan)) = (plans.key, &plans.int8) {
                if k == key {
                    return plan.clone();
                }
            }
        }
        if !enough {
            return None;
        }
        // Made without the lock, as the GEMM plans.
        let plan = make();
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        plans.keep_for(key);
        plans.int8 = Some(plan.clone());
        plan
    }

    /// `req`'s GEMM plan: kept from an earlier request of the same base key, or made (and
    /// kept when the request has a base key).
    fn gemm_plan(&self, req: &CandidateRequest<'_>, bf16: bool) -> Arc<GemmPlan> {
        let at = (req.kernel, bf16);
        let kept = |plans: &BasePlans| {
            plans
                .gemm
                .iter()
                .find(|(k, _)| *k == at)
                .map(|(_, p)| p.clone())
        };
        let Some(key) = req.base_key else {
            return Arc::new(GemmPlan::new(req, bf16));
        };
        {
            let plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
            if plans.key == Some(key) {
                if let Some(p) = kept(&plans) {
                    return p;
                }
            }
        }
        // Made without the lock: other threads' searches go on meanwhile.
        let plan = Arc::new(GemmPlan::new(req, bf16));
        let mut plans = self.plans.lock().unwrap_or_else(|p| p.into_inner());
        plans.keep_for(key);
        if kept(&plans).is_none() {
            plans.gemm.push((at, plan.clone()));
        }
        plan
    }

    /// The same engine with kNN graphs computed symmetrically `On`, `Off` or where it pays
    /// (`Auto`, the default; see [`CpuEngine::pays_symmetric`]). The symmetric path holds every
    /// row's list at once, `n·(24·width + 20)` bytes; `On` takes it whatever that comes to.
    pub fn with_symmetry(mut self, symmetry: Symmetry) -> Self {
        self.symmetry = symmetry;
        self
    }

    /// `Auto`'s rule: a graph of `n` points of dimension `d` is computed symmetrically when
    /// `n ≥` [`SYMMETRIC_MIN_POINTS`], its `n` running lists of `width` fit
    /// [`SYMMETRIC_LIST_BYTES`], and the one-sided path would not take the integer kernel
    /// (squared L2 at `d ≤ 64` on AVX-512 VNNI, `d ≤ 128` on AVX2), which has no symmetric
    /// form: there the symmetric bf16 path measured 0.8× of the one-sided int8 path (n =
    /// 20 000, d = 16 to 64), and on AVX2 the symmetric f32 path 0.59× at d = 16, 0.85× at
    /// d = 100 and 0.98× at d = 128 of the one-sided 16-bit path. Elsewhere it measured 1.1× to
    /// 2× faster (see `bench/graph/README.md`). L1 graphs stay symmetric: the symmetric direct
    /// path (half the pairs) measured 1.09× (d = 16) to 1.24× (d = 64) faster than the
    /// one-sided 16-bit path on AVX2 (n = 20 000).
    pub fn pays_symmetric(&self, n: usize, d: usize, kernel: Kernel, width: usize) -> bool {
        // (A graph's queries are its n points.)
        let int8 = kernel == Kernel::SqL2
            && self.int8_for(kernel)
            && crate::int8::available().is_some_and(|p| d <= p.max_dim() && n >= p.min_queries());
        n >= SYMMETRIC_MIN_POINTS && list_bytes(n, width) <= SYMMETRIC_LIST_BYTES && !int8
    }

    /// The symmetric self-join itself, whatever the engine's [`Symmetry`]: candidates of every
    /// row of the kNN graph of `points` (as [`Engine::graph_candidates`]) and what it computed.
    /// Needs `2 ≤ points.rows()` and `1 ≤ width < points.rows()`.
    pub fn symmetric_candidates(
        &self,
        points: MatrixRef<'_>,
        kernel: Kernel,
        width: usize,
        precise: bool,
    ) -> Result<(Candidates, SymmetricStats)> {
        let n = points.rows();
        if n < 2 || width == 0 || width >= n {
            return Err(KnnError::Option(format!(
                "symmetric candidates need 2 or more points and 1 <= width < n (n={n}, width={width})"
            )));
        }
        let run = || {
            crate::symmetric::graph_candidates(
                points,
                kernel,
                width,
                self.bf16_for(kernel),
                precise,
            )
        };
        Ok(self.pool.install(run))
    }

    /// The same engine restricted to f32 products (no bf16 fast path).
    pub fn f32_only(mut self) -> Self {
        self.f32_only = true;
        self
    }

    /// The same engine without the integer path (squared L2 at small `d` then takes bf16 or
    /// f32, L1 the direct kernels).
    pub fn without_int8(mut self) -> Self {
        self.no_int8 = true;
        self
    }

    fn bf16(&self) -> bool {
        !self.f32_only && crate::bf16::available()
    }

    /// Whether first tries of `kernel` at `d ≤ Products::max_dim` take the integer products
    /// (squared L2 on AVX-512 VNNI or AVX2, L1 on AVX2). The 8-bit form only beside the bf16
    /// path, whose wider candidate lists ([`Engine::candidate_width`]) its bound was measured
    /// with; the 12-bit form's bound is close to f32's.
    fn int8_for(&self, kernel: Kernel) -> bool {
        !self.f32_only
            && !self.no_int8
            && match crate::int8::available() {
                Some(crate::int8::Products::Vnni) => self.bf16() && kernel == Kernel::SqL2,
                Some(p) => p.takes(kernel),
                None => false,
            }
    }

    /// Whether first tries of `kernel` take the bf16 products: squared L2 only. Its bound
    /// (2·2⁻⁸‖q‖‖b‖, on centred data) leaves 0.3 % of rows to retry on uniform data; for the
    /// negated inner product (ip, cosine) the same bound is about 1 % of the keys themselves,
    /// wider than the gaps near the k-th neighbour: every row of a cosine graph (n = 2e4,
    /// d = 256, k = 100) failed it and paid an f32 pass on top.
    fn bf16_for(&self, kernel: Kernel) -> bool {
        self.bf16() && kernel == Kernel::SqL2
    }

    /// Worker threads used.
    pub fn threads(&self) -> usize {
        self.pool.count()
    }
}

/// Graphs below this many points (one SIMD group of rows) take the one-sided path under
/// [`Symmetry::Auto`]: they cost well under a millisecond either way (measured 1.1–1.3× in
/// favour of the symmetric path from 64 to 200 points).
pub const SYMMETRIC_MIN_POINTS: usize = 64;
/// Memory for the running lists and candidates of a symmetric graph under [`Symmetry::Auto`]
/// (the one-sided path holds only one round's): 1 GiB, about 1.8 million points at k = 10.
pub const SYMMETRIC_LIST_BYTES: usize = 1 << 30;

/// Bytes the symmetric path holds for `n` rows of `width` candidates: per row a buffer of
/// `2·width` packed pairs, its length, cut and threshold, and the `width` ids and keys handed
/// to the pipeline.
fn list_bytes(n: usize, width: usize) -> usize {
    n.saturating_mul(24 * width + 20)
}

impl Engine for CpuEngine {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn candidate_width(&self, k: usize, available: usize, kernel: Kernel) -> usize {
        // The bf16 fast path rounds inputs to 8 bits: ask for more candidates so its wider
        // error bound rarely forces a retry (pushes beyond the threshold are rare, so a wider
        // list costs little).
        let w = if self.bf16_for(kernel) {
            k + 20 + k / 2
        } else {
            k + 4 + k / 16
        };
        w.min(available)
    }

    fn candidates_expr(&self, req: &CandidateRequest<'_>, plan: &ExprPlan) -> Result<Candidates> {
        Ok(self.pool.install(|| crate::expr::candidates(req, plan)))
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        let bf16 = self.bf16_for(req.kernel) && !req.precise;
        let plan = |req: &CandidateRequest<'_>| self.gemm_plan(req, bf16);
        Ok(self
            .pool
            .install(|| candidates(req, self.int8_plan(req), &plan)))
    }

    /// The bf16 and integer products of first tries (squared L2; L1 on AVX2).
    fn fast_first_tries(&self, kernel: Kernel) -> bool {
        self.bf16_for(kernel) || self.int8_for(kernel)
    }

    fn graph_candidates(&self, graph: GraphRequest<'_>) -> Option<Result<Candidates>> {
        let GraphRequest {
            points,
            kernel,
            width,
            precise,
        } = graph;
        let n = points.rows();
        let wanted = match self.symmetry {
            Symmetry::Off => false,
            Symmetry::On => true,
            Symmetry::Auto => self.pays_symmetric(n, points.dim(), kernel, width),
        };
        if !wanted || n < 2 || width == 0 || width >= n {
            return None;
        }
        Some(
            self.symmetric_candidates(points, kernel, width, precise)
                .map(|(c, stats)| {
                    if std::env::var_os("KNN_PROFILE").is_some() {
                        eprintln!("cpu symmetric graph: {n} points, {stats:?}");
                    }
                    c
                }),
        )
    }
}

/// How the GEMM-form keys of one request are computed.
pub(crate) struct GemmPlan {
    /// Subtracted from base and queries before the products (bf16 path, squared L2): smaller
    /// norms, tighter bound. Translation does not change squared distances.
    pub mean: Option<Vec<f32>>,
    /// Products of bf16-rounded inputs (AVX-512 BF16, twice the f32 rate) or of f32 values.
    pub bf16: bool,
    /// Squared norms of the (centred) base points and their largest norm.
    pub norms: crate::gemm::BaseNorms,
}

impl GemmPlan {
    pub(crate) fn new(req: &CandidateRequest<'_>, bf16: bool) -> Self {
        let mean = (bf16 && req.kernel == Kernel::SqL2).then(|| crate::gemm::mean(req.base));
        let norms = crate::gemm::sq_norms(req.base, mean.as_deref());
        GemmPlan { mean, bf16, norms }
    }

    /// Input roundoff of the products.
    fn input_unit(&self) -> f64 {
        if self.bf16 {
            crate::bf16::BF16_UNIT
        } else {
            0.0
        }
    }

    /// `|computed key − exact key| ≤ bound` for query `q` (dimension `d`) and every base point
    /// whose whole computed key (`‖q‖²` included for squared L2) is at most `worst`:
    /// [`Kernel::error_bound`] with the norms of the (centred) data the products saw.
    pub(crate) fn bound(&self, kernel: Kernel, d: usize, q: &[f32], worst: f32) -> f32 {
        let qn = (crate::gemm::sq_norm_f64(q, self.mean.as_deref()).sqrt() * (1.0 + 1e-6)) as f32;
        kernel.error_bound(
            d,
            qn,
            self.norms.max_norm,
            worst,
            F32_UNIT,
            self.input_unit(),
        )
    }
}

/// Largest dimension whose f32 squared-L2 keys take the direct `Dot` form instead of a GEMM.
const DOT_MAX_DIM: usize = 24;

/// Candidates of `req`: with `int8`'s integer products when given, else with the GEMM plan
/// `plan` gives when one is needed, or a direct kernel.
fn candidates(
    req: &CandidateRequest<'_>,
    int8: Option<Arc<crate::int8::Plan>>,
    plan: &dyn Fn(&CandidateRequest<'_>) -> Arc<GemmPlan>,
) -> Candidates {
    let (nq, nb, d) = (req.queries.rows(), req.base.rows(), req.base.dim());
    let width = req.width;
    let codes = int8
        .as_ref()
        .map(|p| crate::int8::QueryCodes::new(p, req.queries));
    let plan = (req.kernel.is_gemm() && int8.is_none()).then(|| plan(req));
    let direct = match &plan {
        None => {
            (!req.kernel.is_gemm() && int8.is_none()).then(|| crate::direct::DirectPlan::new(req))
        }
        // Squared L2 at small d in f32: the products stay in registers (see `DirectOp::Dot`).
        Some(p) if !p.bf16 && req.kernel == Kernel::SqL2 && d <= DOT_MAX_DIM => {
            Some(crate::direct::DirectPlan::dot(p.norms.sq.clone()))
        }
        Some(_) => None,
    };
    // The fast paths pack each block once per unit: larger query tiles amortise it.
    let q_tile = if int8.is_some() || plan.as_ref().is_some_and(|p| p.bf16) {
        2 * QUERY_TILE
    } else {
        QUERY_TILE
    };
    let merged =
        crate::units::fold_units(
            (nq, nb),
            width,
            (q_tile, BASE_TILE),
            |qr, br, tops| match &plan {
                _ if int8.is_some() => crate::int8::fold_unit(
                    req,
                    int8.as_ref().expect("checked"),
                    codes.as_ref().expect("made with the plan"),
                    qr,
                    br,
                    tops,
                ),
                Some(p) if p.bf16 => crate::bf16::fold_unit(req, p, qr, br, tops),
                Some(p) if direct.is_none() => crate::gemm::fold_unit(req, &p.norms, qr, br, tops),
                _ => crate::direct::fold_unit(
                    req,
                    direct.as_ref().expect("a direct kernel has a plan"),
                    qr,
                    br,
                    tops,
                ),
            },
        );
    let available = req.available();
    crate::units::into_candidates(merged, width, |i, keys, floor| {
        if let Some(p) = &int8 {
            // Integer keys K → a·(o + K), the key of the quantised points (squared L2:
            // s²·(‖Q‖² + K); L1: s·K).
            let (o, a, e) = p.query_terms(req.queries.row(i));
            let mut dw = 0.0;
            for k in keys.iter_mut() {
                dw = a * (o as f64 + *k as f64);
                *k = dw as f32;
            }
            if width < available {
                *floor = round_down(p.floor(dw, e));
            }
            return;
        }
        let (bound, shift) = match &plan {
            Some(p) => {
                let q = req.queries.row(i);
                let qn2 = crate::gemm::sq_norm_centred(q, p.mean.as_deref());
                // Squared-L2 keys so far are ‖b‖² − 2q·b: add ‖q‖² to make them distances.
                let shift = if req.kernel == Kernel::SqL2 { qn2 } else { 0.0 };
                let worst = keys[width - 1] + shift;
                (p.bound(req.kernel, d, q, worst), shift)
            }
            None => (
                direct.as_ref().expect("a direct kernel has a plan").bound(
                    req.kernel,
                    req.queries.row(i),
                    keys[width - 1],
                ),
                0.0,
            ),
        };
        if shift != 0.0 {
            keys.iter_mut().for_each(|k| *k += shift);
        }
        if width < available {
            *floor = round_down(keys[width - 1] as f64 - bound as f64);
        }
    })
}

/// The largest f32 not above `x`, so a floor stays a floor after rounding.
pub(crate) fn round_down(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) > x {
        f.next_down()
    } else {
        f
    }
}
