//! [`CudaGridEngine`]: the exact grid method for low dimensions (d ≤ 3) on a GPU.
//!
//! Per call: the base is uploaded and binned into a uniform grid by a counting sort on the
//! device (`grid_count_*`, a three-kernel exclusive scan, `grid_scatter_*`), then one thread per
//! query searches rings of cells of growing Chebyshev distance around its own cell, keeping its
//! `W` best (key, id) pairs in registers, until the W-th key is no larger than the distance to
//! any unvisited cell (`kernels/grid.cu`). Keys are direct (no GEMM form), and the kernel also
//! returns each candidate's exact f64 key, bit for bit [`Kernel::exact`], so the pipeline needs
//! no host re-rank reads.
//!
//! Floor of a row (a lower bound on the exact key of every point it left out): the smaller of
//! - the unvisited region's bound: per axis, the gap from the query to the searched cube's face,
//!   less a margin for the binning's rounding (8 ulps of |lo| + extent + |q|), squared for L2;
//!   times (1 − 2⁻²⁰) for the rounding of that arithmetic;
//! - the best computed key among visited points that were not kept, times (1 − 2⁻²⁰): a key of
//!   at most 3 terms, each a rounded difference (and square), then rounded sums, is within
//!   6u < 2⁻²⁰ (relative) of the exact one.

use crate::device::{dev_err, Gpu};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use knn_core::{CandidateRequest, Candidates, Engine, Kernel, KnnError, Result};
use rayon::prelude::*;
use std::sync::Mutex;

/// Widest candidate list kept in registers; wider requests go to the CPU grid engine.
pub const GRID_WIDTH_MAX: usize = 32;
/// Points per cell the grid aims at (before the width's share).
const TARGET_PER_CELL: f64 = 2.0;
/// Most cells of one grid (the scan handles 4096 · 4096 entries).
const MAX_CELLS: usize = (1 << 24) - 1;
/// Relative margin taken off every bound (see the module docs).
const BOUND_SHRINK: f64 = 1.0 - 1.0 / (1u64 << 20) as f64;
const SCAN_BLOCK: usize = 4096;

/// Grid geometry as the kernels read it (`GridGeom` in `kernels/grid.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct GridGeom {
    lo: [f32; 3],
    inv: [f32; 3],
    size: [f32; 3],
    g: [i32; 3],
}

// SAFETY: plain-old-data with the C layout of the kernels' struct (12 four-byte fields).
unsafe impl DeviceRepr for GridGeom {}

/// The grid method on one CUDA device.
pub struct CudaGridEngine {
    gpu: Mutex<Gpu>,
    ordinal: usize,
}

impl CudaGridEngine {
    /// Opens device `ordinal` and compiles (or loads from the cache) the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        Ok(Self {
            gpu: Mutex::new(Gpu::new(ordinal)?),
            ordinal,
        })
    }
}

/// Cells per axis for `n` points in a box of `extent`, about `per_cell` points per cell.
fn geometry(lo: &[f32], hi: &[f32], n: usize, per_cell: f64) -> GridGeom {
    let d = lo.len();
    let ext: Vec<f64> = (0..d).map(|a| hi[a] as f64 - lo[a] as f64).collect();
    let live: Vec<f64> = ext.iter().copied().filter(|&e| e > 0.0).collect();
    let cells_wanted = (n as f64 / per_cell).clamp(1.0, MAX_CELLS as f64);
    // Side of a cube cell holding `per_cell` points on average over the live axes.
    let side = if live.is_empty() {
        1.0
    } else {
        (live.iter().product::<f64>() / cells_wanted).powf(1.0 / live.len() as f64)
    };
    let mut geom = GridGeom {
        g: [1; 3],
        ..Default::default()
    };
    for (g, &e) in geom.g.iter_mut().zip(&ext) {
        if e > 0.0 {
            *g = (e / side).ceil().clamp(1.0, 1e6) as i32;
        }
    }
    // Rounding of the side can overshoot the cell cap: shrink the largest axis until it fits.
    while geom.g.iter().map(|&g| g as usize).product::<usize>() > MAX_CELLS {
        let a = (0..3).max_by_key(|&a| geom.g[a]).unwrap_or(0);
        geom.g[a] = (geom.g[a] / 2).max(1);
    }
    for a in 0..d {
        geom.lo[a] = lo[a];
        if ext[a] > 0.0 {
            geom.size[a] = (ext[a] / geom.g[a] as f64) as f32;
            geom.inv[a] = (geom.g[a] as f64 / ext[a]) as f32;
        } else {
            geom.size[a] = 1.0;
            geom.inv[a] = 0.0;
        }
    }
    geom
}

