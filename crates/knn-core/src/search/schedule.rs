//! One pipeline call from start to end: arguments checked, base and queries prepared (beside
//! the engine's copy of the base and the output's pages), rounds handed to the engine's
//! workers, the output checked and returned.

use super::rounds::Run;
use super::ProgressFn;
use crate::engine::{Engine, OutputRows, PinnedOutput, RowSlices};
use crate::error::{KnnError, Result};
use crate::given::GivenRows;
use crate::matrix::{Matrix, MatrixRef};
use crate::metric::Metric;
use crate::neighbors::Neighbors;
use crate::prepare::{prepare, Data, EngineRows, Prepared, PreparedBase};
use crate::validate::{check_domains, validate};
use rayon::prelude::*;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// Queries handled per round of the pipeline, so that candidate lists stay a small fraction of
/// memory next to the output.
const CANDIDATE_BYTES_PER_ROUND: usize = 64 << 20;

/// Queries per round when reporting progress: small enough for a smooth bar, large enough to
/// keep every engine's tiles full.
const MIN_ROUND: usize = 4096;

/// The engines rounds run on, one entry per concurrent round: every device of `engine` for this
/// run (or the engine itself), each as many times as it works on rounds at once, with the
/// device's number (its share of the rounds, see [`Engine::devices`]).
fn workers<'e>(
    engine: &'e dyn Engine,
    base: MatrixRef<'_>,
    self_join: bool,
) -> Vec<(usize, &'e dyn Engine)> {
    let devices = engine.devices(base, self_join);
    let devices = if devices.is_empty() {
        vec![engine]
    } else {
        devices
    };
    let mut out = Vec::new();
    for (i, e) in devices.into_iter().enumerate() {
        for _ in 0..e.concurrent_rounds().max(1) {
            out.push((i, e));
        }
    }
    out
}

/// The base of a pipeline run: the given rows, and their preparation when it was made once
/// before ([`search_prepared`]).
#[derive(Clone, Copy)]
pub(super) struct Base<'a> {
    rows: MatrixRef<'a>,
    prepared: Option<&'a PreparedBase>,
    /// The rows as given, when base or queries came in f64 (`rows` and the queries are then
    /// their f32 rounding).
    given: Option<&'a GivenRows<'a>>,
}

impl<'a> Base<'a> {
    pub(super) fn given(rows: MatrixRef<'a>) -> Self {
        Base {
            rows,
            prepared: None,
            given: None,
        }
    }

    pub(super) fn prepared(rows: MatrixRef<'a>, prepared: &'a PreparedBase) -> Self {
        Base {
            rows,
            prepared: Some(prepared),
            given: None,
        }
    }

    /// This base, with base or queries given in f64 as `given` (see [`crate::given`]).
    pub(super) fn rounded_from(self, given: &'a GivenRows<'a>) -> Self {
        Base {
            given: Some(given),
            ..self
        }
    }
}

/// Output entries (rows × k) and query values up to which a call on a prepared base runs its
/// checks, preparation and output on the calling thread: one query against 10⁶ × 128 rows
/// spent about 0.1 ms before its round waking threads for microseconds of work.
const SMALL_OUTPUT: usize = 1 << 14;
const SMALL_QUERY_VALUES: usize = 1 << 16;

/// Values of a base from which the engine is told of it before the host prepares (smaller
/// ones are not worth a thread).
const PREFETCH_MIN: usize = 1 << 22;

/// Output entries (rows × k) from which an index search's output pages are made on a thread
/// of their own from the start (1 MiB a buffer: making them takes several times a thread's
/// start, 30-50 µs on the GPU machine).
const EARLY_PAGES_MIN: usize = 1 << 18;

