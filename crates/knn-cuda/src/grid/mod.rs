//! [`CudaGridEngine`]: the exact grid method for low dimensions (d ≤ 3) on a GPU.
//!
//! Per call: the base and the queries go to the device through page-locked staging memory
//! (the host copies one chunk on every core while the device takes the previous one; the
//! base's bounding box is taken on the way), then each is binned into a uniform grid by a
//! counting sort on the device (`grid_count_*`, a three-kernel exclusive scan,
//! `grid_scatter_*`). Cells holding more than [`CROWD_MIN`] base points (clustered data) get a
//! sub-grid over their points' bounding box, their points reordered by sub-cell. One thread per
//! query then searches rings of cells of growing Chebyshev distance around its own cell, keeping
//! its `W` best (key, id) pairs in registers and skipping cells (and sub-cells) whose distance
//! bound exceeds its W-th key, until that key is below the bound of every unvisited cell
//! (`kernels/grid.cu`). Keys are direct (no GEMM form).
//!
//! Two outputs:
//! - [`Engine::finish_rows`] (the pipeline's first round): the kernel computes the exact f64 keys
//!   of its W = k candidates, checks them against the floor as the pipeline's re-rank would,
//!   and writes final ids and distances straight into the pipeline's output, with a flag per
//!   row; only the rare rows not proven come back as candidates;
//! - [`Engine::candidates_with_exact`] (retries): candidates, their exact f64 keys (bit for bit
//!   [`Kernel::exact`]) and floors.
//!
//! Floor of a row (a lower bound on the exact key of every point it left out): the smaller of
//! - the best computed key among visited points that were not kept, times (1 − 2⁻²¹): a key of
//!   at most 3 terms, each a rounded difference (and square), then rounded sums, is within
//!   6u < 2⁻²¹ (relative) of the exact one;
//! - the smallest bound of a cell, sub-cell or region skipped (per axis, the gap from the query
//!   to the cell's face less a margin for the binning's rounding: 8 ulps of |lo| + extent + |q|,
//!   combined as the key combines axes), times (1 − 2⁻²⁰) for the rounding of that arithmetic.
//!
//! A cell is skipped, and the search stops, only when its bound exceeds the W-th computed key by
//! a factor 1 + 2⁻¹⁸, so skipped regions never keep a row from being proven; rows fail only when
//! a rejected point's key lies within 2⁻²¹ of the k-th (a near tie), a few per million.
//!
//! Device buffers and the staging memory are kept between calls (allocating and freeing a few
//! hundred MB per call cost more than the search). The binned base is reused only within one
//! pipeline run (same [`CandidateRequest::base_key`]: later rounds and retries); every search
//! bins its base anew, so each search's time includes its binning, and nothing has to prove a
//! cached grid current by reading the base.

use crate::device::{dev_err, Gpu};
use crate::staging::{bytes_of, bytes_of_mut, PIECE};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use knn_core::{
    CandidateRequest, Candidates, Engine, FinishedRows, Kernel, KnnError, Metric, Result,
};
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
/// Most entries one exclusive scan handles (its block sums are scanned by one block).
const SCAN_MAX: usize = SCAN_BLOCK * SCAN_BLOCK;
/// A cell with more base points than this (and than 8 times the target) gets a sub-grid.
const CROWD_MIN: usize = 32;
/// Bytes of a `SubGrid` record in `kernels/grid.cu` (a `GridGeom`, then two u32).
const SUBGRID_BYTES: usize = 56;
/// Final rows up to this width keep their lists in registers; wider ones, and the candidates of
/// retries, in local memory.
const GRID_REGISTER_WIDTH: usize = 32;

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
    state: Mutex<State>,
    ordinal: usize,
    /// Serves lists wider than [`GRID_WIDTH_MAX`] and d > 3: the engine the caller paired this
    /// one with (`knn` gives the CPU grid, whose index cache persists).
    fallback: Option<Box<dyn Engine + Send>>,
}

/// The device (with its staging memory) and its buffers, used by one call at a time.
struct State {
    gpu: Gpu,
    bufs: Buffers,
    /// The base binned by an earlier call of the same pipeline run (its
    /// [`CandidateRequest::base_key`], address, length, dimension), reused by the run's later
    /// rounds and retries; its buffers stay untouched until another base is binned.
    binned: Option<((u64, usize, usize, usize), Binned)>,
}

