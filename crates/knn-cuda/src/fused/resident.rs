//! What stays on the device between calls: the resident base ([`Resident`], with the given rows
//! its exact keys are taken of), the view a call has of it ([`BaseView`]), rows copied ahead
//! ([`Prefetched`]), the uploads of base and query rows, and the making of a call's resident
//! base (`make_resident`).

use super::plan::CallPlan;
use super::{Exact, GraphLists, GraphShare};
use crate::device::{dev_err, Gpu};
use cudarc::driver::CudaSlice;
use knn_core::{CandidateRequest, Result};

/// A base kept on the device between calls: its rows (centred when `centre` was given) and
/// squared norms, for the base the pipeline identifies by `key` (see
/// [`CandidateRequest::base_key`]).
pub(crate) struct Resident {
    pub(crate) key: u64,
    pub(super) centre: Option<Vec<f32>>,
    /// `centre` on the device (a call that finds this base resident uploads nothing).
    pub(super) centre_dev: Option<CudaSlice<f32>>,
    pub(super) b: CudaSlice<f32>,
    pub(super) bn: CudaSlice<f32>,
    /// The rows exact keys are taken of, when they are not `b`: the rows as given when `b` is
    /// centred, or Hellinger's given rows (`hellinger`; `b` holds their square roots).
    pub(super) orig: Option<CudaSlice<f32>>,
    pub(super) hellinger: bool,
    /// When the device derived `b` from the given rows (Hellinger's centred roots, see
    /// [`knn_core::CentredRoots`]): each row's norm rounded up, for the floors, which then never
    /// make the host derive the rows.
    pub(crate) norm_up: Option<Vec<f32>>,
    /// The largest magnitude of `b`'s values (f32 bits), on the device and on the host: the
    /// collect form's f16 scale, measured by the first graph that rounds `b` (later graphs of
    /// this base then neither measure it nor wait for the host to read it).
    pub(super) f16_max: std::cell::OnceCell<(CudaSlice<u32>, u32)>,
}

impl Resident {
    /// Device bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        (self.b.len() + self.bn.len() + self.orig.as_ref().map_or(0, |o| o.len())) * 4
    }

    /// Whether this is the base of `key`, centred by `centre`, holding the rows `exact` (when
    /// given) asks for: a call then uses it as it is.
    pub(crate) fn serves(
        &self,
        key: u64,
        centre: Option<&[f32]>,
        exact: Option<Exact<'_>>,
    ) -> bool {
        self.key == key
            && self.centre.as_deref() == centre
            && exact.is_none_or(|e| self.given(e).is_some())
    }

    /// The rows the exact keys `exact` asks for are taken of, if held.
    pub(super) fn given(&self, exact: Exact<'_>) -> Option<&CudaSlice<f32>> {
        match exact {
            Exact::Hellinger { .. } => self.orig.as_ref().filter(|_| self.hellinger),
            Exact::Kernel if self.hellinger => None,
            Exact::Kernel if self.centre.is_none() => Some(&self.b),
            Exact::Kernel => self.orig.as_ref(),
        }
    }
}

/// How the fused method sees the base of one call.
pub(crate) struct BaseView<'a> {
    /// Subtracted from base and queries on the device (squared L2 only: translation leaves
    /// its keys unchanged, and smaller norms tighten the GEMM form's rounding bound).
    pub centre: Option<&'a [f32]>,
    /// The device copy kept from earlier calls, reused when its key and centre match and
    /// replaced otherwise (only when the request has a `base_key` and the base fits).
    pub cache: &'a mut Option<Resident>,
    /// Also compute each candidate's exact f64 key on the device (see
    /// [`knn_core::Engine::candidates_with_exact`]), when the base stays resident.
    pub exact: Option<Exact<'a>>,
    /// Set when the request may be a first try of a whole graph the engine was told of
    /// ([`knn_core::Engine::begin_graph`]): the symmetric lists kept for it, made on the
    /// first such request (see [`GraphLists`]).
    pub graph: Option<&'a mut Option<GraphLists>>,
    /// The engines this one shares graphs' pairs with, if any (see [`GraphShare`]).
    pub share: Option<&'a GraphShare>,
    /// The given base rows copied ahead (see [`Prefetched`]), taken by the upload of those rows.
    pub prefetched: &'a mut Option<Prefetched>,
}

/// The given base rows copied to the device while the host prepared (see
/// `Engine::prefetch_base`), for the requests keyed `key` that upload these very host rows.
pub(crate) struct Prefetched {
    pub(crate) key: u64,
    /// Address and length of the host rows.
    pub(crate) host: (usize, usize),
    pub(crate) buf: CudaSlice<f32>,
}

/// `rows` on the device: the prefetched copy when it holds these very host rows for a request
/// keyed as it is, else uploaded now (a copy prefetched for another key is dropped).
pub(super) fn upload_rows(
    gpu: &Gpu,
    slot: &mut Option<Prefetched>,
    key: Option<u64>,
    rows: &[f32],
) -> Result<CudaSlice<f32>> {
    if slot.as_ref().is_some_and(|p| Some(p.key) != key) {
        *slot = None;
    }
    if slot
        .as_ref()
        .is_some_and(|p| p.host == (rows.as_ptr() as usize, rows.len()))
    {
        return Ok(slot.take().expect("checked above").buf);
    }
    gpu.upload(rows)
}

