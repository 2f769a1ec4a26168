//! A query chunk readied for the kernels: its rows read where the resident base lies, or
//! uploaded (or read from the caller's device memory), centred and measured in one launch, with
//! the given rows kept for the exact keys.

use super::resident::rows_within;
use super::Exact;
use crate::device::{Gpu, ReadyRows};
use crate::DeviceQueries;
use cudarc::driver::CudaSlice;
use knn_core::{CandidateRequest, Result};

/// Where a call's query rows are read, the same for each of its chunks.
#[derive(Clone, Copy)]
pub(super) struct QuerySource<'a> {
    /// Queries in device memory (see [`super::DeviceIo`]), if so.
    pub(super) device_queries: Option<DeviceQueries>,
    /// The resident base's rows and squared norms, if it is resident.
    pub(super) resident: Option<(&'a CudaSlice<f32>, &'a CudaSlice<f32>)>,
    /// The exact keys asked for, and the given base rows they are taken of (when held).
    pub(super) exact: Option<Exact<'a>>,
    pub(super) given_base: Option<&'a CudaSlice<f32>>,
    /// The centre on the device (0: none).
    pub(super) centre: u64,
    pub(super) d: usize,
}

/// Device buffers of a query chunk's own, kept until its kernels are done. (Fields drop in
/// the order listed: the reverse of the order in which `ready_queries` declares them.)
pub(super) struct ChunkBuffers {
    _given_own: Option<CudaSlice<f32>>,
    _qn_own: Option<CudaSlice<f32>>,
    _q_own: Option<CudaSlice<f32>>,
    _q_up: Option<CudaSlice<f32>>,
}

/// A query chunk as the kernels read it (device addresses).
pub(super) struct QueryChunk {
    /// The buffers behind the addresses below, to be kept while they are read.
    pub(super) held: ChunkBuffers,
    /// The row of the resident base at which the chunk's rows lie, when they are rows of it.
    pub(super) alias: Option<usize>,
    /// The rows as the kernels read them (centred), and their squared norms.
    pub(super) q: u64,
    pub(super) qn: u64,
    /// The rows as given, for exact keys (uncentred; Hellinger's: not square-rooted).
    pub(super) q_given: u64,
    /// The rows' cuts, made empty by the launch that readied the rows (when there was one).
    pub(super) cut: Option<CudaSlice<u64>>,
}

/// Readies the query rows `qs..qe` of `req` for the kernels: rows of the resident base are
/// read where it lies; others are uploaded (or read from device memory) and readied in one
/// launch (centred into a copy of their own, measured, their cut made empty). The given rows
/// stay for the exact keys (Hellinger's given queries uploaded unless they lie in its base).
pub(super) fn ready_queries(
    gpu: &Gpu,
    req: &CandidateRequest<'_>,
    src: &QuerySource<'_>,
    (qs, qe): (usize, usize),
) -> Result<QueryChunk> {
    let QuerySource {
        device_queries,
        resident,
        exact,
        given_base,
        centre: centre_ptr,
        d,
    } = *src;
    let n = qe - qs;
    // Queries that are rows of the resident base (a graph's rounds) are read where the
    // base lies: nothing to upload, centre or measure again.
    let alias = match device_queries {
        Some(_) => None,
        None => resident.and_then(|_| req.queries.slice_rows(qs, qe).row_offset_in(&req.base)),
    };
    // Buffers of this chunk's own, kept until its kernels are done.
    let (mut q_up, mut q_own, mut _qn_own) = (None, None, None);
    let mut given_own: Option<CudaSlice<f32>> = None;
    // The query rows as given (the caller's, or uploaded) when they are not rows of the
    // resident base, readied below in one launch: centred into a copy of their own (the
    // given rows stay for the exact keys), measured, and their cut made empty.
    let mut given_q = None;
    let (q, qn) = match (alias, resident) {
        (Some(at), Some((b, bn))) => (
            gpu.ptr(b) + (at * d * 4) as u64,
            gpu.ptr(bn) + (at * 4) as u64,
        ),
        _ => {
            let from = *given_q.insert(match device_queries {
                Some(dq) => dq.ptr + (qs * d * 4) as u64,
                None => {
                    gpu.ptr(q_up.insert(gpu.upload(req.queries.slice_rows(qs, qe).as_slice())?))
                }
            });
            let q = match centre_ptr {
                0 => from,
                _ => gpu.ptr(q_own.insert(gpu.alloc::<f32>(n * d)?)),
            };
            (q, gpu.ptr(_qn_own.insert(gpu.alloc::<f32>(n)?)))
        }
    };
    // The given query rows, for exact keys (uncentred; Hellinger's: not square-rooted).
    let q_given = match (exact, given_base) {
        (Some(Exact::Hellinger { base: hb, queries }), Some(gb)) => {
            let rows = &queries[qs * d..qe * d];
            match rows_within(hb, rows, d) {
                Some(at) => gpu.ptr(gb) + (at * d * 4) as u64,
                None => gpu.ptr(given_own.insert(gpu.upload(rows)?)),
            }
        }
        (_, Some(gb)) if centre_ptr != 0 => match (alias, given_q) {
            (Some(at), _) => gpu.ptr(gb) + (at * d * 4) as u64,
            (None, from) => from.expect("set above for rows not of the base"),
        },
        _ => q,
    };
    let mut cut = None;
    if let Some(from) = given_q {
        let c = gpu.ptr(cut.insert(gpu.alloc::<u64>(n)?));
        let to = if centre_ptr == 0 { 0 } else { q };
        let ready = ReadyRows {
            from,
            to,
            centre: centre_ptr,
            norms: qn,
            cut: c,
        };
        gpu.ready_rows(n, d, ready)?;
    }
    Ok(QueryChunk {
        held: ChunkBuffers {
            _given_own: given_own,
            _qn_own,
            _q_own: q_own,
            _q_up: q_up,
        },
        alias,
        q,
        qn,
        q_given,
        cut,
    })
}
