//! Where a [`run`](super::run) puts its rows: whole lists into host buffers made before the
//! call takes the device, or finished rows; and the call's rows in the making ([`CallRows`]),
//! taken chunk by chunk and landed by one wait at the call's end.

use super::finish::{
    exact_keys, finish_lists, launch_prove, FinishedChunk, RowFacts, RowsInFlight,
};
use super::graph::graph_finished;
use super::plan::CallPlan;
use super::search::ChunkView;
use super::select::Lists;
use super::timing::Phases;
use super::{Finish, Finished, GraphLists, Output, ProofPlan, Proven};
use crate::device::{dev_err, Gpu, HostVec, LockedPool, Readback};
use cudarc::driver::{CudaSlice, DeviceRepr};
use knn_core::{Kernel, KnnError, Result};
use std::sync::Arc;

/// Where a [`run`](super::run)'s rows go.
pub(crate) enum Results<'a> {
    /// Whole candidate lists to the host, into these buffers (or new ones where they do not
    /// fit the call).
    Lists(HostLists),
    /// Finished on the device, when it holds the exact rows; as lists otherwise.
    Finished(Finish<'a>),
}

impl Results<'_> {
    /// The same destination for a retry of the call (lists' buffers are made anew then).
    pub(crate) fn reborrow(&mut self) -> Results<'_> {
        match self {
            Results::Lists(l) => Results::Lists(std::mem::take(l)),
            Results::Finished(f) => Results::Finished(f.reborrow()),
        }
    }
}

/// The host buffers of a call's `nq × W` lists: composites and, when asked for, exact keys.
/// An engine makes them before it takes the device, on its own thread: zeroed under the
/// device's lock on the rayon pool, where they queued behind the pipeline's work on other
/// rounds, they left each GPU of a base split among 4 idle 6 ms (up to 38) of every 190 ms
/// round. Blocks of the engine's page-locked pool where they fit one (see [`LockedPool`]).
#[derive(Default)]
pub(crate) struct HostLists {
    composites: HostVec<u64>,
    exact: Option<HostVec<f64>>,
}

impl HostLists {
    /// Buffers for `entries` list entries, with exact keys when `exact`: blocks of `pool`, or
    /// ordinary memory zeroed on the calling thread (every page made here, not by the
    /// download).
    pub(crate) fn new(entries: usize, exact: bool, pool: &Arc<LockedPool>) -> HostLists {
        fn buffer<T: knn_core::pages::Zeroable + DeviceRepr + Default>(
            n: usize,
            pool: &Arc<LockedPool>,
        ) -> HostVec<T> {
            pool.take(n).unwrap_or_else(|| {
                let mut v = Vec::with_capacity(n);
                v.resize(n, T::default());
                HostVec::Heap(v)
            })
        }
        HostLists {
            composites: buffer(entries, pool),
            exact: exact.then(|| buffer(entries, pool)),
        }
    }

    /// Composites for `entries` entries, and exact keys when `exact`: these buffers where they
    /// are that long, new zeroed ones otherwise.
    pub(super) fn take(self, entries: usize, exact: bool) -> (HostVec<u64>, Option<HostVec<f64>>) {
        fn sized<T: knn_core::pages::Zeroable>(v: Option<HostVec<T>>, len: usize) -> HostVec<T> {
            v.filter(|v| v.len() == len)
                .unwrap_or_else(|| HostVec::Heap(knn_core::pages::zeroed_huge(len)))
        }
        let exact = exact.then(|| sized(self.exact, entries));
        (sized(Some(self.composites), entries), exact)
    }
}

