//! The one trait every engine (CPU, CUDA, grid) implements.

use crate::error::{KnnError, Result};
use crate::expr::ExprPlan;
use crate::matrix::MatrixRef;
use crate::metric::{Kernel, Metric};
use rayon::prelude::*;
use std::fmt;
use std::str::FromStr;

/// A whole kNN graph's candidates at once ([`Engine::graph_candidates`]): every point of
/// `points` a query, excluding itself.
#[derive(Clone, Copy, Debug)]
pub struct GraphRequest<'a> {
    /// The points, both base and queries.
    pub points: MatrixRef<'a>,
    /// The key of every pair.
    pub kernel: Kernel,
    /// Candidates per point.
    pub width: usize,
    /// As [`CandidateRequest::precise`].
    pub precise: bool,
}

/// One candidate computation: for every query, the `width` base points with the smallest
/// kernel keys.
#[derive(Clone, Copy, Debug)]
pub struct CandidateRequest<'a> {
    /// Base points (prepared data: the engine space of the metric).
    pub base: MatrixRef<'a>,
    /// Query points, same dimension.
    pub queries: MatrixRef<'a>,
    /// What to compute.
    pub kernel: Kernel,
    /// Candidates per query, `1 ≤ width ≤` the base points available to each query.
    pub width: usize,
    /// For self-joins: `exclude[i]` is the base id that query `i` must never return.
    pub exclude: Option<&'a [u32]>,
    /// `true` on retries: the pipeline asks again, wider, for rows whose floor was too low, and
    /// an engine with a reduced-precision fast path should use full f32 precision now.
    pub precise: bool,
    /// Identifies the base's values: requests with the same key have the same base values
    /// (the pipeline takes a fresh [`base_key`] per run, during which the base is borrowed
    /// immutably), so an engine may keep what it derived from the base (a device copy, norms)
    /// from one call to the next. `None`: no such promise.
    pub base_key: Option<u64>,
    /// `true` when the data are the metric's exact values themselves (nothing rounded in
    /// between, such as Hellinger's square roots): an engine may then translate them (centre
    /// them) with one rounding of its own, which the `+8` slack of [`Kernel::error_bound`]
    /// covers. A translation after an earlier rounding would leave that rounding outside the
    /// bound.
    ///
    /// [`Kernel::error_bound`]: crate::Kernel::error_bound
    pub exact_data: bool,
    /// Where the request's data were derived from given rows by a rounding transform (set by the
    /// pipeline on first tries): those rows, so that an engine may compute the metric's exact
    /// keys from them in [`Engine::candidates_with_exact`]. `None`: the exact keys, if any, are
    /// `kernel.exact` of the request's own rows.
    pub exact_from: Option<ExactFrom<'a>>,
}

/// The given rows behind a request whose data are derived from them (see
/// [`CandidateRequest::exact_from`]), and the metric whose exact key
/// ([`Metric::exact_key`]) to take of them.
#[derive(Clone, Copy, Debug)]
pub enum ExactFrom<'a> {
    /// Hellinger: the request's rows are the square roots of these (maybe centred); the exact
    /// key is `Σ (√x − √y)²`, square roots, differences, squares and sum in f64, left to right.
    Hellinger {
        /// Given base rows, one per request base row.
        base: MatrixRef<'a>,
        /// Given query rows, one per request query row.
        queries: MatrixRef<'a>,
    },
}

/// A key no earlier call of this process returned, for [`CandidateRequest::base_key`]. Keys
/// stay below 2⁴⁸ (a process would need centuries to draw that many), which leaves the top bits
/// to [`part_key`].
pub fn base_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The key of part `part` (`< 2¹⁶ − 1`) of the base keyed `key` (a range of its rows, the same
/// range for the same part): distinct from every [`base_key`] and from the other parts' keys,
/// so that an engine given a part keeps it apart from the whole base.
pub fn part_key(key: u64, part: usize) -> u64 {
    debug_assert!(part < 0xffff);
    (key & ((1 << 48) - 1)) | ((part as u64 + 1) << 48)
}

impl CandidateRequest<'_> {
    /// Base points each query may return (the base size, less one when excluding).
    pub fn available(&self) -> usize {
        self.base.rows() - usize::from(self.exclude.is_some())
    }

    /// An error unless the width lies in `1..=`[`CandidateRequest::available`].
    pub fn check_width(&self) -> Result<()> {
        if self.width == 0 || self.width > self.available() {
            return Err(KnnError::Option(format!(
                "candidate width {} outside 1..={}",
                self.width,
                self.available()
            )));
        }
        Ok(())
    }
}

