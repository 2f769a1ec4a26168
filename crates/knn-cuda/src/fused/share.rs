//! A kNN graph's pairs shared among GPUs ([`GraphShare`]): in the collect form (see
//! `graph::collected_lists`), GPU g of G takes a G-th of the point tiles, computes their
//! thresholds and every pair those tiles meet, and sorts what it collected into its own part of
//! every point's lists. A row's lists are then the G parts' lists of it merged by (key, id),
//! with the least of their cuts ([`merge_parts`]): each GPU merges and finishes its share of
//! the rows ahead when the graph's rows are finished on the device (`graph::graph_finished`),
//! and a round of another share's rows merges them itself ([`merged_rows`]).
//!
//! Why the merge keeps the one-GPU contract: part g's list of a point holds the W smallest
//! composites of the pairs g computed for it that passed its threshold, and its cut bounds
//! every composite g left out besides those above its W-th. The merged list holds the W
//! smallest of the union, so what it leaves out lies above its W-th composite (dropped by the
//! merge, or above a part's W-th, which is at least the merged W-th) or at least a part's cut.
//! Every part rounds the same points with the same scale (`rounded_points`), so the merged keys
//! carry one part's input rounding, and every part filters by the same gathered thresholds.

use super::graph::list_slots;
use super::select::{merge_runs, Lists};
use crate::device::{dev_err, Gpu};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::{KnnError, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// CUDA engines (one per GPU) that share the pairs of every symmetric kNN graph whose
/// collect form they make: give the engines behind one multi-GPU engine (`knn`'s) the shares of
/// one [`GraphShare::new`], each its own (`CudaEngine::with_graph_share`), and tell all of them
/// of each graph at once (`Engine::begin_graph`, a thread each: each waits for the others'
/// thresholds). When a part of a graph is missing (declined, out of memory, replaced by a
/// later graph), the graph's rows are computed one-sided instead.
#[derive(Clone)]
pub struct GraphShare {
    group: Arc<Group>,
    part: usize,
}

impl GraphShare {
    /// Shares for `parts` engines: part `i` of the returned list for engine `i`.
    pub fn new(parts: usize) -> Vec<GraphShare> {
        let group = Arc::new(Group {
            slots: Mutex::new(Slots {
                stage: (0..parts).map(|_| None).collect(),
                rows: (0..parts).map(|_| None).collect(),
            }),
            changed: Condvar::new(),
            merged: AtomicUsize::new(0),
        });
        (0..parts)
            .map(|part| GraphShare {
                group: group.clone(),
                part,
            })
            .collect()
    }

    /// Rows the engines of this share have read from every part's lists so far (tests,
    /// benchmarks: the pairs were shared).
    pub fn rows_merged(&self) -> usize {
        self.group.merged.load(Ordering::Relaxed)
    }

    /// Counts `rows` read from every part's lists.
    pub(crate) fn merged(&self, rows: usize) {
        self.group.merged.fetch_add(rows, Ordering::Relaxed);
    }

    /// (this engine's part, parts).
    pub(crate) fn part(&self) -> (usize, usize) {
        (self.part, self.group.parts())
    }

    /// The point tiles of this part, of `tiles`: consecutive, as even as can be.
    pub(crate) fn tiles(&self, tiles: usize) -> std::ops::Range<usize> {
        let (g, parts) = self.part();
        tiles * g / parts..tiles * (g + 1) / parts
    }

    /// Publishes this part's thresholds of graph `key`.
    pub(crate) fn publish_thresholds(&self, key: GraphKey, t: Arc<Thresholds>) {
        self.group.set(self.part, key, Stage::Thresholds(t));
    }

    /// Publishes this part's lists of graph `key`.
    pub(crate) fn publish_lists(&self, key: GraphKey, l: Arc<PartLists>) {
        self.group.set(self.part, key, Stage::Lists(l));
    }

    /// Forgets what this part published of earlier graphs: a graph begun again (the same
    /// points and width) is made anew, not taken as a second attempt at the last one (see
    /// [`GraphShare::began`]). The other parts' slots may still hold that graph's thresholds or
    /// lists until they restart too: they are of the same points, width and plan, so equal.
    pub(crate) fn restart(&self) {
        let mut slots = self.group.lock();
        slots.stage[self.part] = None;
        slots.rows[self.part] = None;
        drop(slots);
        self.group.changed.notify_all();
    }

    /// Says this part makes no lists of graph `key` unless it published them (called at the
    /// end of every attempt, so that the others never wait for it in vain).
    pub(crate) fn settle(&self, key: GraphKey) {
        let mut slots = self.group.lock();
        if !matches!(&slots.stage[self.part], Some((k, Stage::Lists(_))) if *k == key) {
            slots.stage[self.part] = Some((key, Stage::Declined));
            self.group.changed.notify_all();
        }
    }

    /// Withdraws this part's lists of graph `key` (its engine ran out of memory and drops
    /// what it holds): the share lets go of them, so that the retry finds the memory, and the
    /// other parts send that graph's rows one-sided; no second attempt is made ([`began`]
    /// stays true).
    ///
    /// [`began`]: GraphShare::began
    pub(crate) fn withdraw(&self, key: GraphKey) {
        let mut slots = self.group.lock();
        if matches!(&slots.stage[self.part], Some((k, _)) if *k == key) {
            slots.stage[self.part] = Some((key, Stage::Declined));
            self.group.changed.notify_all();
        }
    }

    /// Whether this part has published anything of graph `key` (a second attempt, after an
    /// out-of-memory retry, makes none: the others may have read the first).
    pub(crate) fn began(&self, key: GraphKey) -> bool {
        matches!(&self.group.lock().stage[self.part], Some((k, _)) if *k == key)
    }

    /// Every part's thresholds of graph `key`, once every part has published them (or its
    /// lists); `None` as soon as one part declined.
    pub(crate) fn wait_thresholds(&self, key: GraphKey) -> Option<Vec<Arc<Thresholds>>> {
        self.wait_for_every_part(key, |stage| match stage {
            Stage::Thresholds(t) => Some(t.clone()),
            Stage::Lists(l) => Some(l.thresholds.clone()),
            Stage::Declined => None,
        })
    }

    /// Every part's lists of graph `key`, in part order, once every part has made them; `None`
    /// as soon as one part declined.
    pub(crate) fn wait_lists(&self, key: GraphKey) -> Option<Vec<Arc<PartLists>>> {
        self.wait_for_every_part(key, |stage| match stage {
            Stage::Lists(l) => Some(l.clone()),
            _ => None,
        })
    }

    /// What `take` finds in every part's stage of graph `key`, in part order, once it finds
    /// something in each; `None` as soon as one part declined.
    fn wait_for_every_part<T>(
        &self,
        key: GraphKey,
        take: impl Fn(&Stage) -> Option<T>,
    ) -> Option<Vec<T>> {
        let mut slots = self.group.lock();
        loop {
            let mut all = Vec::with_capacity(slots.stage.len());
            for s in slots.stage.iter() {
                match s {
                    Some((k, Stage::Declined)) if *k == key => return None,
                    Some((k, stage)) if *k == key => all.extend(take(stage)),
                    _ => {}
                }
            }
            if all.len() == slots.stage.len() {
                return Some(all);
            }
            slots = self
                .group
                .changed
                .wait(slots)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Every part's lists of graph `key`, in part order, when every part has made them.
    pub(crate) fn lists(&self, key: GraphKey) -> Option<Vec<Arc<PartLists>>> {
        self.group
            .lock()
            .stage
            .iter()
            .map(|s| match s {
                Some((k, Stage::Lists(l))) if *k == key => Some(l.clone()),
                _ => None,
            })
            .collect()
    }
}

impl GraphShare {
    /// Part `g`'s even share of `n` base rows (as a multi-GPU engine splits a base among its
    /// engines for a search, so that the copies it prefetched serve as shares).
    fn row_share(&self, g: usize, n: usize) -> std::ops::Range<usize> {
        Self::row_share_of(g, self.group.parts(), n)
    }

    /// Part `g` of `parts`' even share of `n` rows: the base rows it uploads for the others,
    /// the graph rows it finishes ahead (as the pipeline deals a graph's rounds to devices,
    /// `Engine::devices`).
    pub(crate) fn row_share_of(g: usize, parts: usize, n: usize) -> std::ops::Range<usize> {
        n * g / parts..n * (g + 1) / parts
    }

    /// The given base rows (`host`, rows of `d` values, uncentred) of graph `key` in a new
    /// buffer on this GPU, each host row uploaded by one part only: this part uploads its even
    /// share and publishes it, then copies every other part's share from that part's device
    /// once published. A part that goes on without publishing its share (its base already
    /// held, or declined) has it uploaded here instead; no part waits on another before
    /// publishing, so none waits in vain. Four GPUs that each uploaded the whole base took
    /// 160-210 ms for 1 GB (host memory shared by the four copies).
    ///
    /// This part's share comes from `upload_own` (given its host rows: a copy prefetched for
    /// a search of the base split as these shares are, or an upload). The shares stay on their
    /// devices until [`GraphShare::release_rows`] or the next graph.
    pub(crate) fn gathered_base(
        &self,
        gpu: &Gpu,
        key: GraphKey,
        (host, d): (&[f32], usize),
        upload_own: impl FnOnce(&[f32]) -> Result<CudaSlice<f32>>,
    ) -> Result<CudaSlice<f32>> {
        let n = host.len() / d;
        let mine = self.row_share(self.part, n);
        let part = upload_own(&host[mine.start * d..mine.end * d])?;
        let own = Arc::new(PartRows {
            ctx: gpu.ctx.clone(),
            ready: record(gpu)?,
            buf: part,
        });
        self.group.lock().rows[self.part] = Some((key, own.clone()));
        self.group.changed.notify_all();
        let full = gpu.alloc::<f32>(n * d)?;
        let sources = self.wait_rows(key);
        for (g, src) in sources.iter().enumerate() {
            let r = self.row_share(g, n);
            if r.is_empty() {
                continue;
            }
            let (at, bytes) = (gpu.ptr(&full) + (r.start * d * 4) as u64, r.len() * d * 4);
            match src {
                // This part's own share, or another's from its device.
                Some(p) => copy_from_peer(gpu, at, (&p.ctx, gpu.ptr(&p.buf), &p.ready), bytes)?,
                None => {
                    let rows = gpu.upload(&host[r.start * d..r.end * d])?;
                    // SAFETY: both ranges hold `bytes` on this device; `rows` lives until the
                    // stream has passed the copy (the sync below).
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(
                            at,
                            gpu.ptr(&rows),
                            bytes,
                            gpu.stream.cu_stream(),
                        )
                    }
                    .map_err(dev_err("copying on the device"))?;
                    gpu.sync()?;
                }
            }
        }
        // The other parts' shares stay published (in their slots) while this part's copies
        // run: each part lets go of its own only once every part's thresholds, made after
        // these copies on that part's stream, are done.
        Ok(full)
    }

    /// Every part's share of graph `key`'s base rows once each part has published its share
    /// or gone on without it (`None`: to be uploaded from the host).
    fn wait_rows(&self, key: GraphKey) -> Vec<Option<Arc<PartRows>>> {
        let mut slots = self.group.lock();
        loop {
            let ready: Option<Vec<_>> = slots
                .rows
                .iter()
                .zip(&slots.stage)
                .map(|(r, s)| match (r, s) {
                    (Some((k, p)), _) if *k == key => Some(Some(p.clone())),
                    (_, Some((k, _))) if *k == key => Some(None),
                    _ => None,
                })
                .collect();
            if let Some(all) = ready {
                return all;
            }
            slots = self
                .group
                .changed
                .wait(slots)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Frees this part's share of the base rows, once every part's thresholds are gathered
    /// and done (each part copies the shares before it computes its thresholds). Called with
    /// the device's context bound; the free is queued on this part's stream.
    pub(crate) fn release_rows(&self) {
        let own = self.group.lock().rows[self.part].take();
        drop(own);
    }
}

/// A part's even share of a graph's given base rows, on its device (see
/// [`GraphShare::gathered_base`]).
pub(crate) struct PartRows {
    ctx: Arc<CudaContext>,
    buf: CudaSlice<f32>,
    /// Recorded behind the upload.
    ready: CudaEvent,
}

/// A graph: its base key and first-try width.
pub(crate) type GraphKey = (u64, usize);

/// What the parts of a share have published, one slot per part.
struct Group {
    slots: Mutex<Slots>,
    changed: Condvar,
    /// See [`GraphShare::rows_merged`].
    merged: AtomicUsize,
}

impl Group {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn parts(&self) -> usize {
        self.lock().stage.len()
    }

    fn set(&self, part: usize, key: GraphKey, stage: Stage) {
        self.lock().stage[part] = Some((key, stage));
        self.changed.notify_all();
    }
}

/// Per part: how far it got with a graph, and its share of the graph's base rows.
struct Slots {
    stage: Vec<Option<(GraphKey, Stage)>>,
    rows: Vec<Option<(GraphKey, Arc<PartRows>)>>,
}

/// How far a part got with a graph.
enum Stage {
    Declined,
    Thresholds(Arc<Thresholds>),
    Lists(Arc<PartLists>),
}

/// A part's thresholds (`hi` of its points, the rows of its tiles), on its device.
pub(crate) struct Thresholds {
    pub ctx: Arc<CudaContext>,
    pub hi: Arc<CudaSlice<f32>>,
    /// Recorded behind the kernel that wrote them.
    pub ready: CudaEvent,
    /// The points they are of.
    pub rows: std::ops::Range<usize>,
}

/// A part's lists of every point (`n × w`, SENTINEL after their real entries) and cuts, on its
/// device.
pub(crate) struct PartLists {
    pub ctx: Arc<CudaContext>,
    pub lists: Arc<CudaSlice<u64>>,
    pub cut: Arc<CudaSlice<u64>>,
    /// Recorded behind the kernel that sorted them.
    pub ready: CudaEvent,
    /// Kept with the lists: the thresholds stay readable while any part may still gather them.
    pub thresholds: Arc<Thresholds>,
}

/// Copies `bytes` at `src` of the device of `src_ctx` to `dst` of `gpu` on its stream, after
/// `ready`. The caller keeps the source alive until the stream has passed the copy.
fn copy_from_peer(
    gpu: &Gpu,
    dst: u64,
    (src_ctx, src, ready): (&CudaContext, u64, &CudaEvent),
    bytes: usize,
) -> Result<()> {
    gpu.stream
        .wait(ready)
        .map_err(dev_err("waiting for a GPU"))?;
    // SAFETY: both ranges hold `bytes` on their devices (the caller's buffers), the source
    // kept alive by the caller until the stream passed the copy.
    unsafe {
        cudarc::driver::result::memcpy_peer_async(
            gpu.ctx.cu_ctx(),
            dst,
            src_ctx.cu_ctx(),
            src,
            bytes,
            gpu.stream.cu_stream(),
        )
    }
    .map_err(dev_err("copying between GPUs"))
}

/// Every point's threshold into `hi` (n floats on `gpu`): each part's rows from its device
/// (this part's are in place already).
pub(crate) fn gather_thresholds(
    gpu: &Gpu,
    all: &[Arc<Thresholds>],
    own: usize,
    hi: &CudaSlice<f32>,
) -> Result<()> {
    for (g, t) in all.iter().enumerate() {
        if g == own || t.rows.is_empty() {
            continue;
        }
        let at = (t.rows.start * 4) as u64;
        let src = (&*t.ctx, gpu.ptr(&t.hi) + at, &t.ready);
        copy_from_peer(gpu, gpu.ptr(hi) + at, src, t.rows.len() * 4)?;
    }
    Ok(())
}

/// Rows `at..at + rows` of a graph of `n` points whose parts are `parts` (this GPU's is
/// `own`): the parts' lists of those rows merged by (key, id), each `w` wide, filled up where
/// short of `w` (see `sym_fill`), and the least of the parts' cuts. The parts must stay alive
/// until the stream has passed these copies (the caller's downloads of the rows wait for it).
pub(super) fn merged_rows(
    gpu: &Gpu,
    parts: &[Arc<PartLists>],
    own: usize,
    (at, rows, n, w): (usize, usize, usize, usize),
) -> Result<(Lists, CudaSlice<u64>)> {
    let copies = peer_rows(gpu, parts, own, at..at + rows, w)?;
    let runs = run_addresses(gpu, parts, own, &copies, (at, at), w);
    merge_parts(gpu, &runs, (at, rows, n, w))
}

/// Per part of a shared graph, its lists and cuts of some rows copied to this GPU (`None` at
/// this GPU's own part).
pub(super) type PeerRows = Vec<Option<(CudaSlice<u64>, CudaSlice<u64>)>>;

/// The other parts' lists and cuts of graph rows `rows`, `w` a row, copied to this GPU after
/// each part's lists are made (`None` at this GPU's part, `own`). The parts must stay alive
/// until the stream has passed the copies.
pub(super) fn peer_rows(
    gpu: &Gpu,
    parts: &[Arc<PartLists>],
    own: usize,
    rows: std::ops::Range<usize>,
    w: usize,
) -> Result<PeerRows> {
    let m = rows.len();
    parts
        .iter()
        .enumerate()
        .map(|(g, p)| {
            if g == own {
                return Ok(None);
            }
            let (lists, cut) = (gpu.alloc::<u64>(m * w)?, gpu.alloc::<u64>(m)?);
            let src = (
                &*p.ctx,
                gpu.ptr(&p.lists) + (rows.start * w * 8) as u64,
                &p.ready,
            );
            copy_from_peer(gpu, gpu.ptr(&lists), src, m * w * 8)?;
            let src = (&*p.ctx, gpu.ptr(&p.cut) + (rows.start * 8) as u64, &p.ready);
            copy_from_peer(gpu, gpu.ptr(&cut), src, m * 8)?;
            Ok(Some((lists, cut)))
        })
        .collect()
}

/// Device addresses of graph row `at`'s lists and cut in every part: this GPU's part in
/// place, the others' in `copies` (of rows from `from` on).
pub(super) fn run_addresses(
    gpu: &Gpu,
    parts: &[Arc<PartLists>],
    own: usize,
    copies: &PeerRows,
    (at, from): (usize, usize),
    w: usize,
) -> Vec<(u64, u64)> {
    copies
        .iter()
        .map(|c| match c {
            Some((lists, cut)) => (
                gpu.ptr(lists) + ((at - from) * w * 8) as u64,
                gpu.ptr(cut) + ((at - from) * 8) as u64,
            ),
            None => (
                gpu.ptr(&parts[own].lists) + (at * w * 8) as u64,
                gpu.ptr(&parts[own].cut) + (at * 8) as u64,
            ),
        })
        .collect()
}

/// Graph rows `at..at + rows` of `n` merged from the parts' runs of them (`runs`: each part's
/// lists, `w` a row, and cuts, on this GPU): the lists by (key, id), filled up where short of
/// `w` (see `sym_fill`), and the least of the cuts.
pub(super) fn merge_parts(
    gpu: &Gpu,
    runs: &[(u64, u64)],
    (at, rows, n, w): (usize, usize, usize, usize),
) -> Result<(Lists, CudaSlice<u64>)> {
    if w > 128 {
        return Err(KnnError::Device(format!(
            "shared graph lists of {w} exceed 128"
        )));
    }
    let slots = 32 * list_slots(w);
    let (mut lists, mut cut): (Option<Lists>, Option<Lists>) = (None, None);
    let (first, rest) = runs.split_first().expect("a graph has a part");
    // One part: its rows as they are (merged with nothing).
    let rest: Vec<u64> = if rest.is_empty() {
        vec![0]
    } else {
        rest.iter().map(|r| r.0).collect()
    };
    let rest_cuts: Vec<u64> = runs.iter().skip(1).map(|r| r.1).collect();
    // The merges are on this stream, each reading the one before.
    for b in rest {
        let a = lists.as_ref().map_or(first.0, |l| gpu.ptr(&l.buf));
        lists = Some(merge_runs(gpu, rows, w, slots, (a, 1), b)?);
    }
    for b in rest_cuts.into_iter().chain((runs.len() == 1).then_some(0)) {
        let c = cut.as_ref().map_or(first.1, |l| gpu.ptr(&l.buf));
        cut = Some(merge_runs(gpu, rows, 1, 32, (c, 1), b)?);
    }
    let lists = lists.expect("merged above");
    let f = gpu.func("sym_fill")?;
    let (pl, r64, p064, n64, w32) = (
        gpu.ptr(&lists.buf),
        rows as i64,
        at as i64,
        n as i64,
        w as i32,
    );
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&pl).arg(&r64).arg(&p064).arg(&n64).arg(&w32);
    // SAFETY: lists holds rows × w composites (w ≤ 128); eight warps per block, each with
    // its 128 u64 of the kernel's static shared memory.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (rows.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(dev_err("sym_fill"))?;
    Ok((lists, cut.expect("merged above").buf))
}

/// An event recorded on `gpu`'s stream now.
pub(crate) fn record(gpu: &Gpu) -> Result<CudaEvent> {
    gpu.stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(dev_err("recording an event"))
}
