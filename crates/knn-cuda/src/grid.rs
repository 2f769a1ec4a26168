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
//!
//! The kernel computes the floor (in f64, rounded down to f32; `+∞` when the list holds every
//! available point).

use crate::device::{dev_err, Gpu};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PinnedHostSlice, PushKernelArg};
use knn_core::{CandidateRequest, Candidates, Engine, Kernel, KnnError, Result};
use rayon::prelude::*;
use std::sync::Mutex;

/// Widest candidate list on the GPU (up to 32 in registers, up to 128 in local memory for
/// retries); wider requests go to the CPU grid engine.
pub const GRID_WIDTH_MAX: usize = 128;
/// Points per cell the grid aims at (before the width's share).
const TARGET_PER_CELL: f64 = 2.0;
/// Most cells of one grid (the scan handles 4096 · 4096 entries).
const MAX_CELLS: usize = (1 << 24) - 1;
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
    /// Page-locked staging memory for the downloads (kept between calls: pinning is slow,
    /// pageable copies into fresh memory slower still).
    staging: Mutex<Option<PinnedHostSlice<u8>>>,
    /// For lists wider than [`GRID_WIDTH_MAX`] and d > 3 (its index cache persists).
    cpu: knn_grid::GridEngine,
    /// The binned base of the last call.
    index: Mutex<Option<DeviceGrid>>,
}

/// A base binned on the device, with what identifies its data.
struct DeviceGrid {
    addr: usize,
    len: usize,
    dim: usize,
    /// [`content_hash`] of the values: a base changed in place is binned anew.
    hash: u64,
    per_cell: f64,
    geom: GridGeom,
    cells: usize,
    starts: CudaSlice<u32>,
    sorted: CudaSlice<f32>,
}

/// Lists up to this width stay in registers; wider ones are retries of a few rows.
const GRID_REGISTER_WIDTH: usize = 32;

/// A 64-bit hash of the values, in parallel (1 MiB chunks hashed with a multiply–rotate mix,
/// then the chunk hashes in order): tells a base changed in place from the cached one.
fn content_hash(x: &[f32]) -> u64 {
    let chunks: Vec<u64> = x
        .par_chunks(1 << 18)
        .map(|c| {
            c.iter().fold(0x243f_6a88_85a3_08d3u64, |h, v| {
                (h ^ v.to_bits() as u64)
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .rotate_left(29)
            })
        })
        .collect();
    chunks.iter().fold(x.len() as u64, |h, &c| {
        (h ^ c).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(31)
    })
}

/// Per-axis minimum and maximum of the rows (parallel).
fn bounding_box(b: &[f32], d: usize) -> ([f32; 3], [f32; 3]) {
    b.par_chunks(d * 4096)
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
        )
}

impl CudaGridEngine {
    /// Opens device `ordinal` and compiles (or loads from the cache) the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        Ok(Self {
            gpu: Mutex::new(Gpu::new(ordinal)?),
            ordinal,
            staging: Mutex::new(None),
            cpu: knn_grid::GridEngine::default(),
            index: Mutex::new(None),
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
        let b = req.base.as_slice();
        let per_cell = TARGET_PER_CELL.max(w as f64 / 2.0);
        let hash = content_hash(b);
        let mut cache = self
            .index
            .lock()
            .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))?;
        // Reuse the binned base of the last call when it is the same data (the pipeline's
        // rounds and retries); a retry's wider list keeps the first call's cell size.
        let reuse = cache.as_ref().is_some_and(|c| {
            c.addr == b.as_ptr() as usize
                && c.len == b.len()
                && c.dim == d
                && c.hash == hash
                && (c.per_cell == per_cell || w > GRID_REGISTER_WIDTH)
        });
        if !reuse {
            *cache = None; // free the old grid first
            let (lo, hi) = bounding_box(b, d);
            let geom = geometry(&lo[..d], &hi[..d], nb, per_cell);
            let cells = geom.g.iter().map(|&g| g as usize).product::<usize>();
            prof.mark(gpu, "bounding box")?;
            let (starts, sorted) = bin(gpu, b, d, nb, &geom, cells)?;
            prof.mark(gpu, "base upload + binning")?;
            *cache = Some(DeviceGrid {
                addr: b.as_ptr() as usize,
                len: b.len(),
                dim: d,
                hash,
                per_cell,
                geom,
                cells,
                starts,
                sorted,
            });
        } else {
            prof.mark(gpu, "cached grid check")?;
        }
        let grid = cache.as_ref().expect("built above");
        let (geom, cells) = (grid.geom, grid.cells);
        let (starts, sorted) = (&grid.starts, &grid.sorted);
        // Queries in cell order too, so that a warp's threads read the same cells.
        let (_qstarts, qsorted) = bin(gpu, req.queries.as_slice(), d, nq, &geom, cells)?;
        let excl = match req.exclude {
            Some(e) => Some(gpu.upload(e)?),
            None => None,
        };
        prof.mark(gpu, "query upload + binning")?;
        let stream = gpu.stream.clone();
        let (p_starts, p_sorted) = (gpu.ptr(starts), gpu.ptr(sorted));
        let ids = gpu.alloc::<u32>(nq * w)?;
        let keys = gpu.alloc::<f32>(nq * w)?;
        let exact = gpu.alloc::<f64>(nq * w)?;
        let floor = gpu.alloc::<f32>(nq)?;
        let kmax = if w == 1 {
            1
        } else if w <= 8 {
            8
        } else if w <= GRID_REGISTER_WIDTH {
            32
        } else {
            128
        };
        let name = format!("grid_query_{d}_{tag}_k{kmax}");
        let (nq64, w32, complete) = (nq as i64, w as i32, i32::from(w >= req.available()));
        let p_ex = excl.as_ref().map_or(0u64, |e| gpu.ptr(e));
        let (p_q, p_ids, p_keys, p_exact, p_floor) = (
            gpu.ptr(&qsorted),
            gpu.ptr(&ids),
            gpu.ptr(&keys),
            gpu.ptr(&exact),
            gpu.ptr(&floor),
        );
        // SAFETY: every pointer is a live buffer of the size the kernel indexes (nq sorted
        // queries, cells + 1 starts, nb sorted points, nq × w outputs, nq floors; `exclude` null
        // or nq u32), and the argument list matches the kernel's one for one.
        unsafe {
            let mut l = stream.launch_builder(gpu.func(&name)?);
            l.arg(&p_q)
                .arg(&nq64)
                .arg(&p_ex)
                .arg(&geom)
                .arg(&p_starts)
                .arg(&p_sorted)
                .arg(&w32)
                .arg(&complete)
                .arg(&p_ids)
                .arg(&p_keys)
                .arg(&p_exact)
                .arg(&p_floor);
            l.launch(launch(nq, 128)).map_err(dev_err("grid query"))?;
        }
        prof.mark(gpu, "ring search")?;
        let (ids, keys, exact, floor) = self.download(gpu, &ids, &keys, &exact, &floor)?;
        prof.mark(gpu, "download")?;
        if let Some(i) = ids.par_iter().position_first(|&id| id as usize >= nb) {
            return Err(KnnError::Device(format!(
                "{}: query {} holds invalid base id {} (unwritten slot)",
                self.name(),
                i / w,
                ids[i]
            )));
        }
        prof.mark(gpu, "checks")?;
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