/// An engine's answer: `rows × width` candidate ids and approximate keys, each row sorted by
/// (key, id), and per row a `floor`: a lower bound on the exact kernel key of every base point
/// that is *not* in the row (`+∞` when the row holds every available point).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidates {
    /// Candidates per row.
    pub width: usize,
    /// `rows·width` base ids.
    pub ids: Vec<u32>,
    /// `rows·width` approximate kernel keys.
    pub keys: Vec<f32>,
    /// One per row.
    pub floor: Vec<f32>,
    /// `true` when every finite floor also bounds its row's rounding: no entry's exact key
    /// lies more than `keys[width − 1] − floor` below its computed key (a floor made as the
    /// last key less the keys' error bound). The re-rank then stops reading a row's
    /// candidates once their keys, less that margin, pass its k-th exact key. `false`: it
    /// reads every candidate (floors from other bounds, such as the grid's cells).
    pub floor_bounds_rounding: bool,
}

impl Candidates {
    /// No rows, lists `width` wide.
    pub fn empty(width: usize) -> Self {
        Candidates {
            width,
            ids: Vec::new(),
            keys: Vec::new(),
            floor: Vec::new(),
            floor_bounds_rounding: false,
        }
    }

    /// Every row handed to `sink` in batches of consecutive rows, in parallel (`exact`: the
    /// candidates' exact keys, laid out as `ids`).
    pub fn hand_over(&self, exact: Option<&[f64]>, sink: &dyn RowSink) {
        /// Rows per batch.
        const BATCH: usize = 256;
        let (n, w) = (self.floor.len(), self.width);
        let rows: Vec<u32> = (0..n as u32).collect();
        rows.par_chunks(BATCH).enumerate().for_each(|(i, r)| {
            let (a, b) = (i * BATCH, i * BATCH + r.len());
            sink.take(CandidateRows {
                rows: r,
                width: w,
                ids: &self.ids[a * w..b * w],
                keys: &self.keys[a * w..b * w],
                floor: &self.floor[a..b],
                floor_bounds_rounding: self.floor_bounds_rounding,
                exact: exact.map(|e| &e[a * w..b * w]),
            })
        });
    }

    /// Rows `start..end` as their own candidate lists.
    pub fn rows(&self, start: usize, end: usize) -> Candidates {
        let w = self.width;
        Candidates {
            width: w,
            ids: self.ids[start * w..end * w].to_vec(),
            keys: self.keys[start * w..end * w].to_vec(),
            floor: self.floor[start..end].to_vec(),
            floor_bounds_rounding: self.floor_bounds_rounding,
        }
    }
}

/// Where [`Engine::finish_rows`] writes final rows: `rows × k` ids and distances, laid out as
/// [`crate::Neighbors`] (see [`OutputRows`]), and one flag per row.
pub struct FinishedRows<'a> {
    /// The metric whose distances are written.
    pub metric: &'a Metric,
    /// Neighbours per row.
    pub k: usize,
    /// The rows' `rows·k` base ids and distances ([`Metric::distance_from_key`] of the exact
    /// keys).
    pub out: &'a mut dyn OutputRows,
    /// One per row: `true` when the row is final.
    pub proven: &'a mut [bool],
    /// A row is final when its k-th exact key times this lies below its floor (the engine
    /// data's scale: see [`crate::prepare::Prepared::key_scale`]).
    pub key_scale: f64,
}

impl FinishedRows<'_> {
    /// Whether the buffers hold `rows` rows of `k` neighbours (ids, distances) and their flags.
    pub fn holds(&self, rows: usize) -> bool {
        self.out.rows() == rows && self.proven.len() == rows
    }
}

/// The buffers a round's rows are written into: `rows × k` ids and distances. They may still be
/// in the making (their pages made and page-locked on another thread) when the round starts:
/// an engine asks for them ([`OutputRows::buffers`]) once its work for the round is queued on
/// its device, so that this work overlaps their making.
pub trait OutputRows {
    /// The rows they hold.
    fn rows(&self) -> usize;
    /// `(ids, distances)`, `rows × k` each, waiting the first time until they exist.
    fn buffers(&mut self) -> (&mut [u32], &mut [f32]);
}

/// [`OutputRows`] that exist already: `ids` and `distances`, `k` per row.
pub struct RowSlices<'a> {
    /// `rows·k` ids.
    pub ids: &'a mut [u32],
    /// `rows·k` distances.
    pub distances: &'a mut [f32],
    /// Neighbours per row (at least 1).
    pub k: usize,
}