/// The row of `base` (rows of `d` values) at which `part` starts when `part` is a run of whole
/// rows of that very memory (a borrow of it), else `None`.
pub(super) fn rows_within(base: &[f32], part: &[f32], d: usize) -> Option<usize> {
    let (b0, p0) = (base.as_ptr() as usize, part.as_ptr() as usize);
    let inside = p0 >= b0 && p0 + std::mem::size_of_val(part) <= b0 + std::mem::size_of_val(base);
    (inside && d > 0 && (p0 - b0) % (4 * d) == 0).then(|| (p0 - b0) / (4 * d))
}

/// Base rows `bs..be` on the device, centred by the device vector at `centre` when it is not 0,
/// with their squared norms.
pub(super) fn upload_base(
    gpu: &Gpu,
    req: &CandidateRequest<'_>,
    bs: usize,
    be: usize,
    centre: u64,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let d = req.base.dim();
    let b = gpu.upload(&req.base.as_slice()[bs * d..be * d])?;
    let bn = gpu.alloc::<f32>(be - bs)?;
    gpu.centre_sq_norms(gpu.ptr(&b), be - bs, d, centre, gpu.ptr(&bn))?;
    Ok((b, bn))
}

/// The base made resident for a call that keeps it whole (`plan.bc == nb`) and found no copy
/// of it (`cached` false); `None` otherwise. Its rows are uploaded (taken from the other GPUs'
/// parts on a shared graph's first try), centred by the device vector `centre.0` when it is not
/// 0 (the device's copy `centre.1` is then kept with the base), and measured; Hellinger's
/// centred roots are derived on the device from the given rows, which stay for the exact keys.
pub(super) fn make_resident(
    gpu: &Gpu,
    req: &CandidateRequest<'_>,
    base: &mut BaseView<'_>,
    plan: &CallPlan,
    cached: bool,
    (centre_ptr, centre_dev): (u64, &mut Option<CudaSlice<f32>>),
) -> Result<Option<Resident>> {
    let CallPlan {
        nb,
        d,
        w,
        small,
        derived,
        copies,
        bc,
        ..
    } = *plan;
    // The first try of a graph whose pairs several GPUs share: each uploads a share of the
    // rows and takes the others' from their devices (see `GraphShare::gathered_base`).
    let gathered = match (base.share, req.base_key) {
        (Some(s), Some(key)) if base.graph.is_some() && small && !s.began((key, w)) => {
            Some((s, (key, w)))
        }
        _ => None,
    };
    let mut given_rows = |rows: &[f32]| match gathered {
        Some((s, key)) => {
            // This part's rows, prefetched for a search of the base split among the GPUs.
            let part = Some(knn_core::part_key(key.0, s.part().0));
            s.gathered_base(gpu, key, (rows, d), |own| {
                upload_rows(gpu, base.prefetched, part, own)
            })
        }
        None => upload_rows(gpu, base.prefetched, req.base_key, rows),
    };
    if bc == nb && !cached {
        let r = if let Some(roots) = req.base.centred_roots().filter(|_| derived) {
            // Hellinger's centred roots, derived here from the given rows (uploaded once, and
            // kept for the exact keys) with the host's centre: the same bits as the host's.
            let orig = given_rows(roots.given.as_slice())?;
            let centre = gpu.upload(roots.centre)?;
            let (b, norm_up) = (gpu.alloc::<f32>(nb * d)?, gpu.alloc::<f32>(nb)?);
            let ptrs = (gpu.ptr(&b), gpu.ptr(&norm_up));
            gpu.hellinger_roots(gpu.ptr(&orig), nb, d, gpu.ptr(&centre), ptrs)?;
            let bn = gpu.alloc::<f32>(nb)?;
            gpu.sq_norms(gpu.ptr(&b), nb, d, gpu.ptr(&bn))?;
            Resident {
                key: req.base_key.unwrap_or(0),
                centre: None,
                centre_dev: None,
                b,
                bn,
                orig: Some(orig),
                hellinger: true,
                norm_up: Some(gpu.download(&norm_up, nb)?),
                f16_max: Default::default(),
            }
        } else {
            let given = given_rows(req.base.as_slice())?;
            let orig = match base.exact {
                Some(Exact::Hellinger { base: rows, .. }) => {
                    Some(upload_rows(gpu, base.prefetched, req.base_key, rows)?)
                }
                _ if copies == 2 => Some(
                    gpu.stream
                        .clone_dtod(&given)
                        .map_err(dev_err("copying on the device"))?,
                ),
                _ => None,
            };
            let bn = gpu.alloc::<f32>(nb)?;
            gpu.centre_sq_norms(gpu.ptr(&given), nb, d, centre_ptr, gpu.ptr(&bn))?;
            Resident {
                key: req.base_key.unwrap_or(0),
                centre: base.centre.map(<[f32]>::to_vec),
                centre_dev: centre_dev.take(),
                b: given,
                bn,
                orig,
                hellinger: matches!(base.exact, Some(Exact::Hellinger { .. })),
                norm_up: None,
                f16_max: Default::default(),
            }
        };
        return Ok(Some(r));
    }
    Ok(None)
}