fn launch(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(threads as usize).max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn tag(k: Kernel) -> Result<&'static str> {
    Ok(match k {
        Kernel::SqL2 => "sql2",
        Kernel::L1 => "l1",
        Kernel::Linf => "linf",
        Kernel::NegDot => {
            return Err(KnnError::Option(
                "the grid method has no distance-to-cell bound for the inner product or cosine"
                    .into(),
            ))
        }
    })
}

/// The largest f32 not above `x`.
fn round_down(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) > x {
        f.next_down()
    } else {
        f
    }
}

/// Phase timings on stderr when `KNN_PROFILE` is set (synchronising after each phase).
struct Profile(Option<std::cell::Cell<std::time::Instant>>);

impl Profile {
    fn new() -> Self {
        Profile(
            std::env::var_os("KNN_PROFILE")
                .is_some()
                .then(|| std::cell::Cell::new(std::time::Instant::now())),
        )
    }

    fn mark(&self, gpu: &Gpu, what: &str) -> Result<()> {
        if let Some(t) = &self.0 {
            gpu.sync()?;
            let now = std::time::Instant::now();
            eprintln!(
                "grid: {what}: {:.2} ms",
                (now - t.get()).as_secs_f64() * 1e3
            );
            t.set(now);
        }
        Ok(())
    }
}

/// Uploads `n` points of dimension `d` and sorts them into the cells of `geom` on the device:
/// returns the cell starts (`cells + 1`, exclusive scan of the counts) and the points as
/// float4 (x, y, z, index) in cell order.
fn bin(
    gpu: &Gpu,
    x: &[f32],
    d: usize,
    n: usize,
    geom: &GridGeom,
    cells: usize,
) -> Result<(CudaSlice<u32>, CudaSlice<f32>)> {
    let stream = gpu.stream.clone();
    let xs = gpu.upload(x)?;
    let starts = stream
        .alloc_zeros::<u32>(cells + 1)
        .map_err(dev_err("allocating the grid"))?;
    let cell_of = gpu.alloc::<u32>(n)?;
    let cursor = gpu.alloc::<u32>(cells + 1)?;
    let nblocks = (cells + 1).div_ceil(SCAN_BLOCK);
    let sums = gpu.alloc::<u32>(nblocks)?;
    let sorted = gpu.alloc::<f32>(4 * n)?;
    let (n64, ncells64, nb32) = (n as i64, (cells + 1) as i64, nblocks as i32);
    let (p_x, p_cell, p_starts, p_cursor, p_sums, p_sorted) = (
        gpu.ptr(&xs),
        gpu.ptr(&cell_of),
        gpu.ptr(&starts),
        gpu.ptr(&cursor),
        gpu.ptr(&sums),
        gpu.ptr(&sorted),
    );
    let block = |blocks: usize| LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY (all launches): every pointer is a live buffer of this function of the size the
    // kernel indexes (n points × d, cells + 1 counts, nblocks sums, 4·n floats), and the
    // kernels' argument lists match these types one for one.
    unsafe {
        let mut l = stream.launch_builder(gpu.func(&format!("grid_count_{d}"))?);
        l.arg(&p_x).arg(&n64).arg(geom).arg(&p_starts).arg(&p_cell);
        l.launch(launch(n, 256)).map_err(dev_err("grid count"))?;
        let mut l = stream.launch_builder(gpu.func("grid_scan_blocks")?);
        l.arg(&p_starts).arg(&ncells64).arg(&p_sums);
        l.launch(block(nblocks)).map_err(dev_err("grid scan"))?;
        let mut l = stream.launch_builder(gpu.func("grid_scan_sums")?);
        l.arg(&p_sums).arg(&nb32);
        l.launch(block(1)).map_err(dev_err("grid scan"))?;
        let mut l = stream.launch_builder(gpu.func("grid_scan_add")?);
        l.arg(&p_starts).arg(&ncells64).arg(&p_sums).arg(&p_cursor);
        l.launch(launch(cells + 1, 256))
            .map_err(dev_err("grid scan"))?;
        let mut l = stream.launch_builder(gpu.func(&format!("grid_scatter_{d}"))?);
        l.arg(&p_x)
            .arg(&n64)
            .arg(&p_cell)
            .arg(&p_cursor)
            .arg(&p_sorted);
        l.launch(launch(n, 256)).map_err(dev_err("grid scatter"))?;
    }
    Ok((starts, sorted))
}

