//! Rows finished on the device (`Engine::finish_rows`, and queries in device memory): the fused
//! method's exact k best of each row, and the floors that prove them final.

use super::CudaEngine;
use crate::floor::{floors, F32_UNIT, TF32_ACC_UNIT, TF32_INPUT_UNIT};
use crate::fused;
use knn_core::{CandidateRequest, Metric, OutputRows, Result};

/// Rows finished by [`CudaEngine::finish_on_device`].
pub(super) struct FinishedOnDevice {
    /// One per row: `true` when the row is final.
    pub(super) proven: Vec<bool>,
    /// For queries in device memory: the squared norms the kernels used (see
    /// `fused::Output::query_sq_norms`).
    pub(super) query_sq_norms: Option<Vec<f32>>,
    /// The centre the kernels subtracted from every row, if any.
    pub(super) centre: Option<Vec<f32>>,
}

impl CudaEngine {
    /// `req`'s rows finished on the device for `k` neighbours under `metric` (see
    /// `Engine::finish_rows`), into `host` (ids, distances; asked for once the work is queued), or with `device` into device
    /// memory (queries read from there too); `None` when this engine does not finish them
    /// (method, metric, width, or a base that is not resident).
    pub(super) fn finish_on_device(
        &self,
        req: &CandidateRequest<'_>,
        metric: &Metric,
        k: usize,
        key_scale: f64,
        host: &mut dyn OutputRows,
        device: Option<fused::DeviceIo>,
    ) -> Result<Option<FinishedOnDevice>> {
        let Some(mode) = self.finish_mode(req, metric, k) else {
            return Ok(None);
        };
        let mut info = self.base_info(req);
        let (finished, cut, input_abs, sq_norms) = {
            let mut gpu = self.locked()?;
            if !self.finishes_resident(&gpu, req, &info)? {
                // Streamed bases give no exact keys: the pipeline re-ranks on the host.
                return Ok(None);
            }
            let finish = fused::Finish {
                k,
                mode,
                host,
                device,
            };
            let rows = self.rows(&mut gpu, req, &info, true, None, Some(finish))?;
            match rows.finished {
                Some(f) => (f, rows.cut, rows.input_abs, rows.query_sq_norms),
                // Not resident after all (memory ran short): the rows are asked again.
                None => return Ok(None),
            }
        };
        let (u, u_in) = if fused::uses_tf32(req) {
            (TF32_ACC_UNIT, TF32_INPUT_UNIT)
        } else {
            (F32_UNIT, 0.0)
        };
        let last: Vec<f32> = finished.last.iter().map(|&c| fused::decode(c).0).collect();
        let qn = match &sq_norms {
            Some(s) => Some(norm_bounds(s, req.base.dim())),
            None => self.device_norms(req, &mut info),
        };
        let floor = floors(
            req,
            (&last, 1),
            &cut,
            (info.bn_max, qn.as_deref()),
            info.centre.as_deref(),
            (u, u_in, input_abs),
        );
        let complete = req.width >= req.available();
        let proven = (0..cut.len())
            .map(|i| complete || finished.kth[i] * key_scale < floor[i] as f64)
            .collect();
        Ok(Some(FinishedOnDevice {
            proven,
            query_sq_norms: sq_norms,
            centre: info.centre,
        }))
    }
}

/// Upper bounds on the norms whose squares a device kernel summed in f32 (`sq_norms` in
/// `common.cuh`: error at most γ_{d+2} of the exact sum, γ_n = nu/(1 − nu), u = 2⁻²⁴), with
/// the host's margin of `floor::norm` (1 + 10⁻⁶). NaN stays NaN.
pub(super) fn norm_bounds(sq: &[f32], d: usize) -> Vec<f32> {
    let nu = (d + 2) as f64 * 2f64.powi(-24);
    let gamma = nu / (1.0 - nu);
    sq.iter()
        .map(|&s| ((s as f64 / (1.0 - gamma)).sqrt() * (1.0 + 1e-6)) as f32)
        .collect()
}