/// Device buffers kept between calls, one per role, grown when a call needs more.
#[derive(Clone, Copy, Debug)]
enum Buf {
    BaseRaw,
    BaseStarts,
    BaseSorted,
    BaseSubSorted,
    CellOf,
    Cursor,
    Sums,
    CrowdOf,
    Subs,
    SubSizes,
    SubStarts,
    SubCell,
    QueryRaw,
    QueryStarts,
    QuerySorted,
    Exclude,
    Ids,
    Keys,
    Exact,
    Floor,
    Proven,
    Flags,
}
const BUFS: usize = Buf::Flags as usize + 1;

#[derive(Default)]
struct Buffers([Option<CudaSlice<u8>>; BUFS]);

impl Buffers {
    /// Device address of buffer `b` with room for `bytes` (reallocated, contents lost, when
    /// smaller). Addresses taken before of the same buffer are invalid after a growth.
    fn get(&mut self, gpu: &Gpu, b: Buf, bytes: usize) -> Result<u64> {
        let slot = &mut self.0[b as usize];
        if slot.as_ref().is_none_or(|s| s.len() < bytes) {
            *slot = None; // free first
            *slot = Some(gpu.alloc::<u8>(bytes.next_multiple_of(1 << 16))?);
        }
        Ok(gpu.ptr(slot.as_ref().expect("allocated above")))
    }
}

/// Per-axis minimum and maximum of rows of `d` values (a fold of whole rows).
type BBox = ([f32; 3], [f32; 3]);

fn bbox_empty() -> BBox {
    ([f32::INFINITY; 3], [f32::NEG_INFINITY; 3])
}

fn bbox_fold(d: usize) -> impl Fn(BBox, &[u8]) -> BBox + Sync + Send {
    move |(mut lo, mut hi), bytes| {
        for r in bytes.chunks_exact(4 * d) {
            for a in 0..d {
                let v = f32::from_ne_bytes(r[4 * a..4 * a + 4].try_into().expect("4 bytes"));
                lo[a] = lo[a].min(v);
                hi[a] = hi[a].max(v);
            }
        }
        (lo, hi)
    }
}

fn bbox_merge((l1, h1): BBox, (l2, h2): BBox) -> BBox {
    (
        std::array::from_fn(|a| l1[a].min(l2[a])),
        std::array::from_fn(|a| h1[a].max(h2[a])),
    )
}

impl CudaGridEngine {
    /// Opens device `ordinal` and compiles (or loads from the cache) the kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        Ok(Self {
            state: Mutex::new(State {
                gpu: Gpu::new(ordinal)?,
                bufs: Buffers::default(),
                binned: None,
            }),
            ordinal,
            fallback: None,
        })
    }

    /// The same engine with `fallback` serving what the device's grid does not (lists wider
    /// than [`GRID_WIDTH_MAX`], d > 3). Without one such requests are refused with an error.
    pub fn with_fallback(mut self, fallback: Box<dyn Engine + Send>) -> Self {
        self.fallback = Some(fallback);
        self
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))
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

/// The kernel's output mode for final rows of `metric` (`GRID_FINISH_*` in `kernels/grid.cu`):
/// distances are the exact keys, or their square roots.
fn finish_mode(metric: &Metric) -> Option<i32> {
    match metric {
        Metric::SqL2 | Metric::L1 | Metric::Linf => Some(1),
        Metric::L2 | Metric::Mahalanobis(_) => Some(2),
        _ => None,
    }
}

/// Phase timings on stderr when `KNN_PROFILE` is set (synchronising after each phase).
struct Profile(
    Option<std::cell::Cell<std::time::Instant>>,
    std::time::Instant,
);

