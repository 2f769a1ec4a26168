//! Searches of queries that already lie in this GPU's memory (a PyTorch or CuPy tensor's),
//! with the results written to its memory: neither the queries nor the results cross the
//! bus. The caller (`knn::Index`) redoes on the host the few rows the device does not prove.

use super::finish::FinishedOnDevice;
use super::{CudaEngine, Method};
use crate::fused::DeviceIo;
use crate::staging::{bytes_of, bytes_of_mut};
use cudarc::driver::{result as driver, CudaContext};
use knn_core::{CandidateRequest, KnnError, Metric, Result, RowSlices};
use std::sync::mpsc::{channel, SendError, Sender};
use std::sync::{Arc, OnceLock};

/// Queries in this GPU's memory: `rows × d` f32 values, row-major and contiguous, at device
/// address `ptr` (memory of the device's primary context, where PyTorch and CuPy allocate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceQueries {
    /// Device address of the first value.
    pub ptr: u64,
    /// Number of queries.
    pub rows: usize,
}

/// Where results go in this GPU's memory: `rows × k` ids at `ids` (u32, or i64 with
/// `ids_i64`) and as many f32 distances at `distances`, row-major.
#[derive(Clone, Copy, Debug)]
pub struct DeviceResults {
    /// Device address of the ids.
    pub ids: u64,
    /// The ids are i64 (the index type of PyTorch, CuPy and NumPy), not u32.
    pub ids_i64: bool,
    /// Device address of the distances.
    pub distances: u64,
}

impl DeviceResults {
    /// Bytes of one id.
    pub fn id_bytes(&self) -> usize {
        if self.ids_i64 {
            8
        } else {
            4
        }
    }
}

/// What [`CudaEngine::search_device`] leaves to the caller.
#[derive(Clone, Debug)]
pub struct DeviceSearch {
    /// One per query: `true` when its row of the results is final; the caller computes the
    /// others again.
    pub proven: Vec<bool>,
    /// An upper bound on the magnitude of every query value, NaN when a value is NaN or
    /// infinite (the rows written are then meaningless): the caller checks that the queries
    /// are valid and leave the base's preparation as it is.
    pub query_top: f32,
}

/// Device memory allocated for a caller, such as results handed to another library (JAX
/// adopts arrays through DLPack but lets no one write into its own): `len()` bytes at
/// [`DeviceMemory::ptr`] in the device's primary context, freed after the drop by a thread of
/// its own (see [`release`]).
#[derive(Debug)]
pub struct DeviceMemory {
    ctx: Arc<CudaContext>,
    ptr: u64,
    len: usize,
}

impl DeviceMemory {
    /// Device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an allocation of no bytes (its address is 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device's ordinal (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.ptr != 0 {
            release(self.ctx.clone(), self.ptr);
        }
    }
}

/// Memory to free: its context and address (from `malloc_sync`, freed once).
type Freed = (Arc<CudaContext>, u64);

/// Frees `ptr` (of `ctx`) on a thread of its own. `cuMemFree` waits until the whole device is
/// idle, which keeps memory that another library read on streams of its own from being reused
/// under it; but the last owner of the memory may be a Python thread holding the GIL, or
/// another library's callback thread, neither of which should wait for the device or have its
/// current context changed. Frees still pending at exit are left to the process's end.
fn release(ctx: Arc<CudaContext>, ptr: u64) {
    static FREES: OnceLock<Option<Sender<Freed>>> = OnceLock::new();
    let frees = FREES.get_or_init(|| {
        let (tx, rx) = channel::<Freed>();
        std::thread::Builder::new()
            .name("knn-free".into())
            .spawn(move || rx.into_iter().for_each(free_now))
            .ok()
            .map(|_| tx)
    });
    // (Freed here when the thread could not start, or has stopped.)
    match frees {
        Some(tx) => {
            if let Err(SendError(item)) = tx.send((ctx, ptr)) {
                free_now(item);
            }
        }
        None => free_now((ctx, ptr)),
    }
}