impl CudaGridEngine {
    fn run(&self, gpu: &mut Gpu, req: &CandidateRequest<'_>) -> Result<(Candidates, Vec<f64>)> {
        let (nq, nb, d, w) = (
            req.queries.rows(),
            req.base.rows(),
            req.base.dim(),
            req.width,
        );
        let tag = tag(req.kernel)?;
        gpu.ctx
            .bind_to_thread()
            .map_err(dev_err("binding the context"))?;
        let prof = Profile::new();
        // Bounding box of the base (host, parallel).
        let b = req.base.as_slice();
        let (lo, hi) = b
            .par_chunks(d * 4096)
            .map(|c| {
                let (mut lo, mut hi) = ([f32::INFINITY; 3], [f32::NEG_INFINITY; 3]);
                for r in c.chunks_exact(d) {
                    for a in 0..d {
                        lo[a] = lo[a].min(r[a]);
                        hi[a] = hi[a].max(r[a]);
                    }
                }
                (lo, hi)
            })
            .reduce(
                || ([f32::INFINITY; 3], [f32::NEG_INFINITY; 3]),
                |(l1, h1), (l2, h2)| {
                    (
                        std::array::from_fn(|a| l1[a].min(l2[a])),
                        std::array::from_fn(|a| h1[a].max(h2[a])),
                    )
                },
            );
        let geom = geometry(&lo[..d], &hi[..d], nb, TARGET_PER_CELL.max(w as f64 / 2.0));
        let cells = geom.g.iter().map(|&g| g as usize).product::<usize>();

        prof.mark(gpu, "bounding box")?;
        let (starts, sorted) = bin(gpu, b, d, nb, &geom, cells)?;
        prof.mark(gpu, "base upload + binning")?;
        // Queries in cell order too, so that a warp's threads read the same cells.
        let (_qstarts, qsorted) = bin(gpu, req.queries.as_slice(), d, nq, &geom, cells)?;
        let excl = match req.exclude {
            Some(e) => Some(gpu.upload(e)?),
            None => None,
        };
        prof.mark(gpu, "query upload + binning")?;
        let stream = gpu.stream.clone();
        let (p_starts, p_sorted) = (gpu.ptr(&starts), gpu.ptr(&sorted));
        let ids = gpu.alloc::<u32>(nq * w)?;
        let keys = gpu.alloc::<f32>(nq * w)?;
        let exact = gpu.alloc::<f64>(nq * w)?;
        let rest = gpu.alloc::<f32>(nq)?;
        let region = gpu.alloc::<f32>(nq)?;
        let kmax = if w == 1 {
            1
        } else if w <= 8 {
            8
        } else {
            32
        };
        let name = format!("grid_query_{d}_{tag}_k{kmax}");
        let (nq64, w32) = (nq as i64, w as i32);
        let p_ex = excl.as_ref().map_or(0u64, |e| gpu.ptr(e));
        let (p_q, p_ids, p_keys, p_exact, p_rest, p_region) = (
            gpu.ptr(&qsorted),
            gpu.ptr(&ids),
            gpu.ptr(&keys),
            gpu.ptr(&exact),
            gpu.ptr(&rest),
            gpu.ptr(&region),
        );
        // SAFETY: every pointer is a live buffer of the size the kernel indexes (nq sorted
        // queries, cells + 1 starts, nb sorted points, nq × w outputs; `exclude` null or nq
        // u32), and the argument list matches the kernel's one for one.
        unsafe {
            let mut l = stream.launch_builder(gpu.func(&name)?);
            l.arg(&p_q)
                .arg(&nq64)
                .arg(&p_ex)
                .arg(&geom)
                .arg(&p_starts)
                .arg(&p_sorted)
                .arg(&w32)
                .arg(&p_ids)
                .arg(&p_keys)
                .arg(&p_exact)
                .arg(&p_rest)
                .arg(&p_region);
            l.launch(launch(nq, 128)).map_err(dev_err("grid query"))?;
        }
        prof.mark(gpu, "ring search")?;
        let ids = gpu.download(&ids, nq * w)?;
        let keys = gpu.download(&keys, nq * w)?;
        let exact = gpu.download(&exact, nq * w)?;
        let rest = gpu.download(&rest, nq)?;
        let region = gpu.download(&region, nq)?;
        gpu.sync()?;
        prof.mark(gpu, "download")?;
        if let Some(i) = ids.iter().position(|&id| id as usize >= nb) {
            return Err(KnnError::Device(format!(
                "{}: query {} holds invalid base id {} (unwritten slot)",
                self.name(),
                i / w,
                ids[i]
            )));
        }
        let complete = w >= req.available();
        let floor = rest
            .iter()
            .zip(&region)
            .map(|(&r, &g)| {
                if complete {
                    f32::INFINITY
                } else {
                    round_down((r as f64).min(g as f64) * BOUND_SHRINK)
                }
            })
            .collect();
        Ok((
            Candidates {
                width: w,
                ids,
                keys,
                floor,
            },
            exact,
        ))
    }
}

