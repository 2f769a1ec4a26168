//! The sizes of one [`run`](super::run): the call's rows and width, how the base is kept
//! (resident or streamed in chunks of `bc` rows), and the query chunks (`qc` rows) that the
//! budget left beside the base allows.

use super::graph::list_slots;
use super::select::FILTER_CAP;
use super::{base_fits, copies, uses_tf32, Exact, BASE_TILE, QUERY_TILE, SMALL_WIDTH_MAX};
use crate::device::Gpu;
use crate::DeviceQueries;
use knn_core::CandidateRequest;

/// The sizes of one call, fixed before it touches the base (see [`CallPlan::new`]).
#[derive(Clone, Copy)]
pub(super) struct CallPlan {
    /// Query rows, base rows, dimension and list width.
    pub(super) nq: usize,
    pub(super) nb: usize,
    pub(super) d: usize,
    pub(super) w: usize,
    /// Lists kept on chip (`w ≤ SMALL_WIDTH_MAX`), and their slots of 32 (see `list_slots`).
    pub(super) small: bool,
    pub(super) slots: usize,
    /// The device derives the base from the given rows (Hellinger's centred roots, when no
    /// centre is given), and the copies of the base the call keeps (see `copies`).
    pub(super) derived: bool,
    pub(super) copies: usize,
    /// Base rows per chunk: `nb` when the base is resident (cached, or fits), else streamed.
    pub(super) bc: usize,
    /// The budget left beside the base (at least 1 MiB), for the query chunks' buffers.
    pub(super) rest: usize,
    /// The request runs on the tensor cores (see [`uses_tf32`]).
    pub(super) tf: bool,
    /// Survivor slots per query of the large-width filter.
    pub(super) cap: usize,
    /// Query rows per chunk (whole query tiles when at least one).
    pub(super) qc: usize,
}

impl CallPlan {
    /// The plan of `req` under `budget` (queries in device memory when `device_queries` is set):
    /// the base resident when it is `cached` or its copies take at most half the budget
    /// (`centred`: a centre is given; `exact`: the exact keys asked for), else streamed in
    /// chunks of half the budget; the query chunks as large as the rest allows.
    pub(super) fn new(
        gpu: &Gpu,
        req: &CandidateRequest<'_>,
        device_queries: Option<DeviceQueries>,
        budget: usize,
        (centred, exact): (bool, Option<Exact<'_>>),
        cached: bool,
    ) -> CallPlan {
        let (nq, nb, d, w) = (
            device_queries.map_or(req.queries.rows(), |q| q.rows),
            req.base.rows(),
            req.base.dim(),
            req.width,
        );
        let small = w <= SMALL_WIDTH_MAX;
        let slots = list_slots(w);
        // Base: resident when it takes at most half the budget, else streamed in chunks.
        let row_bytes = (d + 1) * 4;
        let derived = req.base.centred_roots().is_some() && !centred;
        let fits = base_fits(nb, d, exact, (centred, derived), budget);
        let copies = copies(exact, centred, derived);
        let bc = if cached || fits {
            nb
        } else {
            ((budget / 2 / row_bytes) / BASE_TILE * BASE_TILE).max(BASE_TILE)
        };
        let base_bytes = bc * row_bytes;
        let rest = budget.saturating_sub(base_bytes).max(1 << 20);
        let nsplit_max = (8 * gpu.sm_count).max(1);
        let tf = uses_tf32(req);
        let cap = FILTER_CAP.max(2 * w);
        let per_query = d * 4
            + 8
            + 2 * w * 8
            + if small {
                nsplit_max.min(nb.div_ceil(BASE_TILE)) * w * 8
            } else {
                cap * 8 + 4
            };
        let mut qc = rest / per_query;
        if small {
            // The split lists of one call number at most 4·slots + qblocks tiles of QUERY_TILE
            // rows (see `split_count`; slots ≤ 2 per SM), far fewer than `nsplit_max` per query
            // once the chunk is large: with that bound, a streamed base is sent once per call
            // instead of once per small query chunk.
            let fixed = (nsplit_max + 1) * QUERY_TILE * w * 8;
            let lean = d * 4 + 8 + 3 * w * 8;
            qc = qc.max(rest.saturating_sub(fixed) / lean);
        }
        let qc = qc.clamp(1, nq.max(1));
        let qc = if qc >= QUERY_TILE {
            qc / QUERY_TILE * QUERY_TILE
        } else {
            qc
        };
        CallPlan {
            nq,
            nb,
            d,
            w,
            small,
            slots,
            derived,
            copies,
            bc,
            rest,
            tf,
            cap,
            qc,
        }
    }
}