/// The pipeline for the query rows `rows` (all of them, or a piece of a graph); the result's row
/// `i` is query `rows.start + i`. Rounds of queries go to the engine's workers (see
/// [`Engine::devices`], [`Engine::concurrent_rounds`]); each round's rows are the same whichever
/// worker takes it, so the answer does not depend on the schedule. The arguments are checked
/// here (see [`validate`], [`check_domains`]).
pub(super) fn run(
    engine: &dyn Engine,
    base: Base<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    rows: std::ops::Range<usize>,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let Base {
        rows: base,
        prepared: prepared_base,
        given,
    } = base;
    let profile = std::env::var_os("KNN_PROFILE").is_some();
    let mut since = std::time::Instant::now();
    let base_key = prepared_base.map_or_else(crate::engine::base_key, |p| p.key);
    let t0 = since;
    // When each concurrent part ended, for the profile (ms from the start).
    let ended = |what: &str| {
        if profile {
            eprintln!(
                "pipeline: {what} ended at {:.2} ms",
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
    };
    let available = validate(metric, base, queries, k)?;
    let whole_graph = queries.is_none()
        && !matches!(metric, Metric::Expr(_))
        && rows == (0..base.rows())
        && metric.is_symmetric();
    let kernel = metric.kernel();
    let workers = workers(engine, base, queries.is_none());
    let width0 = engine
        .candidate_width(k, available, kernel)
        .clamp(k, available);
    // First-try candidate lists that come to the host are held a round at a time, within a
    // budget (see `per_round` below).
    let candidate_rows = (CANDIDATE_BYTES_PER_ROUND / workers.len() / (8 * width0)).max(1024);
    // While the host checks the values and prepares, the engine may copy the given base to its
    // device (a base found invalid only wastes the copy). The output of a graph or of a
    // one-off search is made (and shown to the engine, which may page-lock it) on a thread of
    // its own, joined only once a whole graph's work has started on the device
    // (`Engine::begin_graph`). A small call checks and prepares on the calling thread: waking
    // threads would cost more than the work.
    let small = queries.is_some()
        && prepared_base.is_some()
        && rows.len() * k <= SMALL_OUTPUT
        && queries.map_or(0, |q| q.as_slice().len()) <= SMALL_QUERY_VALUES;
    let prepared = std::cell::OnceCell::new();
    let fetched = Signal::default();
    // A search of a prepared base (an index) makes its output when its first round asks for
    // it (see `PendingOutput::wait`), on that round's thread: an engine that finishes the rows
    // asks once its work is queued on the device, and the output's pages and page locks then
    // overlap that work instead of delaying its launches (the driver's calls wait while memory
    // is locked: the queries' upload took 5-6 ms instead of 0.7 beside it, k = 1024 on an
    // H100). No thread is started for a small one: that took 30-50 µs of a 0.9 ms search (H200
    // host).
    let deferred = queries.is_some() && prepared_base.is_some();
    // A large one's pages are made from the start (see `EarlyPages`), and only their lock
    // waits for that ask: made at the ask, the 82 MB of a k = 1024 search were ready 3 ms
    // after the device's work had ended (H200).
    let early =
        (deferred && rows.len() * k >= EARLY_PAGES_MIN).then(|| EarlyPages::start(rows.len(), k));
    let make_output = || {
        // A whole graph's output is made once the base's copy is done, while the device
        // works on the graph: its pages would slow the copy, whose end the graph waits for
        // (80k Hellinger: 43.5 against 51.2 ms, median of 28 runs each, same call). Other
        // outputs are needed as soon as the rounds start.
        if whole_graph {
            fetched.wait();
        }
        // Its pages are made (one pass that writes NaN distances) even when the engine locks
        // them: locking fresh pages, which the driver then makes, was slower (k = 1024
        // search, 82 MB: 93.5 against 83.1 ms; 80k Hellinger graph 23–24 against 13–14 ms;
        // knn-cuda NOTES.md). Here, unless made early.
        let mut out = match &early {
            Some(pages) => pages.take(),
            None => Neighbors::with_shape(rows.len(), k),
        };
        ended("output pages");
        // Shown to the engine once the base's copy is done: page-locking memory may hold
        // the driver meanwhile.
        fetched.wait();
        let pin = engine.pin_output(&mut out.ids, &mut out.distances);
        ended("output shown to the engine");
        Output { pin, out }
    };
    // Any other output is made on a thread of its own while the host prepares and the rounds
    // start, unless this call runs on a rayon pool's thread: that thread fills large buffers
    // with the pool's help, and calls run as tasks of a pool, more of them than its threads,
    // would all wait for it while it waits for a free thread of theirs (a hang). There the
    // first asker makes it, as for an index search.
    let own_thread = !deferred && rayon::current_thread_index().is_none();
    let pending = PendingOutput::new((!own_thread).then_some(&make_output));
    let ctx = std::thread::scope(|s| {
        if own_thread {
            s.spawn(|| {
                // However the making ends (a panic too), rounds waiting for it learn of it.
                let _failed = pending.fail_unless_made();
                pending.put(make_output());
            });
        }
        let ctx = (|| {
            if prepared_base.is_none() && base.rows() * base.dim() >= PREFETCH_MIN {
                s.spawn(|| {
                    // Set however the copy ends (a panic too): the output's thread waits for it.
                    let _set = fetched.set_when_dropped();
                    engine.prefetch_base(base_key, base);
                    ended("prefetch");
                });
            } else {
                fetched.set();
            }
            // Hellinger's check of the base waits for the preparation, whose pass over the
            // base sees every column's smallest value (one pass over memory the base's copy
            // reads meanwhile, instead of two).
            // A prepared base was checked when it was prepared.
            let after = matches!(metric, Metric::Hellinger) || prepared_base.is_some();
            let check = || {
                let r = check_domains(metric, (!after).then_some(base), queries);
                ended("value checks");
                r
            };
            let prep = || {
                let reused = prepared_base.and_then(|p| p.with_queries(metric, base, queries));
                let r = reused.map_or_else(|| prepare(metric, base, queries), Ok);
                ended("prepare");
                r
            };
            // Two threads only when both have work: waking the pool took ~50 µs of a 1 ms
            // index search (H200 host), and only Hellinger's check reads the values.
            let (domain, prep) = if small || !metric.has_domain() {
                (check(), prep())
            } else {
                rayon::join(check, prep)
            };
            let domain = if prepared_base.is_none()
                && after
                && !prep.as_ref().is_ok_and(|p| p.base_nonnegative)
            {
                domain.and(check_domains(metric, Some(base), None))
            } else {
                domain
            };
            // Out-of-domain values are the error to report, whatever the preparation made of
            // them.
            let prep = domain.and(prep)?;
            let prep = prepared.get_or_init(|| prep);
            let sizes = (k, available, width0, candidate_rows);
            let self_join = queries.is_none();
            let mut ctx = Run::new(metric, prep, given, self_join, sizes, base_key, profile);
            ctx.lap("prepare", &mut since);
            // A whole graph of a symmetric metric: the engine may compute every row's first
            // candidate lists at once, each unordered pair once (see
            // `Engine::graph_candidates`), or start that work on its device now
            // (`Engine::begin_graph`).
            if whole_graph {
                ctx.start_graph(engine, rows.start)?;
            }
            Ok(ctx)
        })();
        let ctx = ctx?;
        // The engine's copy of the base ends before its first round (that round uses it).
        fetched.wait();
        ctx.lap("output made or making", &mut since);
        rounds(&ctx, engine, &workers, rows.clone(), &pending, progress)?;
        Ok::<_, KnnError>(ctx)
    });
    let ctx = ctx?;
    let Output { pin, out } = pending.into_output();
    ctx.lap("rounds done", &mut since);
    // In blocks (a per-element parallel search costs more than the whole re-rank at k = 16):
    // a branch-free test per block, then the first bad value of the first bad block. Beside
    // it, the output is unlocked (which leaves its values as they are): 1.9 ms for 82 MB on
    // the GPU machine, against 0.6-0.8 ms for the check. A small output is checked on this
    // thread: starting the pool's threads costs more (about 0.06 ms for 65 536 distances on
    // the 16-core GPU machine).
    const BLOCK: usize = 1 << 14;
    let bad = |c: &[f32]| !c.iter().fold(true, |ok, d| ok & d.is_finite());
    let bad_block = if out.distances.len() <= 4 * BLOCK {
        drop(pin);
        out.distances.chunks(BLOCK).position(bad)
    } else {
        rayon::join(
            || out.distances.par_chunks(BLOCK).position_first(bad),
            move || drop(pin),
        )
        .0
    };
    if let Some(b) = bad_block {
        let i = b * BLOCK
            + out.distances[b * BLOCK..]
                .iter()
                .position(|d| !d.is_finite())
                .expect("the block has a non-finite value");
        return Err(KnnError::Overflow {
            metric: metric.name(),
            row: rows.start + i / k,
        });
    }
    ctx.lap("output checked", &mut since);
    if profile {
        if let Some(r) = ctx.eb.centred_roots() {
            eprintln!(
                "pipeline: engine rows (centred roots) made on the host: {}",
                if r.made { "yes" } else { "no" }
            );
        }
    }
    drop(ctx);
    if let Some(prep) = prepared.into_inner() {
        release(prep);
    }
    if profile {
        eprintln!(
            "pipeline: prepared data and output released: {:.2} ms",
            since.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(out)
}

/// The rounds of queries `rows`, written into the output as it is made (`pending`), handed to
/// `workers` (one at a time when there is one worker or one round).
fn rounds(
    ctx: &Run<'_>,
    engine: &dyn Engine,
    workers: &[(usize, &dyn Engine)],
    rows: std::ops::Range<usize>,
    pending: &PendingOutput<'_>,
    progress: ProgressFn<'_>,
) -> Result<()> {
    let k = ctx.k;
    let first = rows.start;
    // Rounds hold at most `candidate_rows` rows of candidate lists. Rows the engine finishes
    // itself bring only their output, and their rounds are sized by the engine's wish alone (a
    // round it does not finish after all asks for its candidates in pieces within the budget:
    // `Run::round`). H100, 10⁴ queries against 10⁶ points, k = 1024: four rounds of 2 500 took
    // 90.8 ms, one of 10 000 83.1 ms.
    let held = if ctx.engine_may_finish() {
        usize::MAX
    } else {
        ctx.candidate_rows
    };
    let per_round = held.min(
        (rows.len() / (32 * workers.len()))
            .max(MIN_ROUND)
            .max(engine.min_round_queries()),
    );
    let total = rows.len();
    // Rounds of even size under that cap: a short last round costs nearly a full one's
    // device time (k = 1024 on an H100: 172 rows after three of 3 276 took 2.4 ms of kernels,
    // a full one 21.8 ms).
    let per_round = even_rounds(total, per_round);
    if workers.len() == 1 || total <= per_round {
        for start in rows.clone().step_by(per_round) {
            let end = (start + per_round).min(rows.end);
            let mut out = pending.rows((start - first) * k..(end - first) * k, k);
            ctx.round(workers[0].1, start, end, &mut out, true)?;
            progress(end - first, total);
        }
    } else {
        // Rounds on several workers at once: the output first, cut into the rounds' rows and
        // dealt to the devices in shares.
        let mut made = pending.wait();
        let result: &mut Neighbors = made.output();
        let devices = workers.iter().map(|w| w.0 + 1).max().unwrap_or(1);
        let shares = deal(rows.clone(), per_round, devices, result, k);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let failed: std::sync::Mutex<Option<KnnError>> = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            for &(device, e) in workers {
                let (shares, done, failed) = (&shares, &done, &failed);
                s.spawn(move || {
                    while let Some((start, mut out)) = shares.next(device) {
                        let end = start + out.ids.len() / k;
                        if let Err(e) = ctx.round(e, start, end, &mut out, true) {
                            *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                            // Hand out no more rounds: the call fails anyway.
                            shares.clear();
                            break;
                        }
                        let n = end - start;
                        let so_far = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
                        progress(so_far, total);
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
    }
    Ok(())
}

/// Rows per round when `n` rows are cut into rounds of even size of at most `per_round` rows.
fn even_rounds(n: usize, per_round: usize) -> usize {
    n.div_ceil(n.div_ceil(per_round).max(1)).max(1)
}

/// A run's rounds dealt to its devices ([`Engine::devices`]): device `i` of `D` holds the rounds
/// of rows `len·i/D..len·(i+1)/D`, each share cut into rounds of even size of at most
/// `per_round` rows, with their output rows.
struct Shares<'o> {
    queues: Vec<Mutex<std::collections::VecDeque<(usize, RowSlices<'o>)>>>,
}

/// `out` (the rows `rows`, `k` a row) cut into the rounds of `devices` shares.
fn deal(
    rows: std::ops::Range<usize>,
    per_round: usize,
    devices: usize,
    out: &mut Neighbors,
    k: usize,
) -> Shares<'_> {
    let (mut ids, mut distances) = (&mut out.ids[..], &mut out.distances[..]);
    let len = rows.len();
    let queues = (0..devices)
        .map(|i| {
            let share = rows.start + len * i / devices..rows.start + len * (i + 1) / devices;
            let n = share.len();
            let each = even_rounds(n, per_round);
            let mut q = std::collections::VecDeque::new();
            for start in share.clone().step_by(each) {
                let m = each.min(share.end - start) * k;
                let (i, rest) = std::mem::take(&mut ids).split_at_mut(m);
                let (d, rest_d) = std::mem::take(&mut distances).split_at_mut(m);
                (ids, distances) = (rest, rest_d);
                q.push_back((
                    start,
                    RowSlices {
                        ids: i,
                        distances: d,
                        k,
                    },
                ));
            }
            Mutex::new(q)
        })
        .collect();
    Shares { queues }
}

impl<'o> Shares<'o> {
    /// The next round for a worker of `device`: its share's first left, else the last of the
    /// largest share left (its device works from the other end).
    fn next(&self, device: usize) -> Option<(usize, RowSlices<'o>)> {
        if let Some(r) = lock(&self.queues[device]).pop_front() {
            return Some(r);
        }
        loop {
            let largest = self.queues.iter().max_by_key(|q| lock(q).len())?;
            if let Some(r) = lock(largest).pop_back() {
                return Some(r);
            }
            // Emptied meanwhile, or every share is done.
            if self.queues.iter().all(|q| lock(q).is_empty()) {
                return None;
            }
        }
    }

    /// Drops every round not taken yet.
    fn clear(&self) {
        for q in &self.queues {
            lock(q).clear();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An output's pages (`rows × k`, unwritten) made ahead by a job on the rayon pool, or by the
/// first that asks for them, whichever comes first: an asker never waits for a job that has
/// not started (it may sit behind the asker's own work in a busy pool), only for one that is
/// making them (a running job finishes its own parallel work).
struct EarlyPages {
    claimed: std::sync::Arc<AtomicBool>,
    made: Mutex<Option<std::sync::mpsc::Receiver<Neighbors>>>,
    shape: (usize, usize),
}

impl EarlyPages {
    fn start(rows: usize, k: usize) -> Self {
        let claimed = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let mine = claimed.clone();
        rayon::spawn(move || {
            if !mine.swap(true, std::sync::atomic::Ordering::AcqRel) {
                // (A failure drops the sender: the asker then makes the pages itself.)
                let _ = tx.send(Neighbors::with_shape(rows, k));
            }
        });
        EarlyPages {
            claimed,
            made: Mutex::new(Some(rx)),
            shape: (rows, k),
        }
    }

    /// The pages, from the job when it took them in hand first, else made here (once).
    fn take(&self) -> Neighbors {
        let by_job = self.claimed.swap(true, std::sync::atomic::Ordering::AcqRel);
        let made = (self.made.lock().unwrap_or_else(|e| e.into_inner()))
            .take()
            .filter(|_| by_job)
            .and_then(|rx| rx.recv().ok());
        made.unwrap_or_else(|| Neighbors::with_shape(self.shape.0, self.shape.1))
    }
}

/// The output while it is made: rounds take their rows of it when they write them
/// ([`PendingOutput::rows`]).
struct PendingOutput<'m> {
    made: Mutex<Made>,
    changed: std::sync::Condvar,
    /// Makes the output on the thread that first asks for it ([`PendingOutput::wait`]),
    /// unless a thread of its own makes it.
    maker: Option<&'m (dyn Fn() -> Output + Sync)>,
    /// Set by the asker that calls `maker`.
    taken: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
enum Made {
    #[default]
    Making,
    Ready(Output),
    Failed,
}

impl Made {
    fn output(&mut self) -> &mut Output {
        match self {
            Made::Ready(out) => out,
            _ => panic!("making the output panicked"),
        }
    }
}

impl<'m> PendingOutput<'m> {
    fn new(maker: Option<&'m (dyn Fn() -> Output + Sync)>) -> Self {
        PendingOutput {
            made: Mutex::new(Made::Making),
            changed: std::sync::Condvar::new(),
            maker,
            taken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Makes the output here if it is made by its first asker and none made it yet.
    fn make_if_first(&self) {
        let first = || !self.taken.swap(true, std::sync::atomic::Ordering::AcqRel);
        if let Some(make) = self.maker.filter(|_| first()) {
            // However the making ends (a panic too), rounds waiting for it learn of it.
            let _failed = self.fail_unless_made();
            self.put(make());
        }
    }

    fn put(&self, out: Output) {
        *self.made.lock().unwrap_or_else(|e| e.into_inner()) = Made::Ready(out);
        self.changed.notify_all();
    }

    /// A guard that marks the output failed when dropped before it was made (its thread
    /// panicked), so that no round waits for it forever.
    fn fail_unless_made(&self) -> impl Drop + '_ {
        struct FailOnDrop<'a>(&'a PendingOutput<'a>);
        impl Drop for FailOnDrop<'_> {
            fn drop(&mut self) {
                let mut made = self.0.made.lock().unwrap_or_else(|e| e.into_inner());
                if matches!(*made, Made::Making) {
                    *made = Made::Failed;
                    self.0.changed.notify_all();
                }
            }
        }
        FailOnDrop(self)
    }

    /// The output, once made (a panic if making it panicked); made here by the first asker
    /// when no thread of its own makes it.
    fn wait(&self) -> std::sync::MutexGuard<'_, Made> {
        self.make_if_first();
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        while matches!(*made, Made::Making) {
            made = self.changed.wait(made).unwrap_or_else(|e| e.into_inner());
        }
        made.output();
        made
    }

    /// Output entries `entries` (rows of `k`), taken when a round writes them.
    fn rows(&self, entries: std::ops::Range<usize>, k: usize) -> PendingRows<'_> {
        PendingRows {
            pending: self,
            entries,
            k,
            made: None,
        }
    }

    fn into_output(self) -> Output {
        // No round asked for it (no rows).
        self.make_if_first();
        match self.made.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Made::Ready(out) => out,
            _ => panic!("making the output panicked"),
        }
    }
}

/// A round's rows of a [`PendingOutput`].
struct PendingRows<'p> {
    pending: &'p PendingOutput<'p>,
    entries: std::ops::Range<usize>,
    k: usize,
    made: Option<std::sync::MutexGuard<'p, Made>>,
}

impl OutputRows for PendingRows<'_> {
    fn rows(&self) -> usize {
        self.entries.len() / self.k
    }

    fn buffers(&mut self) -> (&mut [u32], &mut [f32]) {
        let pending = self.pending;
        let out = self.made.get_or_insert_with(|| pending.wait()).output();
        let r = self.entries.clone();
        let out: &mut Neighbors = out;
        (&mut out.ids[r.clone()], &mut out.distances[r])
    }
}

/// A one-way flag threads wait for.
#[derive(Default)]
struct Signal {
    set: Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Signal {
    fn set(&self) {
        *self.set.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    /// A guard that sets the flag when dropped.
    fn set_when_dropped(&self) -> impl Drop + '_ {
        struct SetOnDrop<'a>(&'a Signal);
        impl Drop for SetOnDrop<'_> {
            fn drop(&mut self) {
                self.0.set();
            }
        }
        SetOnDrop(self)
    }

    fn wait(&self) {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        while !*set {
            set = self.changed.wait(set).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The pipeline's output and, when the engine page-locked it ([`Engine::pin_output`]), the
/// lock, released before the output is returned (beside its check) or dropped (fields drop in
/// order: `pin` first).
struct Output {
    pin: Option<PinnedOutput>,
    out: Neighbors,
}

impl std::ops::Deref for Output {
    type Target = Neighbors;
    fn deref(&self) -> &Neighbors {
        &self.out
    }
}

impl std::ops::DerefMut for Output {
    fn deref_mut(&mut self) -> &mut Neighbors {
        &mut self.out
    }
}

/// Frees the copies `prep` made, on a thread of their own when large: unmapping the pages of
/// 80 000 × 256 square roots took 6 ms of a 124 ms GPU graph.
fn release(prep: Prepared<'_>) {
    let mut owned: Vec<Vec<f32>> = Vec::new();
    let Prepared {
        exact_base,
        exact_queries,
        engine,
        ..
    } = prep;
    for d in std::iter::once(exact_base).chain(exact_queries) {
        if let Data::Owned(m) = d {
            owned.push(m.into_vec());
        }
    }
    if let Some((b, q)) = engine {
        match b {
            EngineRows::Owned(b) => owned.push(b.into_vec()),
            EngineRows::Borrowed(_) => {}
            // The values, if the host made them: the borrow of the given rows ends here.
            EngineRows::Roots(r) => owned.extend(r.into_values()),
        }
        owned.extend(q.map(Matrix::into_vec));
    }
    let bytes: usize = owned.iter().map(|v| v.len() * 4).sum();
    if bytes >= 16 << 20 {
        // Should the thread not start, the closure and the copies are dropped here.
        let _ = std::thread::Builder::new()
            .name("knn-release".into())
            .spawn(move || drop(owned));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each device is dealt its share's rounds in order; once they are taken it takes the
    /// last rounds of the largest share left; every round is handed out once, with its rows.
    #[test]
    fn rounds_are_dealt_in_shares_and_taken_once() {
        let (rows, k) = (10..113, 2);
        let mut out = Neighbors::with_shape(rows.len(), k);
        let shares = deal(rows.clone(), 10, 3, &mut out, k);
        // Shares 10..44, 44..78, 78..113: rounds of even size, at most 10, in each.
        let (start, first) = shares.next(1).unwrap();
        assert_eq!((start, first.ids.len()), (44, 9 * k));
        let (start, _) = shares.next(1).unwrap();
        assert_eq!(start, 53);
        let mut seen = vec![(44, 9), (53, 9)];
        // Device 1 takes the rest of its share, then steals from the end of the others.
        while let Some((start, r)) = shares.next(1) {
            seen.push((start, r.ids.len() / k));
            if seen.len() == 6 {
                break;
            }
        }
        assert_eq!(&seen[2..4], &[(62, 9), (71, 7)]);
        // Of the largest shares left (4 rounds each), device 2's: its last round.
        assert_eq!(seen[4], (105, 8));
        while let Some((start, r)) = shares.next(0) {
            seen.push((start, r.ids.len() / k));
        }
        seen.sort();
        let mut at = rows.start;
        for &(start, n) in &seen {
            assert_eq!(start, at, "rounds {seen:?}");
            at += n;
        }
        assert_eq!(at, rows.end);
        assert!(shares.next(2).is_none());
    }
}