impl CudaGridEngine {
    /// Copies the four outputs to the host through the pinned staging buffer, then into
    /// vectors in parallel.
    #[allow(clippy::type_complexity)]
    fn download(
        &self,
        gpu: &Gpu,
        ids: &CudaSlice<u32>,
        keys: &CudaSlice<f32>,
        exact: &CudaSlice<f64>,
        floor: &CudaSlice<f32>,
    ) -> Result<(Vec<u32>, Vec<f32>, Vec<f64>, Vec<f32>)> {
        let parts = [
            ids.len() * 4,
            keys.len() * 4,
            exact.len() * 8,
            floor.len() * 4,
        ];
        // 8-byte aligned offsets, so every part can be read as its type.
        let offs: Vec<usize> = parts
            .iter()
            .scan(0usize, |o, &n| {
                let at = *o;
                *o += n.div_ceil(8) * 8;
                Some(at)
            })
            .collect();
        let total = offs[3] + parts[3];
        let mut staging = self
            .staging
            .lock()
            .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))?;
        if staging.as_ref().is_none_or(|s| s.len() < total) {
            *staging = None;
            // SAFETY: the bytes are written by the copies below before they are read.
            let fresh = unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(total, 0) }
                .map_err(dev_err("allocating pinned host memory"))?;
            *staging = Some(fresh);
        }
        let buf = staging
            .as_mut()
            .expect("allocated above")
            .as_mut_slice()
            .map_err(dev_err("pinned host memory"))?;
        let srcs = [gpu.ptr(ids), gpu.ptr(keys), gpu.ptr(exact), gpu.ptr(floor)];
        for i in 0..4 {
            // SAFETY: the destination range lies in the staging buffer, the source is a device
            // buffer of exactly `parts[i]` bytes, and the stream is synchronised below before
            // the bytes are read.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut buf[offs[i]..offs[i] + parts[i]],
                    srcs[i],
                    gpu.stream.cu_stream(),
                )
            }
            .map_err(dev_err("copying from the device"))?;
        }
        gpu.sync()?;
        fn take<T: Copy + Default + Send + Sync>(bytes: &[u8]) -> Vec<T> {
            let n = bytes.len() / std::mem::size_of::<T>();
            // SAFETY: `bytes` starts 8-byte aligned in the pinned buffer and holds n values of
            // T (u32, f32, f64: every bit pattern is valid).
            let src = unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, n) };
            let mut v = vec![T::default(); n];
            v.par_chunks_mut(1 << 16)
                .zip(src.par_chunks(1 << 16))
                .for_each(|(d, s)| d.copy_from_slice(s));
            v
        }
        let part = |i: usize| &buf[offs[i]..offs[i] + parts[i]];
        Ok((take(part(0)), take(part(1)), take(part(2)), take(part(3))))
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
            return self.cpu.candidates_with_exact(req);
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
