//! A query chunk's lists: taken from a whole graph's when its rows are the graph's
//! ([`graph_rows`]), else searched over the base, base chunk by base chunk ([`search_base`]):
//! on-chip lists (the few queries' kernels or the tiles, merged with the lists so far) for
//! W ≤ [`SMALL_WIDTH_MAX`], the large-width path beyond.
//!
//! [`SMALL_WIDTH_MAX`]: super::SMALL_WIDTH_MAX

use super::plan::CallPlan;
use super::resident::upload_base;
use super::select::{large, merge_runs, Large, Lists};
use super::share::{merged_rows, PartLists};
use super::{few, tile_lists, Chunk, GraphLists, GraphShare};
use crate::device::{dev_err, Gpu};
use crate::tuning::CudaTuning;
use cudarc::driver::CudaSlice;
use knn_core::{CandidateRequest, Result};
use std::sync::Arc;

/// What a call searches each of its query chunks with: the kernels named by `tag` under
/// `tuning`, the call's plan, and the base (resident, or streamed from `req` in chunks of
/// `plan.bc` rows, centred by the device vector at `centre` when it is not 0).
pub(super) struct BaseSearch<'a, 'r> {
    pub(super) req: &'a CandidateRequest<'r>,
    pub(super) tuning: &'a CudaTuning,
    pub(super) tag: &'a str,
    pub(super) plan: CallPlan,
    /// The resident base's rows and squared norms, if it is resident.
    pub(super) resident: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
    pub(super) centre: u64,
}

/// A readied query chunk, as its search and its finishing read it (device addresses).
#[derive(Clone, Copy)]
pub(super) struct ChunkView<'a> {
    /// The chunk's query rows `qs..qe` of the call.
    pub(super) qs: usize,
    pub(super) qe: usize,
    /// The rows as the kernels read them (centred) and their squared norms.
    pub(super) q: u64,
    pub(super) qn: u64,
    /// The rows as given, for exact keys.
    pub(super) q_given: u64,
    /// Per query, a base id to leave out (0: none).
    pub(super) excl: u64,
    /// Per row, the smallest entry a truncated split left out.
    pub(super) cut: &'a CudaSlice<u64>,
}

/// Searches the query chunk `view` over the first `chunks` base rows (the whole base, or none
/// when the chunk's lists were taken from a graph's), a base chunk at a time, each chunk's
/// lists merged into `running` (the lists so far, if any).
pub(super) fn search_base(
    gpu: &Gpu,
    search: &BaseSearch<'_, '_>,
    view: &ChunkView<'_>,
    chunks: usize,
    running: &mut Option<Lists>,
) -> Result<()> {
    let BaseSearch {
        req,
        tuning,
        tag,
        resident,
        centre: centre_ptr,
        ..
    } = *search;
    let CallPlan {
        nb,
        d,
        w,
        small,
        slots,
        bc,
        tf,
        cap,
        ..
    } = search.plan;
    let ChunkView {
        qs,
        qe,
        q,
        qn,
        excl: excl_ptr,
        cut,
        ..
    } = *view;
    let n = qe - qs;
    for bs in (0..chunks).step_by(bc) {
        let be = (bs + bc).min(nb);
        let chunk;
        let (b, bn) = match resident {
            Some((b, bn)) => (b, bn),
            None => {
                chunk = upload_base(gpu, req, bs, be, centre_ptr)?;
                (&chunk.0, &chunk.1)
            }
        };
        let bl = be - bs;
        if small {
            // A few queries read the base once, a warp per row (see `few.rs`).
            let few = Chunk {
                q,
                qn,
                n,
                b: (gpu.ptr(b), gpu.ptr(bn)),
                rows: bl,
                id0: bs,
                d,
                exclude: excl_ptr,
                w,
            };
            let (partial, nsplit) = match few::lists(gpu, tag, slots, &few)? {
                Some(done) => done,
                None => {
                    let tile = (tf, tag, slots);
                    let prior = running.as_ref().map(|r| gpu.ptr(&r.buf));
                    tile_lists(gpu, tuning, tile, &few, gpu.ptr(cut), prior)?
                }
            };
            // One split and no earlier chunk: the split's sorted list is the answer.
            let next = if nsplit == 1 && running.is_none() {
                Lists { buf: partial }
            } else {
                merge_runs(
                    gpu,
                    n,
                    w,
                    32 * slots,
                    (gpu.ptr(&partial), nsplit),
                    running.as_ref().map_or(0, |r| gpu.ptr(&r.buf)),
                )?
            };
            // A streamed chunk's host staging is reused by the next upload; resident
            // buffers are freed in stream order, so the host need not wait here.
            if resident.is_none() {
                gpu.sync()?;
            }
            *running = Some(next);
        } else {
            let ctx = Large {
                tag,
                tf,
                n,
                d,
                w,
                cap,
                q,
                qn,
                excl: excl_ptr,
                b: gpu.ptr(b),
                bn: gpu.ptr(bn),
                id0: bs,
            };
            *running = Some(large(gpu, &ctx, bl, running.take())?);
        }
    }
    Ok(())
}

/// The lists of a query chunk whose `n` rows are rows `at..` of a graph whose lists are made
/// (`g`), taken from the graph's into `to.0` with their cuts into `to.1`: merged from every
/// part's lists when several GPUs shared the graph (`parts`: those and this GPU's part, the
/// rows merged counted in `share`), else copied.
pub(super) fn graph_rows(
    gpu: &Gpu,
    (g, at): (&GraphLists, usize),
    parts: Option<&(Vec<Arc<PartLists>>, usize)>,
    share: Option<&GraphShare>,
    (n, w): (usize, usize),
    (running, cut): (&mut Option<Lists>, &mut CudaSlice<u64>),
) -> Result<()> {
    if let Some((parts, own)) = parts {
        // The parts' lists of these rows, merged (see `share::merged_rows`).
        let (rows, least) = merged_rows(gpu, parts, *own, (at, n, g.cut.len(), w))?;
        if let Some(s) = share {
            s.merged(n);
        }
        *running = Some(rows);
        *cut = least;
    } else {
        // The graph's lists of these rows (the same candidates and floors as the kernels'
        // search of the base would give: every other point was met once, by row or by
        // column).
        let mut rows = gpu.alloc::<u64>(n * w)?;
        gpu.stream
            .memcpy_dtod(&g.lists.slice(at * w..(at + n) * w), &mut rows)
            .map_err(dev_err("copying on the device"))?;
        *running = Some(Lists { buf: rows });
        gpu.stream
            .memcpy_dtod(&g.cut.slice(at..at + n), cut)
            .map_err(dev_err("copying on the device"))?;
    }
    Ok(())
}