fn free_now((ctx, ptr): Freed) {
    if ctx.bind_to_thread().is_ok() {
        // SAFETY: `ptr` came from `malloc_sync` in this context and is freed once. A failure
        // (a context already torn down at exit) leaves nothing to do.
        let _ = unsafe { driver::free_sync(ptr) };
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u32 {}
    impl Sealed for i64 {}
}

/// Plain numbers copied between host and device memory: f32 values and distances, u32 or
/// i64 ids.
pub trait Plain: sealed::Sealed + Copy {}
impl Plain for f32 {}
impl Plain for u32 {}
impl Plain for i64 {}

impl CudaEngine {
    /// The device's ordinal (`cuda:N`).
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The rows of `queries` (in this device's memory; `req.queries` empty) finished on the
    /// device for `k` neighbours under `metric` into `out`, as [`knn_core::Engine::finish_rows`]
    /// finishes host rows: row i of the results holds the k best of its candidates by exact
    /// key in (distance, id) order, final where [`DeviceSearch::proven`] says so. `req` is a
    /// first try of the request's base (`precise` false, `exact_from` none) on data searched as
    /// given (`exact_data`). `None`: this engine does not finish such a request on the device
    /// (method, metric, width, or a base that is not resident); nothing was written.
    ///
    /// # Safety
    /// `queries.ptr` must hold `queries.rows × d` f32 values, and `out` room for
    /// `queries.rows × k` ids and distances, in this device's primary context, with no work
    /// pending on them that this engine's stream does not follow (see
    /// [`CudaEngine::follow_stream`]) and no other use until this returns.
    pub unsafe fn search_device(
        &self,
        req: &CandidateRequest<'_>,
        metric: &Metric,
        k: usize,
        key_scale: f64,
        queries: DeviceQueries,
        out: DeviceResults,
    ) -> Result<Option<DeviceSearch>> {
        if self.method != Method::Fused || queries.rows == 0 || req.queries.rows() != 0 {
            return Ok(None);
        }
        let Some(done) = self.finish_into(req, (metric, k, key_scale), Some(queries), out)? else {
            return Ok(None);
        };
        // |q_j| ≤ |q_j − c_j| + |c_j| ≤ ‖q − c‖ + max |c| (the centred row rounded once:
        // the norm bound's margin covers it).
        let c_top = done
            .centre
            .as_deref()
            .map_or(0.0, |c| c.iter().fold(0.0f32, |a, &v| a.max(v.abs())));
        Ok(Some(DeviceSearch {
            proven: done.proven,
            query_top: done.query_top.unwrap_or(f32::NAN) + c_top,
        }))
    }

    /// The whole kNN graph of `req`'s base finished on the device for `k` neighbours under
    /// `metric`, written into `out`: row i of the results holds point i's k nearest other
    /// points by exact key in (distance, id) order, final where the returned verdicts say so
    /// (the caller computes the others again). `req` is the graph's first try, every point's
    /// row (see `knn_core::with_graph_first_try`), of a base this engine keeps resident; the
    /// graph is made anew (each unordered pair once where this engine's [`Symmetry`] says
    /// so). `None`: this engine does not finish such a graph on the device (method, metric,
    /// width, a base that is not resident, a graph shared by several GPUs, inner products
    /// that may overflow f32); nothing was written.
    ///
    /// A row is left unproven when its floor does not prove it, and when its k-th distance is
    /// not finite in f32 (the caller's path then reports the overflow).
    ///
    /// # Safety
    /// `out` must have room for `n × k` ids and distances in this device's primary context,
    /// with no work pending on it that this engine's stream does not follow (see
    /// [`CudaEngine::follow_stream`]) and no other use until this returns.
    ///
    /// [`Symmetry`]: knn_core::Symmetry
    pub unsafe fn graph_device(
        &self,
        req: &CandidateRequest<'_>,
        metric: &Metric,
        k: usize,
        key_scale: f64,
        out: DeviceResults,
    ) -> Result<Option<Vec<bool>>> {
        let n = req.base.rows();
        let whole = n > 0
            && req.queries.rows() == n
            && req.queries.row_offset_in(&req.base) == Some(0)
            && req.exclude.is_some_and(|e| e.len() == n);
        if self.method != Method::Fused || self.share.is_some() || !whole {
            return Ok(None);
        }
        // The device proves the rows with the base's norm bound: measured now if the device
        // was to measure it (rows it derives) and has not yet.
        let mut info = self.base_info(req);
        if info.bn_max.is_nan() {
            let _ = self.device_norms(req, &mut info);
        }
        // Inner products are distances as they are: |q·b| ≤ ‖q‖‖b‖ must stay within f32.
        if matches!(metric, Metric::InnerProduct) {
            let top = info.bn_max as f64;
            let fits = top * top < f32::MAX as f64 / 2.0;
            if !fits {
                return Ok(None);
            }
        }
        self.graph_anew(req)?;
        let done = self.finish_into(req, (metric, k, key_scale), None, out)?;
        Ok(done.map(|d| d.proven))
    }

    /// `req`'s rows finished on the device into `out` (see `finish_on_device`), the queries
    /// read from this device's memory when given (else they are rows of the resident base).
    fn finish_into(
        &self,
        req: &CandidateRequest<'_>,
        (metric, k, key_scale): (&Metric, usize, f64),
        queries: Option<DeviceQueries>,
        out: DeviceResults,
    ) -> Result<Option<FinishedOnDevice>> {
        let io = DeviceIo {
            queries,
            ids: out.ids,
            ids_i64: out.ids_i64,
            dists: out.distances,
        };
        // The rows go to device memory: no host rows.
        let mut no_host = RowSlices {
            ids: &mut [],
            distances: &mut [],
            k,
        };
        self.finish_on_device(req, metric, k, key_scale, &mut no_host, Some(io))
    }

    /// `bytes` of this device's memory, uninitialised, owned by the caller (see
    /// [`DeviceMemory`]).
    pub fn alloc_device(&self, bytes: usize) -> Result<DeviceMemory> {
        let ctx = self.locked()?.ctx.clone();
        let ptr = if bytes == 0 {
            0
        } else {
            // SAFETY: the context is bound to this thread (`locked`).
            unsafe { driver::malloc_sync(bytes) }.map_err(|e| {
                KnnError::Device(format!(
                    "cuda:{}: allocating {bytes} bytes for results: {e}",
                    self.ordinal
                ))
            })?
        };
        Ok(DeviceMemory {
            ctx,
            ptr,
            len: bytes,
        })
    }

    /// Orders this engine's later device work (searches, [`CudaEngine::read_device`],
    /// [`CudaEngine::write_device`]) after the work queued so far on `stream`, a `CUstream` of
    /// this device's primary context (0: its legacy default stream), such as the stream a
    /// tensor's values were written on. The host does not wait.
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this device's primary context.
    pub unsafe fn follow_stream(&self, stream: u64) -> Result<()> {
        let gpu = self.locked()?;
        // SAFETY: as the caller vouches.
        unsafe { gpu.follow_stream(stream) }
    }

    /// Copies `dst.len()` values from device address `src` into `dst`.
    ///
    /// # Safety
    /// `src` must hold `dst.len()` values in this device's primary context.
    pub unsafe fn read_device<T: Plain>(&self, src: u64, dst: &mut [T]) -> Result<()> {
        let gpu = self.locked()?;
        // SAFETY: as the caller vouches; f32 and u32 take any bytes.
        unsafe { gpu.read_at(src, bytes_of_mut(dst)) }
    }

    /// Copies `src` to device address `dst`.
    ///
    /// # Safety
    /// `dst` must have room for `src.len()` values in this device's primary context.
    pub unsafe fn write_device<T: Plain>(&self, src: &[T], dst: u64) -> Result<()> {
        let gpu = self.locked()?;
        // SAFETY: as the caller vouches.
        unsafe { gpu.write_at(bytes_of(src), dst) }
    }
}