impl OutputRows for RowSlices<'_> {
    fn rows(&self) -> usize {
        self.ids.len() / self.k.max(1)
    }
    fn buffers(&mut self) -> (&mut [u32], &mut [f32]) {
        (&mut *self.ids, &mut *self.distances)
    }
}

/// Output buffers an engine holds page-locked ([`Engine::pin_output`]): unlocked when this is
/// dropped.
pub struct PinnedOutput {
    /// Held only for its `Drop`.
    _unlock: Box<dyn Send>,
}

impl PinnedOutput {
    /// `unlock` does the unlocking when dropped.
    pub fn new(unlock: impl Send + 'static) -> Self {
        PinnedOutput {
            _unlock: Box::new(unlock),
        }
    }
}

impl fmt::Debug for PinnedOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PinnedOutput")
    }
}

/// Candidate rows as an engine hands them to the visitor of [`Engine::candidate_rows`]: the
/// rows of [`Candidates`] of the request rows `rows` (indices into `req.queries`, in the
/// engine's order), and optionally their exact keys (see [`Engine::candidates_with_exact`]).
#[derive(Clone, Copy, Debug)]
pub struct CandidateRows<'a> {
    /// Request row of each row here.
    pub rows: &'a [u32],
    /// Candidates per row.
    pub width: usize,
    /// `rows.len()·width` base ids, each row sorted by (key, id).
    pub ids: &'a [u32],
    /// `rows.len()·width` approximate kernel keys.
    pub keys: &'a [f32],
    /// One per row: a lower bound on the exact key of every available point not in the row.
    pub floor: &'a [f32],
    /// As [`Candidates::floor_bounds_rounding`].
    pub floor_bounds_rounding: bool,
    /// `rows.len()·width` exact keys, when given: `exact[i] == req.kernel.exact(query,
    /// base row ids[i])`, bit for bit.
    pub exact: Option<&'a [f64]>,
}

impl CandidateRows<'_> {
    /// `true` when the slices have the lengths `rows` and `width` call for.
    pub fn is_consistent(&self) -> bool {
        let n = self.rows.len() * self.width;
        self.ids.len() == n
            && self.keys.len() == n
            && self.floor.len() == self.rows.len()
            && self.exact.is_none_or(|e| e.len() == n)
    }
}

/// Receives the candidate rows of [`Engine::candidate_rows`], on the engine's threads.
pub trait RowSink: Sync {
    /// A hint: the request rows `rows` will be handed over soon, from this thread (a sink that
    /// writes rows at scattered places may fetch those places into cache meanwhile). Default:
    /// nothing.
    fn upcoming(&self, rows: &[u32]) {
        let _ = rows;
    }
    /// Takes a batch of rows.
    fn take(&self, rows: CandidateRows<'_>);
}

/// A kNN engine: computes candidate lists; the shared pipeline ([`crate::search`]) re-ranks
/// them exactly and asks again, wider, for the rows whose floor does not prove them complete.
///
/// Contract: row `i` holds the `width` smallest computed keys of query `i` (ties by smaller
/// id), and `floor[i]` is a true lower bound on the exact key of every point left out.
pub trait Engine: Sync {
    /// Name for logs and tables, e.g. `cpu` or `cuda:0/fused`.
    fn name(&self) -> String;
    /// Computes the candidate lists.
    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates>;

    /// Candidates to ask for on the first try, for `k` neighbours of `available` points: a few
    /// more than k, so that rounding rarely forces a retry. Engines with coarser arithmetic ask
    /// for more.
    fn candidate_width(&self, k: usize, available: usize, kernel: Kernel) -> usize {
        let _ = kernel;
        (k + 4 + k / 16).min(available)
    }

    /// [`Engine::candidates`], plus, optionally, the exact kernel key of every candidate.
    ///
    /// The pipeline calls this instead of `candidates` only when the request's data *is* the
    /// metric's exact space (nothing centred, scaled, normalised or square-rooted in between) and
    /// the metric's exact key is `req.kernel.exact`, or when the request names the rows its data
    /// were derived from ([`CandidateRequest::exact_from`]). An engine that holds the
    /// candidates' coordinates at hand (a cache-resident copy of the base) may then return
    /// `Some(exact)` with `exact.len() == ids.len()` and, bit for bit,
    /// `exact[i] == req.kernel.exact(query row, req.base.row(ids[i]))` (the same function on the
    /// same f32 values), or with `exact_from`, the exact key it names of the given rows; the
    /// pipeline uses these instead of reading each candidate's base row. An engine that cannot
    /// honour `exact_from` returns `None`. Default: the candidates and `None`.
    fn candidates_with_exact(
        &self,
        req: &CandidateRequest<'_>,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        Ok((self.candidates(req)?, None))
    }

