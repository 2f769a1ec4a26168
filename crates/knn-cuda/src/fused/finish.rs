//! Rows finished on the device: the `k` best of each row's candidates by exact f64 key, as
//! distances ([`Finish`], [`Finished`]), and the exact keys themselves (`exact_keys`).

use crate::device::{dev_err, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::{Kernel, OutputRows, Result};

/// Rows to finish on the device (see `knn_core::Engine::finish_rows`): the `k` best of each
/// row's candidates by exact key, as distances of `mode` (see `finish_lists` in
/// `common.cuh`), written into `host` (`nq × k` ids and distances, asked for only once the
/// rows' launches are queued), or with `device`, read from and written to device memory
/// (`host` then unused).
pub(crate) struct Finish<'a> {
    pub k: usize,
    pub mode: i32,
    pub host: &'a mut dyn OutputRows,
    pub device: Option<DeviceIo>,
}

/// A call whose queries and results lie in device memory (the request's host queries are then
/// empty and unused): `rows × d` f32 queries at `queries`, rows finished into `rows × k` u32
/// ids at `ids` and f32 distances at `dists`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeviceIo {
    pub queries: u64,
    pub rows: usize,
    pub ids: u64,
    pub dists: u64,
}

impl Finish<'_> {
    /// The same rows, borrowed again (for a retry of a call).
    pub(crate) fn reborrow(&mut self) -> Finish<'_> {
        Finish {
            k: self.k,
            mode: self.mode,
            host: &mut *self.host,
            device: self.device,
        }
    }
}

/// What the host needs besides the finished rows: per row, the k-th exact key and the W-th
/// composite (whose key, with the row's `cut`, gives its floor).
pub(crate) struct Finished {
    pub kth: Vec<f64>,
    pub last: Vec<u64>,
}

/// One query chunk's share of the finished rows.
pub(super) struct FinishedChunk<'a> {
    pub(super) ids: &'a mut [u32],
    pub(super) dists: &'a mut [f32],
    pub(super) kth: &'a mut [f64],
    pub(super) last: &'a mut [u64],
}

/// Launches `finish_lists` on the chunk's candidate lists (`lists`: composites, exact keys,
/// width) and downloads its rows into entries `host.1` of `host.0` (asked for once the launch
/// is queued), or with `on_device` (device addresses of the chunk's ids and distances) writes
/// them there; downloads the rows' k-th keys and W-th composites into `kth` and `last`.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish_lists(
    gpu: &Gpu,
    lists: (&CudaSlice<u64>, &CudaSlice<f64>, usize),
    (k, mode): (usize, i32),
    (nb, excl): (usize, u64),
    bad: u64,
    host: (&mut dyn OutputRows, std::ops::Range<usize>),
    (kth_out, last_out): (&mut [f64], &mut [u64]),
    on_device: Option<(u64, u64)>,
) -> Result<()> {
    let (comps, exact, w) = lists;
    let n = kth_out.len();
    let (own, (ids, dists)) = match on_device {
        Some(to) => (None, to),
        None => {
            let (i, d) = (gpu.alloc::<u32>(n * k)?, gpu.alloc::<f32>(n * k)?);
            let at = (gpu.ptr(&i), gpu.ptr(&d));
            (Some((i, d)), at)
        }
    };
    let kth = gpu.alloc::<f64>(n)?;
    let last = gpu.alloc::<u64>(n)?;
    let rows = (ids, dists, gpu.ptr(&kth), gpu.ptr(&last));
    let lists = (gpu.ptr(comps), gpu.ptr(exact), w);
    launch_finish(gpu, lists, (k, mode), (nb, excl), bad, rows, n)?;
    if let Some((ids, dists)) = &own {
        let (rows, r) = host;
        let (host_ids, host_dists) = rows.buffers();
        gpu.download_into(ids, &mut host_ids[r.clone()])?;
        gpu.download_into(dists, &mut host_dists[r])?;
    }
    gpu.download_into(&kth, kth_out)?;
    gpu.download_into(&last, last_out)?;
    Ok(())
}

/// Launches `finish_lists` (see `common.cuh`) on `n` rows: composites and exact keys at
/// `lists` (`n × w` each), the rows' excluded ids at `excl` (or 0), into the device addresses
/// `out` (ids and distances `n × k`, k-th keys and W-th composites `n`).
pub(super) fn launch_finish(
    gpu: &Gpu,
    (comps, exact, w): (u64, u64, usize),
    (k, mode): (usize, i32),
    (nb, excl): (usize, u64),
    bad: u64,
    (ids, dists, kth, last): (u64, u64, u64, u64),
    n: usize,
) -> Result<()> {
    let (p, pk) = (w.next_power_of_two(), k.next_power_of_two());
    let f = gpu.func("finish_lists")?;
    let (ww, pp, kk, ppk, nb64) = (w as i32, p as i32, k as i32, pk as i32, nb as i64);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&comps)
        .arg(&exact)
        .arg(&ww)
        .arg(&pp)
        .arg(&kk)
        .arg(&ppk)
        .arg(&mode)
        .arg(&nb64)
        .arg(&excl)
        .arg(&ids)
        .arg(&dists)
        .arg(&kth)
        .arg(&last)
        .arg(&bad);
    // SAFETY: comps and exact hold n×w entries, excl n ids (or null), ids and dists n×k, kth
    // and last n, bad one word; the shared memory is the 12·(p + pk) bytes the kernel uses.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: ((p / 2).clamp(32, 512) as u32, 1, 1),
            shared_mem_bytes: (12 * (p + pk)) as u32,
        })
    }
    .map_err(dev_err("finish_lists"))?;
    Ok(())
}

/// Exact f64 keys (as the host's `Kernel::exact` of `kernel`, or with `None` Hellinger's
/// `Metric::exact_key`) of the `n × w` candidate composites `comps` for the given (uncentred)
/// queries `q` (address, rows) against the given base `b` (address, rows).
pub(super) fn exact_keys(
    gpu: &Gpu,
    kernel: Option<Kernel>,
    q: (u64, usize),
    b: (u64, usize),
    comps: u64,
    w: usize,
    d: usize,
) -> Result<CudaSlice<f64>> {
    let n = q.1;
    let out = gpu.alloc::<f64>(n * w)?;
    let kind: Option<i32> = kernel.map(|k| match k {
        Kernel::SqL2 => 0,
        Kernel::NegDot => 1,
        Kernel::L1 => 2,
        Kernel::Linf => 3,
    });
    let name = if kind.is_some() {
        "exact_keys"
    } else {
        "exact_keys_hellinger"
    };
    let f = gpu.func(name)?;
    let (nb64, n64, ww, dd, pc, po) = (
        b.1 as i64,
        n as i64,
        w as i32,
        d as i32,
        comps,
        gpu.ptr(&out),
    );
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&q.0)
        .arg(&b.0)
        .arg(&nb64)
        .arg(&pc)
        .arg(&n64)
        .arg(&ww)
        .arg(&dd);
    if let Some(kind) = &kind {
        l.arg(kind);
    }
    l.arg(&po);
    let cfg = if kind.is_some() {
        // Eight threads per (row, slot).
        LaunchConfig {
            grid_dim: ((n * w).div_ceil(32) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        // One block per row (its query's roots shared), one thread per slot.
        LaunchConfig {
            grid_dim: (n as u32, w.div_ceil(128) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        }
    };
    // SAFETY: q holds n×d floats, b nb×d, comps and out n×w entries.
    unsafe { l.launch(cfg) }.map_err(dev_err(name))?;
    Ok(out)
}