/// The rows of one [`run`](super::run) in the making: the host's lists, exact keys and cuts,
/// or the rows finished on the device (`finish`), with what their finishing and proof need on
/// the device and the readback that lands them. (Fields drop in the order listed: the
/// readback, whose drop waits for reads still in flight, before the buffers they read.)
pub(super) struct CallRows<'g, 'f> {
    /// Finished rows read back to the host, landed by the call's one wait at its end.
    in_flight: Vec<RowsInFlight>,
    reads: Readback<'g>,
    /// Word 0: a bad id in a finished row; 1–3: `prove_rows`' summary.
    summary: Option<CudaSlice<u32>>,
    /// Made when the first rows are finished, behind the first chunk's kernels: the device
    /// starts on those meanwhile.
    proven: Option<CudaSlice<u8>>,
    bad_flagged: bool,
    finished: Option<Finished>,
    cut_all: Vec<u64>,
    exact: Option<HostVec<f64>>,
    out: HostVec<u64>,
    /// The rows to finish, when they finish here (only with exact keys at hand).
    pub(super) finish: Option<Finish<'f>>,
    /// How the device proves the finished rows, when it does (the host then reads one
    /// summary, not each row's facts).
    proof: Option<ProofPlan>,
    /// The call's query rows.
    nq: usize,
}

impl<'g, 'f> CallRows<'g, 'f> {
    /// The rows of a call of `nq` query rows and width `w`: finished by `finish` (proven on
    /// the device by `proof`, when set), else whole lists into `lists_made` (with exact keys
    /// when `exact`).
    pub(super) fn new(
        gpu: &'g Gpu,
        finish: Option<Finish<'f>>,
        proof: Option<ProofPlan>,
        lists_made: HostLists,
        exact: bool,
        (nq, w): (usize, usize),
    ) -> Self {
        let host_facts = if proof.is_some() { 0 } else { nq };
        let lists = if finish.is_some() { 0 } else { nq * w };
        // Every row is written by a download (see `take_chunk`).
        let (out, exact) = lists_made.take(lists, exact);
        let cut_all = vec![0u64; host_facts];
        let finished = finish.as_ref().map(|_| Finished {
            kth: vec![0.0; host_facts],
            last: vec![0; host_facts],
            proof: None,
        });
        let reads = gpu.readback();
        CallRows {
            in_flight: Vec::new(),
            reads,
            summary: None,
            proven: None,
            bad_flagged: false,
            finished,
            cut_all,
            exact,
            out,
            finish,
            proof,
            nq,
        }
    }

