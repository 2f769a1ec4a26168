//! [`CudaEngine`]: the public face of the crate; no CUDA types cross it.

use crate::device::{driver_device_count, is_oom, Gpu};
use crate::floor::{floors, max_norm, F32_UNIT, TF32_ACC_UNIT, TF32_INPUT_UNIT};
use crate::fused::{self, SELECT_WIDTH_MAX, SMALL_WIDTH_MAX};
use knn_core::{CandidateRequest, Candidates, Engine, ExprPlan, Kernel, KnnError, Result};
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

/// How the candidates are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// Fused tiles with on-chip top-k (the fast method).
    Fused,
    /// Seed 000: global-memory tiled distance kernel + modified insertion sort.
    Global,
    /// Seed 000: base points read through a texture object + modified insertion sort.
    Texture,
    /// Seed 000: cuBLAS GEMM form + modified insertion sort (L1/L∞ use the global kernel).
    Cublas,
}

impl Method {
    /// Every method, fast one first.
    pub const ALL: [Method; 4] = [
        Method::Fused,
        Method::Global,
        Method::Texture,
        Method::Cublas,
    ];

    /// Name as accepted by [`FromStr`].
    pub fn name(self) -> &'static str {
        match self {
            Method::Fused => "fused",
            Method::Global => "global",
            Method::Texture => "texture",
            Method::Cublas => "cublas",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = KnnError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "fused" => Ok(Method::Fused),
            "global" => Ok(Method::Global),
            "texture" => Ok(Method::Texture),
            "cublas" => Ok(Method::Cublas),
            _ => Err(KnnError::Option(format!(
                "unknown CUDA method '{s}' (expected one of: fused, global, texture, cublas)"
            ))),
        }
    }
}

/// A CUDA device with one method. Calls are serialised on the device's stream.
pub struct CudaEngine {
    gpu: Mutex<Gpu>,
    method: Method,
    ordinal: usize,
    budget: Option<usize>,
    last_kernel_ms: Mutex<Option<f32>>,
}

/// Smallest working budget tried before giving up with `OutOfMemory`.
const MIN_BUDGET: usize = 16 << 20;

impl CudaEngine {
    /// Opens device `ordinal`, compiles (or loads from the cache) the kernels.
    pub fn new(ordinal: usize, method: Method) -> Result<Self> {
        let gpu = Gpu::new(ordinal)?;
        Ok(Self {
            gpu: Mutex::new(gpu),
            method,
            ordinal,
            budget: None,
            last_kernel_ms: Mutex::new(None),
        })
    }

    /// Caps the device memory this engine's tiles may use (default: 70 % of free memory);
    /// small caps force query and base tiling (base streamed from host), as for inputs larger
    /// than the GPU.
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.budget = Some(bytes.max(1 << 16));
        self
    }

    /// Device time in ms of the last fused call's kernels (CUDA events; transfers and host
    /// work excluded), for benchmarks.
    pub fn last_kernel_ms(&self) -> Option<f32> {
        self.last_kernel_ms.lock().ok().and_then(|m| *m)
    }

    /// `true` when a CUDA driver and at least one device are present. Never panics.
    pub fn available() -> bool {
        driver_device_count() > 0
    }

    /// Registers, local (spill) bytes and static shared memory of the main kernels, for tuning.
    pub fn kernel_report(&self) -> String {
        match self.gpu.lock() {
            Ok(g) => g.kernel_report(),
            Err(_) => String::new(),
        }
    }

    /// The method this engine runs.
    pub fn method(&self) -> Method {
        self.method
    }

    /// Row-major `nq × W` (keys, ids) of `req` with this engine's method, or with the fused
    /// method and an expression module's kernels when `expr` names one.
    fn rows(
        &self,
        gpu: &mut Gpu,
        req: &CandidateRequest<'_>,
        expr: Option<&str>,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        gpu.ctx
            .bind_to_thread()
            .map_err(crate::device::dev_err("binding the context"))?;
        let (free, _) = gpu.mem_info()?;
        let mut budget = self.budget.unwrap_or(free / 10 * 7);
        loop {
            let r = match (self.method, expr) {
                (Method::Fused, _) | (_, Some(_)) => {
                    let tag = expr.unwrap_or_else(|| fused::kernel_tag(req.kernel));
                    fused::run(gpu, req, budget, tag).map(|(c, ms)| {
                        if let Ok(mut m) = self.last_kernel_ms.lock() {
                            *m = ms;
                        }
                        c.into_iter()
                            .map(fused::decode)
                            .unzip::<f32, u32, Vec<f32>, Vec<u32>>()
                    })
                }
                (m, None) => crate::baseline::run(gpu, req, m, budget),
            };
            match r {
                Err(e) if is_oom(&e) => {
                    let _ = gpu.sync();
                    if budget / 2 < MIN_BUDGET {
                        let d = req.base.dim();
                        return Err(KnnError::OutOfMemory {
                            device: gpu.name.clone(),
                            needed: (MIN_BUDGET + (req.queries.rows().min(128) + 128) * (d + 1) * 4)
                                as u64,
                            available: gpu.mem_info().map_or(0, |m| m.0) as u64,
                        });
                    }
                    budget /= 2;
                }
                r => return r,
            }
        }
    }
}