impl Engine for CudaGridEngine {
    fn name(&self) -> String {
        format!("cuda:{}/grid", self.ordinal)
    }

    /// Exactly k: the floor comes from the cells and points left out, not from extra
    /// candidates.
    fn candidate_width(&self, k: usize, available: usize, _kernel: Kernel) -> usize {
        k.min(available)
    }

    /// One call per search where memory allows: each call bins the base anew.
    fn min_round_queries(&self) -> usize {
        1 << 24
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        Ok(self.candidates_with_exact(req)?.0)
    }

    fn candidates_with_exact(
        &self,
        req: &CandidateRequest<'_>,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        let (nq, d, w) = (req.queries.rows(), req.base.dim(), req.width);
        if w == 0 || w > req.available() {
            return Err(KnnError::Option(format!(
                "candidate width {w} outside 1..={}",
                req.available()
            )));
        }
        if nq == 0 {
            let empty = Candidates {
                width: w,
                ids: vec![],
                keys: vec![],
                floor: vec![],
            };
            return Ok((empty, Some(vec![])));
        }
        if d > 3 || w > GRID_WIDTH_MAX || req.base.rows() > u32::MAX as usize / 2 {
            // Wider lists (retries of rare rows, or k > 32) and higher dimensions: the CPU grid.
            return knn_grid::GridEngine::default().candidates_with_exact(req);
        }
        let mut gpu = self
            .gpu
            .lock()
            .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))?;
        let (c, exact) = self.run(&mut gpu, req)?;
        Ok((c, Some(exact)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_follows_count_and_shape() {
        let g = geometry(&[0.0, 0.0, 0.0], &[1.0, 1.0, 1.0], 1 << 21, 2.0);
        let cells: usize = g.g.iter().map(|&x| x as usize).product();
        assert!((1 << 19..=1 << 21).contains(&cells), "{g:?}");
        // A flat box gets one cell along its flat axis and keeps lo + g·size = hi.
        let g = geometry(&[0.0, 5.0], &[4.0, 5.0], 1000, 2.0);
        assert_eq!(g.g[1], 1);
        assert!((g.lo[0] + g.g[0] as f32 * g.size[0] - 4.0).abs() < 1e-5);
        // Huge counts stay under the cell cap.
        let g = geometry(&[0.0; 3], &[1.0, 1e6, 1.0], 1 << 31, 0.5);
        assert!(g.g.iter().map(|&x| x as usize).product::<usize>() <= MAX_CELLS);
    }
}