    /// Symmetric self-join: candidates for **every** row of a kNN graph of `graph.points` (the
    /// same lists and floors as [`Engine::candidates`] with `queries = base = points`,
    /// `exclude[i] = i` and the request's kernel, width and precision), computed by an engine that evaluates each unordered pair's key once and
    /// folds it into both points' lists. Only called for kernels that are symmetric in their two
    /// arguments (all four are) and metrics whose engine space is one matrix for both sides
    /// ([`crate::Metric::is_symmetric`]).
    ///
    /// `None`: not supported, or not worth it for this size (the pipeline then takes
    /// [`Engine::candidates`] row range by row range). Default: `None`.
    fn graph_candidates(&self, graph: GraphRequest<'_>) -> Option<Result<Candidates>> {
        let _ = graph;
        None
    }

    /// Whether first tries of `kernel` use keys of reduced precision (bf16, TF32) that a
    /// request with [`CandidateRequest::precise`] replaces by full f32 ones. The pipeline then
    /// asks the rows a first try did not prove again at the same width with precise keys
    /// (most failed on the wider rounding bound, not on ties) before it widens. Default: false.
    fn fast_first_tries(&self, kernel: Kernel) -> bool {
        let _ = kernel;
        false
    }

    /// Told, while the pipeline prepares its data (on a thread of its own), that the coming
    /// requests keyed `base_key` (see [`CandidateRequest::base_key`]) take `base`, the rows as
    /// given, as their base or derive their base from it. An engine may copy them to its device
    /// meanwhile, and use that copy for those requests wherever they need these very rows (the
    /// same memory). Default: nothing.
    fn prefetch_base(&self, base_key: u64, base: MatrixRef<'_>) {
        let _ = (base_key, base);
    }

    /// Told before the rounds of a whole kNN graph of a symmetric metric when
    /// [`Engine::graph_candidates`] declined: `first` is a first try of that graph for no rows
    /// (its base, base key, width, kernel and exact data as every first try's); every row of
    /// the base will be asked for, each excluding itself. An engine may then compute every
    /// row's first candidates at once, each unordered pair once, when the first of those
    /// requests arrives, and answer the first tries (through any of its methods) from them,
    /// under the same contract as [`Engine::candidates`].
    ///
    /// `finish`: `Some((metric, k))` when the first tries' rows will be finished by
    /// [`Engine::finish_rows`] for `k` neighbours under `metric`. Called before the output
    /// exists (the host makes its pages meanwhile, on another thread): an engine that computes
    /// and finishes every row at once may start that work now, so that it overlaps the
    /// host's; the later calls must answer exactly as they would have without it. Default:
    /// nothing.
    fn begin_graph(
        &self,
        first: &CandidateRequest<'_>,
        finish: Option<(&Metric, usize)>,
    ) -> Result<()> {
        let _ = (first, finish);
        Ok(())
    }

    /// Shown the output's buffers once they exist, zeroed and their pages made (on a thread
    /// of their own, maybe while another call of this engine runs), before any request writes
    /// into them. An engine may page-lock them in place, so that the rows it finishes are
    /// copied straight in, and return a [`PinnedOutput`], which the pipeline drops (unlocking
    /// them) before the buffers go back to the caller or are freed, whatever the call
    /// returns. `None` (the default): nothing locked.
    fn pin_output(&self, ids: &mut [u32], distances: &mut [f32]) -> Option<PinnedOutput> {
        let _ = (ids, distances);
        None
    }

    /// Candidates under an expression metric ([`crate::Metric::Expr`]): the same contract as
    /// [`Engine::candidates`], with keys from `plan`'s program instead of `req.kernel` (which
    /// is meaningless here). `req.base` and `req.queries` hold the plan's features
    /// (`plan.dim() · plan.program().stride` values per row); each key is the program run over
    /// the coordinates in order from `acc = 0` in f32, any evaluation within the rounding model
    /// of [`crate::expr`] (IEEE operations, fused multiply-adds allowed, exp/log within 4 ulp),
    /// and a row's floor is [`ExprPlan::floor`] of its `width`-th key (`+∞` when complete).
    /// Default: an error naming the engine.
    fn candidates_expr(&self, req: &CandidateRequest<'_>, plan: &ExprPlan) -> Result<Candidates> {
        let _ = (req, plan);
        Err(KnnError::Option(format!(
            "the {} engine does not compute expression metrics (use brute force on the CPU or a GPU)",
            self.name()
        )))
    }

