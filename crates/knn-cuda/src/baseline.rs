//! The three methods of seed 000: a distance matrix per chunk (global-memory tiles, texture
//! reads, or cuBLAS), then the seed's modified insertion sort keeping the W smallest.
//! Queries (and, when needed, the base) are split so the distance chunk fits the budget.

use crate::device::{dev_err, Gpu};
use crate::engine::Method;
use cudarc::cublas::{sys as blas_sys, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{sys, CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::{CandidateRequest, Kernel, KnnError, Result};

fn tag(k: Kernel) -> &'static str {
    match k {
        Kernel::SqL2 => "sql2",
        Kernel::NegDot => "negdot",
        Kernel::L1 => "l1",
        Kernel::Linf => "linf",
    }
}

/// Grid limit of the tile kernels' y dimension, in base points.
const MAX_BASE_CHUNK: usize = 65535 * 16;

/// Runs a baseline; returns row-major `nq × W` (keys, ids), rows sorted by (key, id).
pub(crate) fn run(
    gpu: &mut Gpu,
    req: &CandidateRequest<'_>,
    method: Method,
    budget: usize,
) -> Result<(Vec<f32>, Vec<u32>)> {
    let (nq, nb, d, w) = (
        req.queries.rows(),
        req.base.rows(),
        req.base.dim(),
        req.width,
    );
    // cuBLAS has no L1 / L∞: those fall back to the global-memory kernel.
    let use_blas = method == Method::Cublas && req.kernel.is_gemm();
    if use_blas && gpu.blas.is_none() {
        let blas = std::panic::catch_unwind(|| CudaBlas::new(gpu.stream.clone()))
            .map_err(|_| KnnError::Device("cuBLAS (libcublas.so) could not be loaded".into()))?
            .map_err(|e| KnnError::Device(format!("cuBLAS: {e:?}")))?;
        gpu.blas = Some(blas);
    }
    let mut bc = nb.min(MAX_BASE_CHUNK);
    if nb * (d + 1) * 4 > budget / 3 {
        bc = bc.min((budget / 3 / ((d + 1) * 4)).max(16));
    }
    if method == Method::Texture {
        let max_tex = gpu
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH)
            .map_err(dev_err("texture limit"))? as usize;
        bc = bc.min((max_tex / d).max(1));
    }
    let per_query = bc * 4 + w * 8 + d * 4 + 16;
    let qc = ((budget * 2 / 3) / per_query).clamp(1, nq);
    let qc = if use_blas { qc } else { qc.min(65535 * 16) };

    let mut keys = vec![0f32; nq * w];
    let mut ids = vec![u32::MAX; nq * w];
    for qs in (0..nq).step_by(qc) {
        let qe = (qs + qc).min(nq);
        let n = qe - qs;
        let q = gpu.upload(&req.queries.as_slice()[qs * d..qe * d])?;
        let qn = gpu.alloc::<f32>(n)?;
        gpu.sq_norms(gpu.ptr(&q), n, d, gpu.ptr(&qn))?;
        let excl_ptr_buf = match req.exclude {
            Some(e) => Some(gpu.upload(&e[qs..qe])?),
            None => None,
        };
        let excl_ptr = excl_ptr_buf.as_ref().map_or(0, |e| gpu.ptr(e));
        let lk = gpu.alloc::<f32>(n * w)?;
        let li = gpu.alloc::<u32>(n * w)?;
        let count: CudaSlice<i32> = gpu
            .stream
            .alloc_zeros(n)
            .map_err(dev_err("allocating device memory"))?;
        let mut dist = gpu.alloc::<f32>(n * bc)?;
        for bs in (0..nb).step_by(bc) {
            let be = (bs + bc).min(nb);
            let bl = be - bs;
            let b = gpu.upload(&req.base.as_slice()[bs * d..be * d])?;
            if use_blas {
                let bn = gpu.alloc::<f32>(bl)?;
                gpu.sq_norms(gpu.ptr(&b), bl, d, gpu.ptr(&bn))?;
                let alpha = if req.kernel == Kernel::SqL2 {
                    -2.0
                } else {
                    -1.0
                };
                // Column-major view: dist (n × bl, ld n) = alpha · Qᵀᵀ · B, with the row-major
                // Q (n×d) and B (bl×d) seen as column-major d×n and d×bl.
                let cfg = GemmConfig {
                    transa: blas_sys::cublasOperation_t::CUBLAS_OP_T,
                    transb: blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    m: n as i32,
                    n: bl as i32,
                    k: d as i32,
                    alpha,
                    lda: d as i32,
                    ldb: d as i32,
                    beta: 0.0f32,
                    ldc: n as i32,
                };
                let blas = gpu.blas.as_ref().expect("created above");
                // SAFETY: q is n×d, b is bl×d, dist holds n×bc ≥ n×bl floats.
                unsafe { blas.gemm(cfg, &q, &b, &mut dist) }
                    .map_err(|e| KnnError::Device(format!("cuBLAS sgemm: {e:?}")))?;
                if req.kernel == Kernel::SqL2 {
                    let f = gpu.func("add_norms")?;
                    let (pd, n64, b64, pqn, pbn) = (
                        gpu.ptr(&dist),
                        n as i64,
                        bl as i64,
                        gpu.ptr(&qn),
                        gpu.ptr(&bn),
                    );
                    let mut l = gpu.stream.launch_builder(f);
                    l.arg(&pd).arg(&n64).arg(&b64).arg(&pqn).arg(&pbn);
                    let blocks = (n * bl).div_ceil(256).min(1 << 20) as u32;
                    // SAFETY: dist holds n×bl keys, qn n and bn bl norms.
                    unsafe {
                        l.launch(LaunchConfig {
                            grid_dim: (blocks, 1, 1),
                            block_dim: (256, 1, 1),
                            shared_mem_bytes: 0,
                        })
                    }
                    .map_err(dev_err("add_norms"))?;
                }
                gpu.sync()?;
            } else {
                let tex = if method == Method::Texture {
                    Some(texture(gpu, gpu.ptr(&b), bl * d)?)
                } else {
                    None
                };
                let kind = if tex.is_some() { "texture" } else { "global" };
                let name = format!("dist_{kind}_{}", tag(req.kernel));
                let f = gpu.func(&name)?;
                let (pq, n64, pb, t, b64, dd, pd) = (
                    gpu.ptr(&q),
                    n as i64,
                    gpu.ptr(&b),
                    tex.unwrap_or(0),
                    bl as i64,
                    d as i32,
                    gpu.ptr(&dist),
                );
                let mut l = gpu.stream.launch_builder(f);
                l.arg(&pq)
                    .arg(&n64)
                    .arg(&pb)
                    .arg(&t)
                    .arg(&b64)
                    .arg(&dd)
                    .arg(&pd);
                // SAFETY: q n×d, b bl×d (or its texture), dist n×bl.
                let r = unsafe {
                    l.launch(LaunchConfig {
                        grid_dim: (n.div_ceil(16) as u32, bl.div_ceil(16) as u32, 1),
                        block_dim: (16, 16, 1),
                        shared_mem_bytes: 0,
                    })
                }
                .map_err(dev_err(&name));
                let s = gpu.sync();
                if let Some(t) = tex {
                    // SAFETY: the texture was created above and no launch uses it any more.
                    unsafe { sys::cuTexObjectDestroy(t) };
                }
                r?;
                s?;
            }
            let f = gpu.func("modified_insertion_sort")?;
            let (pd, n64, b64, id0, ww, plk, pli, pc) = (
                gpu.ptr(&dist),
                n as i64,
                bl as i64,
                bs as u32,
                w as i32,
                gpu.ptr(&lk),
                gpu.ptr(&li),
                gpu.ptr(&count),
            );
            let mut l = gpu.stream.launch_builder(f);
            l.arg(&pd)
                .arg(&n64)
                .arg(&b64)
                .arg(&id0)
                .arg(&excl_ptr)
                .arg(&ww)
                .arg(&plk)
                .arg(&pli)
                .arg(&pc);
            // SAFETY: dist n×bl, lists W×n, count n.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (n.div_ceil(128) as u32, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(dev_err("modified_insertion_sort"))?;
            gpu.sync()?;
        }
        let hk = gpu.download(&lk, n * w)?;
        let hi = gpu.download(&li, n * w)?;
        let hc = gpu.download(&count, n)?;
        for j in 0..n {
            if hc[j] as usize != w {
                return Err(KnnError::Device(format!(
                    "{}: query {} got {} of {w} candidates",
                    method,
                    qs + j,
                    hc[j]
                )));
            }
            for t in 0..w {
                keys[(qs + j) * w + t] = hk[t * n + j];
                ids[(qs + j) * w + t] = hi[t * n + j];
            }
        }
    }
    Ok((keys, ids))
}

/// A texture object reading `len` floats of linear device memory at `ptr`.
fn texture(_gpu: &Gpu, ptr: u64, len: usize) -> Result<sys::CUtexObject> {
    // SAFETY: plain-old-data descriptors, zeroed then filled as the driver API documents.
    unsafe {
        let mut res: sys::CUDA_RESOURCE_DESC = std::mem::zeroed();
        res.resType = sys::CUresourcetype::CU_RESOURCE_TYPE_LINEAR;
        res.res.linear.devPtr = ptr;
        res.res.linear.format = sys::CUarray_format::CU_AD_FORMAT_FLOAT;
        res.res.linear.numChannels = 1;
        res.res.linear.sizeInBytes = len * 4;
        let tex_desc: sys::CUDA_TEXTURE_DESC = std::mem::zeroed();
        let mut t: sys::CUtexObject = 0;
        sys::cuTexObjectCreate(&mut t, &res, &tex_desc, std::ptr::null())
            .result()
            .map_err(dev_err("creating the texture object"))?;
        Ok(t)
    }
}