impl Engine for CudaEngine {
    fn name(&self) -> String {
        format!("cuda:{}/{}", self.ordinal, self.method)
    }

    /// The fused method's first tries of GEMM kernels run on TF32 tensor cores, whose rounding
    /// bound (about 4·2⁻¹¹‖q‖‖b‖) spans more neighbours: on-chip widths are filled up to their
    /// slot count (32, 64, 128: same cost), wider lists get k/4 more.
    fn candidate_width(&self, k: usize, available: usize, kernel: Kernel) -> usize {
        let w = k + 4 + k / 16;
        let w = if self.method != Method::Fused || !kernel.is_gemm() {
            w
        } else if w <= SMALL_WIDTH_MAX {
            w.next_power_of_two().max(32)
        } else {
            w.max(k + k / 4)
        };
        w.min(available)
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        let (nq, nb, w) = (req.queries.rows(), req.base.rows(), req.width);
        if w == 0 || w > req.available() {
            return Err(KnnError::Option(format!(
                "candidate width {w} outside 1..={}",
                req.available()
            )));
        }
        if nq == 0 {
            return Ok(Candidates {
                width: w,
                ids: vec![],
                keys: vec![],
                floor: vec![],
            });
        }
        if w > SELECT_WIDTH_MAX {
            // Only re-asks of a few hard rows get this wide: the CPU engine scans them.
            return knn_cpu::CpuEngine::default().candidates(req);
        }
        let (keys, ids) = {
            let mut gpu = self
                .gpu
                .lock()
                .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))?;
            self.rows(&mut gpu, req, None)?
        };
        // Every slot must have been written with a valid, allowed id.
        for (i, row) in ids.chunks(w).enumerate() {
            let skip = req.exclude.map(|e| e[i]);
            if let Some(&bad) = row
                .iter()
                .find(|&&id| id as usize >= nb || Some(id) == skip)
            {
                return Err(KnnError::Device(format!(
                    "{}: query {i} holds invalid base id {bad} (unwritten or excluded slot)",
                    self.name()
                )));
            }
        }
        let bn_max = if req.kernel.is_gemm() {
            max_norm(req.base)
        } else {
            0.0
        };
        let (u, u_in) = if self.method == Method::Fused && fused::uses_tf32(req) {
            (TF32_ACC_UNIT, TF32_INPUT_UNIT)
        } else {
            (F32_UNIT, 0.0)
        };
        let floor = floors(req, &keys, bn_max, u, u_in);
        Ok(Candidates {
            width: w,
            ids,
            keys,
            floor,
        })
    }

    /// Expression metrics run the fused method (whatever this engine's method) with the
    /// program's kernels: the L1 kernel's structure, the generated operation in its place.
    fn candidates_expr(&self, req: &CandidateRequest<'_>, plan: &ExprPlan) -> Result<Candidates> {
        let (nq, nb, w) = (req.queries.rows(), req.base.rows(), req.width);
        if w == 0 || w > req.available() {
            return Err(KnnError::Option(format!(
                "candidate width {w} outside 1..={}",
                req.available()
            )));
        }
        if nq == 0 {
            return Ok(Candidates {
                width: w,
                ids: vec![],
                keys: vec![],
                floor: vec![],
            });
        }
        if w > SELECT_WIDTH_MAX {
            // Only re-asks of a few hard rows get this wide: the CPU engine scans them.
            return knn_cpu::CpuEngine::default().candidates_expr(req, plan);
        }
        let (keys, ids) = {
            let mut gpu = self
                .gpu
                .lock()
                .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))?;
            gpu.ctx
                .bind_to_thread()
                .map_err(crate::device::dev_err("binding the context"))?;
            let tag = gpu.expr_kernels(plan.program(), req.base.dim())?;
            self.rows(&mut gpu, req, Some(&tag))?
        };
        for (i, row) in ids.chunks(w).enumerate() {
            let skip = req.exclude.map(|e| e[i]);
            if let Some(&bad) = row
                .iter()
                .find(|&&id| id as usize >= nb || Some(id) == skip)
            {
                return Err(KnnError::Device(format!(
                    "{}: query {i} holds invalid base id {bad} (unwritten or excluded slot)",
                    self.name()
                )));
            }
        }
        let complete = w >= req.available();
        let floor = (0..nq)
            .map(|i| {
                if complete {
                    f32::INFINITY
                } else {
                    plan.floor(keys[i * w + w - 1])
                }
            })
            .collect();
        Ok(Candidates {
            width: w,
            ids,
            keys,
            floor,
        })
    }
}
