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
    /// For queries the kernels measured (not rows of the resident base): the largest upper
    /// bound on their norms, as the kernels used them (centred); NaN when a norm is not
    /// finite.
    pub(super) query_top: Option<f32>,
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
        let (u, u_in) = if fused::uses_tf32(req) {
            (TF32_ACC_UNIT, TF32_INPUT_UNIT)
        } else {
            (F32_UNIT, 0.0)
        };
        let d = req.base.dim();
        let complete = req.width >= req.available();
        let proof = fused::ProofPlan {
            kernel: req.kernel,
            d,
            bn_max: info.bn_max,
            units: (u, u_in),
            eta: 0.0,
            key_scale,
            complete,
        };
        let (finished, cut, input_abs, qn) = {
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
                proof: Some(proof),
            };
            let to = fused::Results::Finished(finish);
            let rows = self.rows(&mut gpu, req, &info, true, None, to)?;
            match rows.finished {
                Some(f) => {
                    // Read while this call holds the device (see `candidates_inner`).
                    let qn = match f.proof {
                        Some(_) => None,
                        None => self.device_norms(req, &mut info),
                    };
                    (f, rows.cut, rows.input_abs, qn)
                }
                // Not resident after all (memory ran short): the rows are asked again.
                None => return Ok(None),
            }
        };
        if let Some(p) = finished.proof {
            return Ok(Some(FinishedOnDevice {
                proven: p.rows,
                query_top: Some(p.query_top),
                centre: info.centre,
            }));
        }
        // Rows of the resident base: the host's floors, with the norms the engine keeps.
        let last: Vec<f32> = finished.last.iter().map(|&c| fused::decode(c).0).collect();
        let floor = floors(
            req,
            (&last, 1),
            &cut,
            (info.bn_max, qn.as_deref()),
            info.centre.as_deref(),
            (u, u_in, input_abs),
        );
        // A k-th key beyond f32 is a distance that overflows: left to the caller's path,
        // which reports it (rows written to device memory are not checked otherwise).
        let proven = (0..cut.len())
            .map(|i| {
                let kth = finished.kth[i];
                (complete || kth * key_scale < floor[i] as f64) && (kth as f32).is_finite()
            })
            .collect();
        Ok(Some(FinishedOnDevice {
            proven,
            query_top: None,
            centre: info.centre,
        }))
    }
}