impl Profile {
    fn new() -> Self {
        let now = std::time::Instant::now();
        Profile(
            std::env::var_os("KNN_PROFILE")
                .is_some()
                .then(|| std::cell::Cell::new(now)),
            now,
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

    fn total(&self, what: &str) {
        if self.0.is_some() {
            eprintln!(
                "grid: {what}: {:.2} ms",
                self.1.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

/// A base binned on the device (addresses into the engine's buffers).
#[derive(Clone, Copy)]
struct Binned {
    geom: GridGeom,
    cells: usize,
    starts: u64,
    sorted: u64,
    /// Sub-grids of crowded cells: (more points than this make a cell crowded, crowd_of, subs,
    /// sub_starts); `None` when no cell is crowded.
    crowd: Option<(u32, u64, u64, u64)>,
}

/// Crowded cells numbered on the device, before their sub-grids are built: more points than
/// `crowd_min` make a cell crowded; `counter` (device u32) counts them.
struct Crowding {
    crowd_min: u32,
    counter: u64,
    crowd_of: u64,
    subs: u64,
}

/// What a call returns: candidates for the pipeline, or final rows written in place.
enum Output<'o> {
    Candidates,
    Finish { mode: i32, rows: FinishedRows<'o> },
}

impl State {
    fn launch_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> KnnError {
        dev_err(what)
    }

    fn memset(&self, ptr: u64, bytes: usize) -> Result<()> {
        // SAFETY: callers pass a device buffer of at least `bytes` bytes.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, 0, bytes, self.gpu.stream.cu_stream())
        }
        .map_err(dev_err("clearing device memory"))
    }

    /// Reads one u32 from the device (synchronising).
    fn read_u32(&mut self, ptr: u64) -> Result<u32> {
        let mut v = [0u8; 4];
        let st = self.gpu.staging()?;
        st.download(&self.gpu, ptr, 4, |_, b| v.copy_from_slice(b))?;
        Ok(u32::from_ne_bytes(v))
    }

    /// Exclusive scan, in place, of `n ≤ SCAN_MAX` u32 at `data`; `cursor` gets a copy.
    fn scan(&mut self, data: u64, n: usize, cursor: u64) -> Result<()> {
        debug_assert!(n <= SCAN_MAX);
        let nblocks = n.div_ceil(SCAN_BLOCK);
        let sums = self.bufs.get(&self.gpu, Buf::Sums, 4 * SCAN_BLOCK)?;
        let gpu = &self.gpu;
        let (n64, nb32) = (n as i64, nblocks as i32);
        let block = |blocks: usize| LaunchConfig {
            grid_dim: (blocks.max(1) as u32, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `data` and `cursor` hold n u32, `sums` SCAN_BLOCK ≥ nblocks; the argument
        // lists match the kernels'.
        unsafe {
            let mut l = gpu.stream.launch_builder(gpu.func("grid_scan_blocks")?);
            l.arg(&data).arg(&n64).arg(&sums);
            l.launch(block(nblocks)).map_err(dev_err("grid scan"))?;
            let mut l = gpu.stream.launch_builder(gpu.func("grid_scan_sums")?);
            l.arg(&sums).arg(&nb32);
            l.launch(block(1)).map_err(dev_err("grid scan"))?;
            let mut l = gpu.stream.launch_builder(gpu.func("grid_scan_add")?);
            l.arg(&data).arg(&n64).arg(&sums).arg(&cursor);
            l.launch(launch(n, 256)).map_err(dev_err("grid scan"))?;
        }
        Ok(())
    }

    /// Counting sort of the `n` points at `raw` (n × d f32 on the device) into the cells of
    /// `geom`: cell starts (`cells + 1`) and points as float4 (x, y, z, index) in cell order.
    #[allow(clippy::too_many_arguments)]
    fn counting_sort(
        &mut self,
        raw: u64,
        n: usize,
        d: usize,
        geom: &GridGeom,
        cells: usize,
        starts: u64,
        sorted: u64,
    ) -> Result<()> {
        let cell_of = self.bufs.get(&self.gpu, Buf::CellOf, 4 * n)?;
        let cursor = self.bufs.get(&self.gpu, Buf::Cursor, 4 * (cells + 1))?;
        self.memset(starts, 4 * (cells + 1))?;
        let n64 = n as i64;
        let gpu = &self.gpu;
        // SAFETY: raw holds n·d f32, starts and cursor cells + 1 u32, cell_of n u32, sorted
        // 4·n f32; the argument lists match the kernels'.
        unsafe {
            let mut l = gpu
                .stream
                .launch_builder(gpu.func(&format!("grid_count_{d}"))?);
            l.arg(&raw).arg(&n64).arg(geom).arg(&starts).arg(&cell_of);
            l.launch(launch(n, 256)).map_err(dev_err("grid count"))?;
        }
        self.scan(starts, cells + 1, cursor)?;
        let gpu = &self.gpu;
        // SAFETY: as above.
        unsafe {
            let mut l = gpu
                .stream
                .launch_builder(gpu.func(&format!("grid_scatter_{d}"))?);
            l.arg(&raw)
                .arg(&n64)
                .arg(&cell_of)
                .arg(&cursor)
                .arg(&sorted);
            l.launch(launch(n, 256)).map_err(dev_err("grid scatter"))?;
        }
        Ok(())
    }

    /// Uploads the base, bins it and numbers its crowded cells (their sub-grids follow in
    /// [`State::sub_grids`]).
    fn bin_base(
        &mut self,
        b: &[f32],
        d: usize,
        per_cell: f64,
        prof: &Profile,
    ) -> Result<(Binned, Option<Crowding>)> {
        let n = b.len() / d;
        let raw = self.bufs.get(&self.gpu, Buf::BaseRaw, 4 * b.len())?;
        let st = self.gpu.staging()?;
        let (lo, hi) = st.upload(
            &self.gpu,
            bytes_of(b),
            raw,
            bbox_empty,
            bbox_fold(d),
            bbox_merge,
        )?;
        prof.mark(&self.gpu, "base upload")?;
        let geom = geometry(&lo[..d], &hi[..d], n, per_cell);
        let cells = geom.g.iter().map(|&g| g as usize).product::<usize>();
        let starts = self.bufs.get(&self.gpu, Buf::BaseStarts, 4 * (cells + 1))?;
        let sorted = self.bufs.get(&self.gpu, Buf::BaseSorted, 16 * n)?;
        self.counting_sort(raw, n, d, &geom, cells, starts, sorted)?;
        let binned = Binned {
            geom,
            cells,
            starts,
            sorted,
            crowd: None,
        };
        let crowding = self.find_crowded(&binned, n, per_cell)?;
        prof.mark(&self.gpu, "base binning")?;
        Ok((binned, crowding))
    }

    /// Numbers the cells of `g` holding more than `crowd_min` of its `n` points on the device
    /// (their count is read later, by [`State::sub_grids`], so the host goes on meanwhile).
    fn find_crowded(&mut self, g: &Binned, n: usize, per_cell: f64) -> Result<Option<Crowding>> {
        let crowd_min = CROWD_MIN.max((8.0 * per_cell).ceil() as usize);
        if n <= crowd_min {
            return Ok(None);
        }
        let max_crowd = n / (crowd_min + 1) + 1;
        let flags = self.bufs.get(&self.gpu, Buf::Flags, 8)?;
        let crowd_of = self.bufs.get(&self.gpu, Buf::CrowdOf, 4 * g.cells)?;
        let subs = self
            .bufs
            .get(&self.gpu, Buf::Subs, SUBGRID_BYTES * max_crowd)?;
        self.memset(flags, 8)?;
        let (cells64, cm32) = (g.cells as i64, crowd_min as u32);
        {
            let gpu = &self.gpu;
            // SAFETY: starts holds cells + 1 u32, crowd_of cells u32, subs room for every
            // crowded cell (each holds > crowd_min of the n points), flags a u32 counter.
            unsafe {
                let mut l = gpu.stream.launch_builder(gpu.func("grid_crowd_find")?);
                l.arg(&g.starts)
                    .arg(&cells64)
                    .arg(&cm32)
                    .arg(&flags)
                    .arg(&crowd_of)
                    .arg(&subs);
                l.launch(launch(g.cells, 256))
                    .map_err(dev_err("grid crowded cells"))?;
            }
        }
        Ok(Some(Crowding {
            crowd_min: cm32,
            counter: flags,
            crowd_of,
            subs,
        }))
    }

    /// Sub-grids for the crowded cells of `g` found by [`State::find_crowded`]; the points of
    /// those cells are reordered by sub-cell (into another buffer, which `g.sorted` then names).
    fn sub_grids(
        &mut self,
        g: &mut Binned,
        c: Crowding,
        n: usize,
        d: usize,
        per_cell: f64,
    ) -> Result<()> {
        let Crowding {
            crowd_min: cm32,
            counter,
            crowd_of,
            subs,
        } = c;
        let ncrowd = self.read_u32(counter)? as usize;
        // Sub-cells + 1 per crowded cell: at most 2·ceil(count / per_cell) + 1 each.
        let entries = (2.0 * n as f64 / per_cell) as usize + 3 * ncrowd + 2;
        if ncrowd == 0 || entries > SCAN_MAX {
            return Ok(()); // none crowded, or too many to scan: plain cells (still exact)
        }
        let sizes = self.bufs.get(&self.gpu, Buf::SubSizes, 4 * (ncrowd + 1))?;
        let sub_starts = self.bufs.get(&self.gpu, Buf::SubStarts, 4 * entries)?;
        let sub_cell = self.bufs.get(&self.gpu, Buf::SubCell, 4 * n)?;
        let cursor = self
            .bufs
            .get(&self.gpu, Buf::Cursor, 4 * entries.max(g.cells + 1))?;
        let out = self.bufs.get(&self.gpu, Buf::BaseSubSorted, 16 * n)?;
        self.memset(sizes, 4 * (ncrowd + 1))?;
        self.memset(sub_starts, 4 * entries)?;
        let (nc32, pc32, n64) = (ncrowd as u32, per_cell as f32, n as i64);
        {
            let gpu = &self.gpu;
            // SAFETY: sorted holds n float4, starts cells + 1 u32, subs ncrowd records, sizes
            // ncrowd + 1 u32; the argument lists match the kernels'.
            unsafe {
                let mut l = gpu
                    .stream
                    .launch_builder(gpu.func(&format!("grid_crowd_geom_{d}"))?);
                l.arg(&g.sorted)
                    .arg(&g.starts)
                    .arg(&nc32)
                    .arg(&pc32)
                    .arg(&subs)
                    .arg(&sizes);
                l.launch(launch(ncrowd * 32, 256))
                    .map_err(dev_err("grid sub-grids"))?;
            }
        }
        self.scan(sizes, ncrowd + 1, cursor)?;
        let gpu = &self.gpu;
        // SAFETY: as above; sub_starts and cursor hold `entries` u32 (the scanned sizes sum to
        // at most that), sub_cell n u32, out n float4.
        unsafe {
            let mut l = gpu.stream.launch_builder(gpu.func("grid_crowd_offsets")?);
            l.arg(&sizes).arg(&nc32).arg(&subs);
            l.launch(launch(ncrowd, 256))
                .map_err(dev_err("grid sub-grids"))?;
            let mut l = gpu
                .stream
                .launch_builder(gpu.func(&format!("grid_sub_count_{d}"))?);
            l.arg(&g.sorted)
                .arg(&n64)
                .arg(&g.geom)
                .arg(&g.starts)
                .arg(&cm32)
                .arg(&crowd_of)
                .arg(&subs)
                .arg(&sub_cell)
                .arg(&sub_starts);
            l.launch(launch(n, 256))
                .map_err(dev_err("grid sub-grids"))?;
        }
        self.scan(sub_starts, entries, cursor)?;
        let gpu = &self.gpu;
        // SAFETY: as above.
        unsafe {
            let mut l = gpu.stream.launch_builder(gpu.func("grid_sub_fix")?);
            l.arg(&g.starts).arg(&subs).arg(&sub_starts).arg(&cursor);
            l.launch(LaunchConfig {
                grid_dim: (ncrowd as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
            .map_err(dev_err("grid sub-grids"))?;
            let mut l = gpu.stream.launch_builder(gpu.func("grid_sub_scatter")?);
            l.arg(&g.sorted)
                .arg(&n64)
                .arg(&sub_cell)
                .arg(&cursor)
                .arg(&out);
            l.launch(launch(n, 256))
                .map_err(dev_err("grid sub-grids"))?;
        }
        g.sorted = out;
        g.crowd = Some((cm32, crowd_of, subs, sub_starts));
        Ok(())
    }

    /// One grid call: bins base and queries, runs the ring search, and returns candidates or
    /// writes final rows.
    fn run(
        &mut self,
        req: &CandidateRequest<'_>,
        out: Output<'_>,
    ) -> Result<Option<(Candidates, Vec<f64>)>> {
        let (nq, d, w) = (req.queries.rows(), req.base.dim(), req.width);
        let tag = tag(req.kernel)?;
        self.gpu
            .ctx
            .bind_to_thread()
            .map_err(dev_err("binding the context"))?;
        let prof = Profile::new();
        let per_cell = TARGET_PER_CELL.max(w as f64 / 2.0);
        let b = req.base.as_slice();
        let key = req.base_key.map(|k| (k, b.as_ptr() as usize, b.len(), d));
        let (mut g, crowding) = match self.binned {
            // The same run's base (a later round, or a retry: its wider lists keep the first
            // call's cells, which only changes the speed).
            Some((k, g)) if Some(k) == key => (g, None),
            _ => {
                self.binned = None;
                self.bin_base(b, d, per_cell, &prof)?
            }
        };
        // Queries in cell order too, so that a warp's threads read the same cells.
        let q = req.queries.as_slice();
        let qraw = self.bufs.get(&self.gpu, Buf::QueryRaw, 4 * q.len())?;
        let qstarts = self
            .bufs
            .get(&self.gpu, Buf::QueryStarts, 4 * (g.cells + 1))?;
        let qsorted = self.bufs.get(&self.gpu, Buf::QuerySorted, 16 * nq)?;
        (self.gpu.staging()?).upload_plain(&self.gpu, bytes_of(q), qraw)?;
        self.counting_sort(qraw, nq, d, &g.geom, g.cells, qstarts, qsorted)?;
        let excl = match req.exclude {
            Some(e) => {
                let p = self.bufs.get(&self.gpu, Buf::Exclude, 4 * e.len())?;
                (self.gpu.staging()?).upload_plain(&self.gpu, bytes_of(e), p)?;
                p
            }
            None => 0,
        };
        prof.mark(&self.gpu, "query upload + binning")?;
        if let Some(c) = crowding {
            // Read only now: the host uploaded the queries while the device binned the base.
            self.sub_grids(&mut g, c, b.len() / d, d, per_cell)?;
            self.binned = key.map(|k| (k, g));
            prof.mark(&self.gpu, "sub-grids")?;
        } else if self.binned.is_none() {
            self.binned = key.map(|k| (k, g));
        }
        let finish = match &out {
            Output::Candidates => None,
            Output::Finish { mode, .. } => Some(*mode),
        };
        let ids = self.bufs.get(&self.gpu, Buf::Ids, 4 * nq * w)?;
        let keys = self.bufs.get(&self.gpu, Buf::Keys, 4 * nq * w)?;
        let (exact, floor, proven) = if finish.is_some() {
            (0u64, 0u64, self.bufs.get(&self.gpu, Buf::Proven, nq)?)
        } else {
            (
                self.bufs.get(&self.gpu, Buf::Exact, 8 * nq * w)?,
                self.bufs.get(&self.gpu, Buf::Floor, 4 * nq)?,
                0u64,
            )
        };
        let flags = self.bufs.get(&self.gpu, Buf::Flags, 8)?;
        self.memset(flags, 8)?;
        // One kernel per width class, for any d ≤ 3 (1-D and 2-D points carry zeros).
        let name = if finish.is_some() {
            let kmax = match w {
                1 => 1,
                2..=8 => 8,
                9..=16 => 16,
                17..=GRID_REGISTER_WIDTH => 32,
                _ => 128,
            };
            format!("grid_query_{tag}_k{kmax}")
        } else {
            format!("grid_cand_{tag}")
        };
        let (crowd_min, crowd_of, subs, sub_starts) = g.crowd.unwrap_or((u32::MAX, 0, 0, 0));
        let (nq64, w32, complete) = (nq as i64, w as i32, i32::from(w >= req.available()));
        let mode = finish.unwrap_or(0);
        let bad = flags + 4;
        {
            let gpu = &self.gpu;
            // SAFETY: every pointer is a live buffer of the size the kernel indexes (nq sorted
            // queries, cells + 1 starts, nb sorted points, the sub-grid arrays or null with
            // crowd_min = u32::MAX, nq × w ids and keys, nq × w exact keys and nq floors in
            // candidates mode, nq flags in finish mode, `exclude` null or nq u32), and the
            // argument list matches the kernel's one for one.
            unsafe {
                let mut l = gpu.stream.launch_builder(gpu.func(&name)?);
                l.arg(&qsorted)
                    .arg(&nq64)
                    .arg(&excl)
                    .arg(&g.geom)
                    .arg(&g.starts)
                    .arg(&g.sorted)
                    .arg(&crowd_min)
                    .arg(&crowd_of)
                    .arg(&subs)
                    .arg(&sub_starts)
                    .arg(&w32)
                    .arg(&complete)
                    .arg(&mode)
                    .arg(&ids)
                    .arg(&keys)
                    .arg(&exact)
                    .arg(&floor)
                    .arg(&proven)
                    .arg(&bad);
                l.launch(launch(nq, 128))
                    .map_err(Self::launch_err("grid query"))?;
            }
        }
        prof.mark(&self.gpu, "ring search")?;
        if self.read_u32(bad)? != 0 {
            return Err(KnnError::Device(format!(
                "grid on {}: a candidate list holds an unwritten slot",
                self.gpu.name
            )));
        }
        let st = self.gpu.staging()?;
        let result = match out {
            Output::Finish { rows, .. } => {
                let (host_ids, host_dists) = rows.out.buffers();
                st.download_into(&self.gpu, ids, bytes_of_mut(host_ids))?;
                st.download_into(&self.gpu, keys, bytes_of_mut(host_dists))?;
                let flags_out = rows.proven;
                st.download(&self.gpu, proven, nq, |off, b| {
                    flags_out[off..off + b.len()]
                        .par_chunks_mut(PIECE)
                        .zip(b.par_chunks(PIECE))
                        .for_each(|(o, s)| o.iter_mut().zip(s).for_each(|(o, &s)| *o = s != 0))
                })?;
                None
            }
            Output::Candidates => {
                let mut c = Candidates {
                    width: w,
                    ids: vec![0; nq * w],
                    keys: vec![0.0; nq * w],
                    floor: vec![0.0; nq],
                    // Floors from the cells left out, not the keys' rounding.
                    floor_bounds_rounding: false,
                };
                let mut ex = vec![0f64; nq * w];
                st.download_into(&self.gpu, ids, bytes_of_mut(&mut c.ids))?;
                st.download_into(&self.gpu, keys, bytes_of_mut(&mut c.keys))?;
                st.download_into(&self.gpu, exact, bytes_of_mut(&mut ex))?;
                st.download_into(&self.gpu, floor, bytes_of_mut(&mut c.floor))?;
                Some((c, ex))
            }
        };
        prof.mark(&self.gpu, "download")?;
        prof.total("total");
        Ok(result)
    }
}

impl CudaGridEngine {
    /// `true` when this request runs on the GPU (else on the CPU grid: d > 3, lists wider than
    /// [`GRID_WIDTH_MAX`], or more base points than the kernels index).
    fn on_gpu(req: &CandidateRequest<'_>) -> bool {
        req.base.dim() <= 3
            && req.width <= GRID_WIDTH_MAX
            && req.base.rows() <= u32::MAX as usize / 2
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
        req.check_width()?;
        if req.queries.rows() == 0 {
            return Ok((Candidates::empty(req.width), Some(vec![])));
        }
        if !Self::on_gpu(req) {
            // Wider lists (retries of rare rows, or k > 128) and higher dimensions.
            let fallback = self.fallback.as_deref().ok_or_else(|| {
                KnnError::Option(format!(
                    "{}: lists of {} in d={} are beyond the device's grid and no fallback engine was given",
                    self.name(),
                    req.width,
                    req.base.dim()
                ))
            })?;
            return fallback.candidates_with_exact(req);
        }
        let (c, exact) = self
            .lock()?
            .run(req, Output::Candidates)?
            .expect("candidates asked for");
        // Its exact keys are `req.kernel.exact` of the request's rows: none for derived data.
        Ok((c, req.exact_from.is_none().then_some(exact)))
    }

    /// Final rows straight from the kernel: it computes the exact keys of its k candidates,
    /// applies the pipeline's check against its own floor and writes ids, distances and flags
    /// into the pipeline's output.
    fn finish_rows(&self, req: &CandidateRequest<'_>, out: FinishedRows<'_>) -> Result<bool> {
        let (nq, metric, k) = (req.queries.rows(), out.metric, out.k);
        let Some(mode) = finish_mode(metric) else {
            return Ok(false);
        };
        if metric.kernel() != req.kernel
            || req.width != k
            || req.exact_from.is_some()
            || out.key_scale != 1.0
            || !Self::on_gpu(req)
            || !out.holds(nq)
        {
            return Ok(false);
        }
        req.check_width()?;
        if nq == 0 {
            return Ok(true);
        }
        self.lock()?.run(req, Output::Finish { mode, rows: out })?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