    /// Rows of a graph whose lists are made: every row is finished at once, by the first
    /// call, and each call downloads its own (rows `qs..qe` of the call, rows `at..` of the
    /// graph, whose exact keys are of the kind `given.0` of the given rows at `given.1`, whose
    /// squared norms lie at `qn`). Rows written to device memory are proven there (when the
    /// call has a proof): nothing of theirs is downloaded. `false` when the graph's rows are
    /// not finished (or these rows are not to be).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn download_graph_rows(
        &mut self,
        gpu: &Gpu,
        (g, at): (&GraphLists, usize),
        (exact_kind, gb, d): (Option<Kernel>, &CudaSlice<f32>, usize),
        qn: u64,
        rest: usize,
        (qs, qe): (usize, usize),
    ) -> Result<bool> {
        let CallRows {
            finish,
            finished,
            cut_all,
            summary,
            proven,
            proof,
            nq,
            bad_flagged,
            ..
        } = self;
        let (Some(f), Some(done)) = (finish.as_mut(), finished.as_mut()) else {
            return Ok(false);
        };
        let given = (exact_kind, gpu.ptr(gb), d);
        // Rows for the caller's device memory are finished there, at the graph's row numbers
        // and all n at once: only for a call whose rows are the graph's, in order.
        if f.device.is_some() && (*nq != g.cut.len() || at != qs) {
            return Ok(false);
        }
        // They flag a bad list in the call's summary, read by its wait.
        let into = match f.device {
            Some(io) => {
                let (_, words) = proof_buffers(gpu, summary, proven, *nq, proof.is_some())?;
                *bad_flagged = true;
                Some((io, words))
            }
            None => None,
        };
        let all = graph_finished(gpu, g, (f.k, f.mode), given, rest, into, None)?;
        let Some(all) = all.filter(|a| a.holds(at, qe - qs)) else {
            return Ok(false);
        };
        if let (Some((_, words)), Some(plan), Some(p)) = (into, *proof, proven.as_ref()) {
            let (kth, last) = all.facts_at(gpu, at);
            let cut = gpu.ptr(&g.cut) + (at * 8) as u64;
            let verdicts = (gpu.ptr(p) + qs as u64, words);
            launch_prove(gpu, plan, (kth, last, cut, qn), qe - qs, verdicts)?;
            return Ok(true);
        }
        // No proof on the device: the rows' facts go to the host's floors (their ids and
        // distances too, unless they went to the caller's memory).
        let k = f.k;
        let rows = match f.device {
            Some(_) => None,
            None => {
                let (ids, dists) = f.host.buffers();
                Some((&mut ids[qs * k..qe * k], &mut dists[qs * k..qe * k]))
            }
        };
        let rows = FinishedChunk {
            rows,
            kth: &mut done.kth[qs..qe],
            last: &mut done.last[qs..qe],
        };
        all.download(gpu, at, rows, (&g.cut, &mut cut_all[qs..qe]))?;
        Ok(true)
    }

    /// Takes a query chunk's lists `r` (the rows of `view`) to the host: when the given base
    /// rows are held (`given.1`, whose exact keys are of the kind `given.0`), their exact keys,
    /// and with them the rows finished on the device (queued in the readback, or written to
    /// the caller's device memory) or the keys downloaded; then the lists, unless finished,
    /// and the rows' cuts, unless the device proves the rows.
    pub(super) fn take_chunk(
        &mut self,
        gpu: &Gpu,
        (exact_kind, given_base): (Option<Kernel>, Option<&CudaSlice<f32>>),
        plan: &CallPlan,
        view: &ChunkView<'_>,
        r: &Lists,
        phases: &mut Phases,
    ) -> Result<()> {
        let CallPlan { nb, d, w, .. } = *plan;
        let ChunkView {
            qs,
            qe,
            qn,
            q_given,
            excl: excl_ptr,
            cut,
            ..
        } = *view;
        let n = qe - qs;
        let nq = self.nq;
        let CallRows {
            in_flight,
            reads,
            summary,
            proven,
            bad_flagged,
            finished,
            cut_all,
            exact,
            out,
            finish,
            proof,
            ..
        } = self;
        let proof = *proof;
        if let (Some(gb), Some(ex)) = (given_base, exact.as_mut()) {
            let (gb, rb) = (gpu.ptr(gb), gpu.ptr(&r.buf));
            let keys = exact_keys(gpu, exact_kind, (q_given, n), (gb, nb), rb, w, d)?;
            phases.lap(gpu, "exact keys");
            if let (Some(f), Some(done)) = (finish.as_mut(), finished.as_mut()) {
                let (_, words) = proof_buffers(gpu, summary, proven, nq, proof.is_some())?;
                let (k, mode) = (f.k, f.mode);
                let lists = (&r.buf, &keys, w);
                let on_device = f.device.map(|io| io.row(qs, k));
                let flags = (nb, excl_ptr);
                let facts = match (proof, &*proven) {
                    (Some(plan), Some(p)) => RowFacts::Device {
                        plan,
                        cut: gpu.ptr(cut),
                        qsq: qn,
                        proven: gpu.ptr(p) + qs as u64,
                        summary: words,
                    },
                    _ => RowFacts::Host(&mut done.kth[qs..qe], &mut done.last[qs..qe]),
                };
                in_flight.extend(finish_lists(
                    gpu,
                    lists,
                    (k, mode),
                    flags,
                    words,
                    (&mut *f.host, qs * k..qe * k),
                    facts,
                    on_device,
                    reads,
                    n,
                )?);
                *bad_flagged = true;
            } else {
                gpu.download_into(&keys, &mut ex[qs * w..qe * w])?;
            }
        }
        phases.lap(gpu, "finished or keys down");
        if finished.is_none() {
            gpu.download_into(&r.buf, &mut out[qs * w..qe * w])?;
        }
        if proof.is_none() {
            gpu.download_into(cut, &mut cut_all[qs..qe])?;
        }
        phases.lap(gpu, "downloads");
        Ok(())
    }

    /// Lands the call's rows with one wait (the finished rows' reads and the summary's words
    /// behind them), checks the summary (a bad id fails the call) and reads the device's
    /// verdicts; returns the call's [`Output`] with its kernels' time and input rounding.
    pub(super) fn land(self, gpu: &Gpu, kernel_ms: Option<f32>, input_abs: f64) -> Result<Output> {
        let CallRows {
            mut finish,
            nq,
            proof,
            out,
            exact,
            cut_all,
            mut finished,
            proven,
            bad_flagged,
            summary,
            mut reads,
            in_flight,
        } = self;
        // The output, asked for before the wait: its pages are made while the device works.
        let output = match finish.as_mut() {
            Some(f) if !in_flight.is_empty() => Some(f.host.buffers()),
            _ => None,
        };
        // The summary's words, behind the finished rows: one wait lands them all. (Only
        // `finish_lists` flags a bad id: rows from a finished graph were checked by their own
        // download, and waiting here would wait for the graph's later launches too.) No
        // summary: no rows were finished, none flagged.
        let read_words = bad_flagged || proof.is_some();
        let mut words = [0u32; 4];
        let queued = match &summary {
            // SAFETY: the summary holds 4 words, alive until the wait below.
            Some(s) if read_words => Some(unsafe { reads.queue::<u32>(gpu.ptr(s), 4)? }.ok_or(s)),
            _ => None,
        };
        reads.wait()?;
        match queued {
            Some(Ok(q)) => reads.take(q, &mut words),
            // No room left in the readback: read on its own.
            Some(Err(s)) => gpu.download_into(s, &mut words)?,
            None => {}
        }
        if let Some((ids, dists)) = output {
            for rows in in_flight {
                rows.land(&reads, (&mut *ids, &mut *dists));
            }
        }
        drop(reads);
        if read_words {
            if words[0] != 0 {
                return Err(KnnError::Device(
                    "a candidate list holds an unwritten slot or an excluded id".into(),
                ));
            }
            if let (Some(done), Some(_)) = (finished.as_mut(), proof) {
                // Every row proven (the usual case): no verdicts to read.
                let rows = match &proven {
                    Some(p) if words[1] != 0 => {
                        gpu.download(p, nq)?.into_iter().map(|b| b != 0).collect()
                    }
                    _ => vec![true; nq],
                };
                let query_top = if words[3] != 0 {
                    f32::NAN
                } else {
                    f32::from_bits(words[2])
                };
                done.proof = Some(Proven { rows, query_top });
            }
        }
        Ok(Output {
            composites: out,
            cut: cut_all,
            exact: exact.filter(|_| finished.is_none()),
            finished,
            kernel_ms,
            input_abs,
        })
    }
}

/// The call's summary words (made zeroed) and, when `proved`, its `nq` verdict bytes, made by
/// the first rows finished: their device addresses (0: no verdicts).
fn proof_buffers(
    gpu: &Gpu,
    summary: &mut Option<CudaSlice<u32>>,
    proven: &mut Option<CudaSlice<u8>>,
    nq: usize,
    proved: bool,
) -> Result<(u64, u64)> {
    if summary.is_none() {
        let words = gpu.stream.alloc_zeros::<u32>(4);
        *summary = Some(words.map_err(dev_err("allocating device memory"))?);
    }
    if proved && proven.is_none() {
        *proven = Some(gpu.alloc::<u8>(nq)?);
    }
    let p = proven.as_ref().map_or(0, |p| gpu.ptr(p));
    Ok((p, summary.as_ref().map_or(0, |s| gpu.ptr(s))))
}