    /// Optional: the pipeline's re-rank done by the engine itself, on a first try whose exact
    /// keys the engine may compute (the conditions of [`Engine::candidates_with_exact`]:
    /// exact-space data, or the given rows of `req.exact_from`), for `out.k ≤ req.width`
    /// neighbours. `Ok(false)` (the default): not done, the pipeline asks for candidates.
    /// `Ok(true)`: for each row `i`, `proven[i]` is `true` only when the row's
    /// `ids`/`distances` are what the re-rank makes of this engine's candidates for `req` with
    /// their exact keys — the `k` smallest by (exact key, id), the largest of them times
    /// `out.key_scale` below the row's floor (or the row holding every available point), distances
    /// `out.metric.distance_from_key` of the exact keys, ordered by (distance, id) — so the
    /// output is the same either way; rows not proven are asked again as usual.
    fn finish_rows(&self, req: &CandidateRequest<'_>, out: FinishedRows<'_>) -> Result<bool> {
        let _ = (req, out);
        Ok(false)
    }

    /// Queries per pipeline round the engine wants at least (the pipeline still bounds a round
    /// by its memory budget). Small rounds give smooth progress reports; an engine that reorders
    /// the queries of a call for locality (the grid) gains from large ones. Default 4096.
    fn min_round_queries(&self) -> usize {
        4096
    }

    /// Independent engines behind this one (one per GPU) that the pipeline hands whole rounds
    /// of queries to, side by side, for a run on `base` (the rows as given; `self_join`: the
    /// queries are its own points, each excluding itself). Empty (the default): this engine
    /// takes the rounds itself, alone or sharing each request among devices of its own.
    ///
    /// Of `D` devices, device `i` is dealt the rounds of rows `len·i/D..len·(i+1)/D` of the
    /// run's rows first (a graph's rows are then those whose lists it may have finished ahead,
    /// see [`Engine::begin_graph`]), and once those are taken, rounds from the end of the
    /// largest share left.
    fn devices(&self, base: MatrixRef<'_>, self_join: bool) -> Vec<&dyn Engine> {
        let _ = (base, self_join);
        Vec::new()
    }

    /// Rounds of queries this engine works on at once. A GPU engine says 2, so the host's exact
    /// re-rank of one round overlaps the device's work on the next. Default 1.
    fn concurrent_rounds(&self) -> usize {
        1
    }

    /// The rows of [`Engine::candidates`] (`want_exact`: of [`Engine::candidates_with_exact`],
    /// under the same condition) handed to `sink` in batches, each request row exactly once,
    /// in any order and from any thread of the current rayon pool.
    ///
    /// An engine that orders queries for itself (the grid) hands over each batch as soon as it
    /// is done, while it is in cache, and never builds the whole candidate lists nor writes
    /// them back in the caller's order; it announces each batch's rows
    /// ([`RowSink::upcoming`]) before computing them. Default: [`Engine::candidates`] (or
    /// `candidates_with_exact`), then batches of consecutive rows in parallel.
    fn candidate_rows(
        &self,
        req: &CandidateRequest<'_>,
        want_exact: bool,
        sink: &dyn RowSink,
    ) -> Result<()> {
        let (cand, exact) = if want_exact {
            self.candidates_with_exact(req)?
        } else {
            (self.candidates(req)?, None)
        };
        let (n, w) = (req.queries.rows(), cand.width);
        if cand.floor.len() != n || cand.ids.len() != n * w || cand.keys.len() != n * w {
            return Err(KnnError::Device(format!(
                "engine {} returned {} floors and {} ids of width {w} for {n} queries",
                self.name(),
                cand.floor.len(),
                cand.ids.len()
            )));
        }
        let exact = exact.filter(|e| e.len() == cand.ids.len());
        cand.hand_over(exact.as_deref(), sink);
        Ok(())
    }
}

/// Whether a kNN graph computes each unordered pair once ([`Engine::graph_candidates`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Symmetry {
    /// Where the engine measured it to pay (its own rule: size, metric, dimension, memory).
    #[default]
    Auto,
    /// Always, where the engine supports it.
    On,
    /// Never: every row computes its keys against every point.
    Off,
}

impl FromStr for Symmetry {
    type Err = crate::KnnError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Symmetry::Auto),
            "on" | "yes" | "true" => Ok(Symmetry::On),
            "off" | "no" | "false" => Ok(Symmetry::Off),
            _ => Err(crate::KnnError::Option(format!(
                "unknown symmetric mode '{s}' (auto, on, off)"
            ))),
        }
    }
}

impl fmt::Display for Symmetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Symmetry::Auto => "auto",
            Symmetry::On => "on",
            Symmetry::Off => "off",
        })
    }
}
