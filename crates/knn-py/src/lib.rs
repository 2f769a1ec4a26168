//! `knn._knn`: the native part of the `knn` Python package (`python/knn`).
//!
//! The Python layer converts inputs to C-contiguous float32 or float64 NumPy arrays (float64
//! for float64 input, which stays exact) and gives them here; this module validates them
//! through the library, computes with the GIL released, checks for Ctrl-C between pieces of
//! work and returns `(distances, ids int64)`, the distances float64 for float64 queries (a
//! graph: for rows given in float64), else float32.

mod base;
mod dlpack;
mod errors;

use base::{Base, Found};
use dlpack::DeviceArray;
use errors::to_py;
use knn::given::{round_to_f32, Given};
use knn::{
    Covariance, Device, DeviceQueries, DeviceResults, Index, KnnError, Matrix, MatrixRef, Metric,
    MetricExpr, Neighbors, Options, Rows, Symmetry,
};
use numpy::{
    Element, IntoPyArray, PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Work (query rows × base rows × dimension) per CPU thread of the first uninterrupted piece
/// of a search (see [`in_pieces`]; later pieces follow its pace): between pieces the bindings
/// check for Ctrl-C. Smaller pieces cost speed: against 10⁶ × 128 base rows (2 cores, AVX2),
/// 67-row pieces (2³³ in all) took 3.93 ms a query, 268-row pieces (2³⁵) 3.14 ms, 1024 rows
/// 2.76 ms.
const CPU_PIECE_WORK: usize = 1 << 34;
/// The same on a GPU, for the whole device: 2³⁸ (2147 rows against 10⁶ × 128) took 7.3 ms of
/// kernels on an H100, and 10⁴ queries then ran as 5 pipeline calls, each with its fixed cost
/// and its own second pass for the rows its first did not prove (57 ms in all). 2⁴³ is about
/// a quarter of a second of kernels.
const GPU_PIECE_WORK: usize = 1 << 43;
/// Fewest query rows in a piece (two of the CPU engine's 128-query tiles).
const MIN_PIECE_ROWS: usize = 256;
/// Seconds a piece of a search aims at after the first (see [`in_pieces`]): Ctrl-C is seen
/// within about that.
const PIECE_SECONDS: f64 = 0.5;
/// How often a graph's caller looks for Ctrl-C while the graph is computed.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// `work`'s result, computed on a thread of its own while this one looks for Ctrl-C every
/// [`SIGNAL_POLL`] (the GIL released meanwhile): `KeyboardInterrupt` returns at once, and the
/// work finishes there, its result dropped.
fn watching_signals<T: Send + 'static>(
    py: Python<'_>,
    work: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("knn-graph".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
    let mut rx = rx;
    loop {
        let (got, back) = py.detach(move || (rx.recv_timeout(SIGNAL_POLL), rx));
        rx = back;
        match got {
            Ok(result) => return Ok(result),
            Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err("the graph's thread stopped"))
            }
        }
    }
}

/// `(distances, ids)`: distances a float32 or float64 array.
type Pair<'py> = (Bound<'py, PyAny>, Bound<'py, PyArray2<i64>>);

/// The native index: a checked, prepared base set, searched from any number of threads.
#[pyclass(module = "knn._knn", frozen)]
struct NativeIndex {
    base: Arc<Base>,
    /// Work of one uninterrupted piece of a search: [`CPU_PIECE_WORK`] per CPU thread, or
    /// [`GPU_PIECE_WORK`] per GPU.
    piece_work: usize,
    /// Several GPUs' ordinals (`device="cuda:0,1"`), reported by `device`.
    gpus: Vec<usize>,
}

/// `device` as the Python API takes it: one device (`auto`, `cpu`, `cuda`, `cuda:N`), or
/// several GPUs (`cuda:all`, `cuda:0,1`, read by [`knn::parse_gpus`]).
fn device_options(device: &str) -> knn::Result<(Device, Vec<usize>)> {
    match device.strip_prefix("cuda:") {
        Some(list) if list.trim() == "all" || list.contains(',') => {
            let gpus = knn::parse_gpus(list)?;
            Ok((Device::Cuda(gpus[0]), gpus))
        }
        _ => match device.parse() {
            Ok(d) => Ok((d, Vec::new())),
            Err(_) => Err(knn::KnnError::Option(format!(
                "unknown device '{device}' (auto, cpu, cuda, cuda:N, or several GPUs: cuda:0,1, cuda:all)"
            ))),
        },
    }
}

#[pymethods]
impl NativeIndex {
    #[new]
    /// `symmetric`: how the index's graphs compute pairs (`graph` with another setting builds
    /// a second index for that call); a one-off graph passes its own.
    #[pyo3(signature = (data, metric="l2", device="auto", metric_expr=None, covariance=None, gpu_memory=None, threads=None, symmetric="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        data: Bound<'_, PyAny>,
        metric: &str,
        device: &str,
        metric_expr: Option<&str>,
        covariance: Option<PyReadonlyArray2<'_, f32>>,
        gpu_memory: Option<usize>,
        threads: Option<usize>,
        symmetric: &str,
    ) -> PyResult<Self> {
        let symmetric: Symmetry = symmetric.parse().map_err(to_py)?;
        let metric = parse_metric(metric, metric_expr, covariance)?;
        let (device, gpus) = device_options(device).map_err(to_py)?;
        if threads == Some(0) {
            return Err(PyValueError::new_err(
                "threads must be at least 1 (None: every core)",
            ));
        }
        let opts = Options {
            device,
            threads,
            gpu_memory,
            gpus: gpus.clone(),
            symmetric,
            ..Options::default()
        };
        let (rows, dim) = shared_rows(data)?;
        let base = py
            .detach(move || Base::new(rows, dim, metric, opts))
            .map_err(to_py)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let piece_work = match base.device() {
            Device::Cuda(_) => GPU_PIECE_WORK.saturating_mul(gpus.len().max(1)),
            _ => CPU_PIECE_WORK.saturating_mul(threads.unwrap_or(cores).max(2)),
        };
        Ok(Self {
            base: Arc::new(base),
            piece_work,
            gpus,
        })
    }

    /// k nearest base points of each query row: (distances, ids), the distances float64 for
    /// float64 queries (exact for their values), float32 for float32 ones.
    fn search<'py>(
        &self,
        py: Python<'py>,
        queries: Bound<'py, PyAny>,
        k: usize,
    ) -> PyResult<Pair<'py>> {
        let index = self.base.snapshot();
        let queries = Values::extract(&queries, "queries")?;
        let dim = queries.dim();
        Ok(match queries.given()? {
            Given::F32(values) => {
                // Checked once; a piece that is the whole keeps what the check saw.
                let checked = py
                    .detach(|| MatrixRef::new("queries", values, dim))
                    .map_err(to_py)?;
                let all = checked.rows();
                let nn = in_pieces(py, &index, self.piece_work, (all, dim, k), |start, end| {
                    index.search(checked.slice_rows(start, end), k)
                })?;
                to_numpy(py, nn)
            }
            Given::F64(values) => {
                // The values are checked here, so that errors name rows of the whole set.
                let all = py
                    .detach(|| round_to_f32("queries", values, dim).map(|r| r.len() / dim))
                    .map_err(to_py)?;
                if dim != index.dim() {
                    return Err(to_py(KnnError::DimMismatch {
                        base: index.dim(),
                        queries: dim,
                    }));
                }
                let nn = in_pieces(py, &index, self.piece_work, (all, dim, k), |start, end| {
                    index.search_f64(&values[start * dim..end * dim], k, &|_, _| {})
                })?;
                to_numpy(py, nn)
            }
        })
    }

    /// The exact float64 keys a search chooses neighbours by (`knn::Index::exact_keys`): entry
    /// `[i, j]` is the key of query row `i` and base row `ids[i, j]` (int64, as a search
    /// returns them). Partial answers of several indexes merged by (key, id) equal one index
    /// over all their rows; `knn.dask` merges so.
    fn exact_keys<'py>(
        &self,
        py: Python<'py>,
        queries: Bound<'py, PyAny>,
        ids: PyReadonlyArray2<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let index = self.base.snapshot();
        let queries = Values::extract(&queries, "queries")?;
        if queries.dim() != index.dim() {
            return Err(to_py(KnnError::DimMismatch {
                base: index.dim(),
                queries: queries.dim(),
            }));
        }
        let (rows, k) = (ids.shape()[0], ids.shape()[1]);
        let ids: Vec<u32> = (ids.as_array().iter())
            .map(|&i| {
                u32::try_from(i)
                    .ok()
                    .filter(|&i| (i as usize) < index.len())
            })
            .collect::<Option<_>>()
            .ok_or_else(|| {
                let last = index.len().saturating_sub(1);
                PyValueError::new_err(format!(
                    "ids: not every id is a row of the index (0 to {last})"
                ))
            })?;
        let given = queries.given()?;
        let keys = py
            .detach(|| index.exact_keys(given, &ids, k))
            .map_err(to_py)?;
        keys.into_pyarray(py).reshape([rows, k])
    }

    /// The errors a search of queries of dimension `dim` for `k` neighbours gives before it
    /// reads a value (dimension, k), raised as they would be.
    fn check_search(&self, dim: usize, k: usize) -> PyResult<()> {
        self.base.snapshot().check_search(dim, k).map_err(to_py)
    }

    /// Queries in GPU memory searched there (`knn::Index::search_device`): `rows × dim`
    /// float32 values at device address `queries` on GPU `device`, written on CUDA stream
    /// `stream` (0: the legacy default stream); the results go to `rows × k` ids at `ids`
    /// (int64, or int32 with `ids_i64` false) and float32 distances at `distances`. In pieces between Ctrl-C checks, with the
    /// GIL released. The Python side (`knn._arrays.CudaRows`) vouches for the addresses: live
    /// C-contiguous tensors of those shapes and types on that device.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (queries, rows, device, stream, k, ids, distances, ids_i64=true))]
    fn search_device(
        &self,
        py: Python<'_>,
        queries: u64,
        rows: usize,
        device: usize,
        stream: u64,
        k: usize,
        ids: u64,
        distances: u64,
        ids_i64: bool,
    ) -> PyResult<()> {
        let index = self.base.snapshot();
        let dim = index.dim();
        let per_row = index.len().saturating_mul(dim.max(1)).max(1);
        let piece = (GPU_PIECE_WORK / per_row).max(MIN_PIECE_ROWS);
        let mut start = 0;
        loop {
            let end = (start + piece).min(rows);
            let part = DeviceQueries {
                ptr: queries + (start * dim * 4) as u64,
                rows: end - start,
                device,
                stream,
            };
            let at = (start * k) as u64;
            let out = DeviceResults {
                ids: ids + at * if ids_i64 { 8 } else { 4 },
                ids_i64,
                distances: distances + at * 4,
            };
            // SAFETY: the addresses are of live tensors of these shapes on `device` (above).
            py.detach(|| unsafe { index.search_device(part, k, out) })
                .map_err(|e| to_py(errors::shift_rows(e, start)))?;
            if end >= rows {
                return Ok(());
            }
            py.check_signals()?;
            start = end;
        }
    }

    /// Uninitialised results of `rows × k` neighbours in GPU `device`'s memory, `(distances,
    /// ids)`: float32 distances and int64 ids (int32 without `ids_i64`), in one allocation, for
    /// `search_device` where the caller's library makes no writable arrays (JAX): handed over
    /// with `__dlpack__`.
    fn device_results(
        &self,
        py: Python<'_>,
        device: usize,
        rows: usize,
        k: usize,
        ids_i64: bool,
    ) -> PyResult<(DeviceArray, DeviceArray)> {
        let bytes = DeviceArray::pair_bytes(rows, k, ids_i64)
            .ok_or_else(|| PyValueError::new_err(format!("{rows} x {k} results: too many")))?;
        let index = self.base.snapshot();
        // (The GIL released: the allocation waits for the device's lock, which another
        // thread's search may hold.)
        let memory = py
            .detach(|| index.alloc_device(device, bytes))
            .map_err(to_py)?;
        Ok(DeviceArray::pair(memory, rows, k, ids_i64))
    }

    /// The kNN graph of the base (each point's k nearest other points): (distances, ids).
    #[pyo3(signature = (k, symmetric="auto"))]
    fn graph<'py>(&self, py: Python<'py>, k: usize, symmetric: &str) -> PyResult<Pair<'py>> {
        let symmetric: Symmetry = symmetric.parse().map_err(to_py)?;
        let base = self.base.clone();
        let index = base.snapshot();
        let found = watching_signals(py, move || base.graph(&index, k, symmetric))?;
        Ok(match found.map_err(to_py)? {
            Found::F32(nn) => to_numpy(py, nn),
            Found::F64(nn) => to_numpy(py, nn),
        })
    }

    /// The kNN graph of the base written to GPU `device`'s memory: `len × k` ids (int64, or
    /// int32 without `ids_i64`) at `ids` and float32 distances at `distances`, after the work
    /// queued on `stream` (a `CUstream`, 0: the legacy default stream). The caller checks that
    /// the rows are float32 and passes C-contiguous arrays of those shapes and types on that
    /// device, and `keep`, the objects that own them: a large graph (more than about a
    /// quarter of a second of kernels) runs on a thread of its own that holds `keep` until it
    /// is written, so that Ctrl-C returns at once without the memory being freed under it.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (k, symmetric, device, stream, ids, distances, ids_i64=true, keep=None))]
    fn graph_device(
        &self,
        py: Python<'_>,
        k: usize,
        symmetric: &str,
        device: usize,
        stream: u64,
        ids: u64,
        distances: u64,
        ids_i64: bool,
        keep: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let symmetric: Symmetry = symmetric.parse().map_err(to_py)?;
        let base = self.base.clone();
        let index = base.snapshot();
        let out = DeviceResults {
            ids,
            ids_i64,
            distances,
        };
        let work = index
            .len()
            .saturating_mul(index.len())
            .saturating_mul(index.dim().max(1));
        // SAFETY (both): the addresses are of live arrays of these shapes on `device`, owned
        // by `keep` where the work outlives this call.
        let write =
            move || unsafe { base.graph_device(&index, (k, symmetric), (device, stream), out) };
        match keep {
            Some(keep) if work > GPU_PIECE_WORK => {
                watching_signals(py, move || {
                    let written = write();
                    drop(keep);
                    written
                })?
                .map_err(to_py)?;
            }
            _ => py.detach(write).map_err(to_py)?,
        }
        py.check_signals()
    }

    /// Appends rows (float32 or float64, kept as given); their ids continue from len(index).
    fn add(&self, py: Python<'_>, data: Bound<'_, PyAny>) -> PyResult<()> {
        let data = Values::extract(&data, "added rows")?;
        let dim = data.dim();
        let rows = data.given()?;
        py.detach(|| self.base.add(rows, dim)).map_err(to_py)
    }

    fn __len__(&self) -> usize {
        self.base.snapshot().len()
    }

    /// Dimension of the points.
    #[getter]
    fn dim(&self) -> usize {
        self.base.snapshot().dim()
    }

    /// The metric's name (`l2`, `cosine`, ..., `expr`).
    #[getter]
    fn metric(&self) -> String {
        self.base.snapshot().metric().name().to_string()
    }

    /// The device in use (`cpu`, `cuda:0`, ...; `cuda:0,1` for several GPUs).
    #[getter]
    fn device(&self) -> String {
        if self.gpus.len() > 1 {
            let list: Vec<String> = self.gpus.iter().map(usize::to_string).collect();
            return format!("cuda:{}", list.join(","));
        }
        self.base.device().to_string()
    }

    /// Bytes of the rows as given (`len × dim` values of 4 or 8 bytes): what pickling the
    /// index sends.
    #[getter]
    fn nbytes(&self) -> usize {
        let index = self.base.snapshot();
        index.len()
            * index.dim()
            * match index.rows().given() {
                Given::F32(_) => 4,
                Given::F64(_) => 8,
            }
    }

    /// Whether the rows are kept in float64 (given so, or added so).
    #[getter]
    fn float64(&self) -> bool {
        self.base.snapshot().rows().as_f32().is_none()
    }

    /// Whether the index uses the given array's memory in place (no copy of it).
    #[getter]
    fn shares_rows(&self) -> bool {
        matches!(
            self.base.snapshot().rows(),
            Rows::Shared(_) | Rows::SharedF64(_)
        )
    }

    /// A copy of the base rows, `len × dim`, in the precision they were given in (for
    /// pickling).
    fn rows<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let index = self.base.snapshot();
        let (n, d) = (index.len(), index.dim());
        Ok(match index.rows().given() {
            Given::F32(v) => v.to_vec().into_pyarray(py).reshape([n, d])?.into_any(),
            Given::F64(v) => v.to_vec().into_pyarray(py).reshape([n, d])?.into_any(),
        })
    }
}

/// Runs a search of `all` query rows of dimension `dim` (`k` neighbours each) through
/// `run(start, end)` in pieces, with the GIL released, looking for Ctrl-C between them: the
/// first of about `budget` work (query rows × base rows × dimension), each later one as many
/// rows as the last one's pace fits in [`PIECE_SECONDS`] (at most 4 times as many). A piece
/// reads the whole base, so fewer, larger pieces go faster: against 10⁶ × 128 rows on 2 cores
/// with AMX, 268-row pieces took 1.14 ms a query, one piece of 10⁴ rows 0.38 ms.
fn in_pieces<D: Send>(
    py: Python<'_>,
    index: &Index,
    budget: usize,
    (all, dim, k): (usize, usize, usize),
    run: impl Fn(usize, usize) -> knn::Result<Neighbors<D>> + Sync,
) -> PyResult<Neighbors<D>> {
    let per_row = index.len().saturating_mul(dim.max(1)).max(1);
    let piece = (budget / per_row).max(MIN_PIECE_ROWS);
    if all <= piece {
        return py.detach(|| run(0, all)).map_err(to_py);
    }
    // (Reserved after the first piece, whose success bounds k by the base's size.)
    let mut out = Neighbors {
        k,
        ids: Vec::new(),
        distances: Vec::new(),
    };
    let (mut start, mut piece) = (0, piece);
    while start < all {
        let end = (start + piece).min(all);
        let began = Instant::now();
        let nn = py
            .detach(|| run(start, end))
            .map_err(|e| to_py(errors::shift_rows(e, start)))?;
        if start == 0 {
            out.ids.reserve_exact(all * k);
            out.distances.reserve_exact(all * k);
        }
        out.ids.extend_from_slice(&nn.ids);
        out.distances.extend(nn.distances);
        py.check_signals()?;
        let pace = (end - start) as f64 / began.elapsed().as_secs_f64().max(1e-6);
        piece = ((pace * PIECE_SECONDS) as usize).clamp(MIN_PIECE_ROWS, 4 * piece);
        start = end;
    }
    Ok(out)
}

/// Rows of a 2-D NumPy array in the precision the caller gave: float32 or float64.
enum Values<'py> {
    F32(PyReadonlyArray2<'py, f32>),
    F64(PyReadonlyArray2<'py, f64>),
}

impl<'py> Values<'py> {
    /// `obj` as rows; `what` names it in the error for another type.
    fn extract(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        if let Ok(a) = obj.extract::<PyReadonlyArray2<'py, f64>>() {
            return Ok(Values::F64(a));
        }
        obj.extract::<PyReadonlyArray2<'py, f32>>()
            .map(Values::F32)
            .map_err(|_| {
                PyValueError::new_err(format!(
                    "{what}: expected a 2-D float32 or float64 NumPy array"
                ))
            })
    }

    /// Values per row.
    fn dim(&self) -> usize {
        match self {
            Values::F32(a) => a.shape()[1],
            Values::F64(a) => a.shape()[1],
        }
    }

    /// The values, row after row (the array must be aligned and C-contiguous).
    fn given(&self) -> PyResult<Given<'_>> {
        Ok(match self {
            Values::F32(a) => Given::F32(contiguous(a)?),
            Values::F64(a) => Given::F64(contiguous(a)?),
        })
    }
}

/// The rows of a float32 or float64 array, used in place, and their dimension.
fn shared_rows(data: Bound<'_, PyAny>) -> PyResult<(Rows, usize)> {
    let data = match data.cast_into::<PyArray2<f64>>() {
        Ok(a) => {
            let dim = a.shape()[1];
            return Ok((
                ArrayRows::share(a)?.map_or(Rows::OwnedF64(Vec::new()), |r| Rows::SharedF64(r)),
                dim,
            ));
        }
        Err(e) => e.into_inner(),
    };
    let a = data.cast_into::<PyArray2<f32>>().map_err(|_| {
        PyValueError::new_err("base: expected a 2-D float32 or float64 NumPy array")
    })?;
    let dim = a.shape()[1];
    Ok((
        ArrayRows::share(a)?.map_or(Rows::Owned(Vec::new()), |r| Rows::Shared(r)),
        dim,
    ))
}

/// A C-contiguous float32 or float64 NumPy array used in place as an index's rows.
struct ArrayRows<T: Element> {
    /// Keeps the array, and so its buffer, alive (it cannot be resized while referenced).
    _array: Py<PyArray2<T>>,
    data: *const T,
    len: usize,
}

// SAFETY: the rows are only read, through `data`, while `_array` holds a strong reference to
// the array that owns them (NumPy neither frees nor moves the buffer of a referenced array);
// `Py` itself may be sent and shared between threads, and `T` is f32 or f64.
unsafe impl<T: Element> Send for ArrayRows<T> {}
unsafe impl<T: Element> Sync for ArrayRows<T> {}

impl<T: Element> AsRef<[T]> for ArrayRows<T> {
    fn as_ref(&self) -> &[T] {
        // SAFETY: `data` points at `len` initialised values kept alive by `_array`.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
}

impl<T: Element> ArrayRows<T> {
    /// The rows of `array` in place; `None` for an empty array (whose pointer may dangle).
    fn share(array: Bound<'_, PyArray2<T>>) -> PyResult<Option<Arc<Self>>> {
        let data = array.data() as *const T;
        if !array.is_c_contiguous() || !data.is_aligned() {
            return Err(PyValueError::new_err(
                "expected an aligned C-contiguous float32 or float64 array",
            ));
        }
        let len = array.len();
        if len == 0 {
            return Ok(None);
        }
        Ok(Some(Arc::new(ArrayRows {
            _array: array.unbind(),
            data,
            len,
        })))
    }
}

/// The metric from its name, or from an expression, with a covariance for Mahalanobis.
fn parse_metric(
    name: &str,
    expr: Option<&str>,
    covariance: Option<PyReadonlyArray2<'_, f32>>,
) -> PyResult<Metric> {
    if let Some(text) = expr {
        if covariance.is_some() {
            return Err(PyValueError::new_err(
                "covariance is only for metric='mahalanobis', not metric_expr",
            ));
        }
        let e = MetricExpr::parse(text)
            .map_err(|e| PyValueError::new_err(format!("metric_expr: {e}")))?;
        return Ok(Metric::Expr(Arc::new(e)));
    }
    let metric: Metric = name.parse().map_err(to_py)?;
    match (&metric, covariance) {
        (Metric::Mahalanobis(_), Some(c)) => {
            let d = c.shape()[1];
            let values = contiguous(&c)?.to_vec();
            let c = Matrix::new("covariance", values, d).map_err(to_py)?;
            Ok(Metric::Mahalanobis(Covariance::Given(Arc::new(c))))
        }
        (_, Some(_)) => Err(PyValueError::new_err(
            "covariance is only for metric='mahalanobis'",
        )),
        (_, None) => Ok(metric),
    }
}

/// The values of a C-contiguous array (the Python layer makes every input so).
fn contiguous<'a, T: Element>(a: &'a PyReadonlyArray2<'_, T>) -> PyResult<&'a [T]> {
    let bad = || PyValueError::new_err("expected an aligned C-contiguous float32 or float64 array");
    let values = a.as_slice().map_err(|_| bad())?;
    if values.is_empty() || values.as_ptr().is_aligned() {
        Ok(values)
    } else {
        Err(bad())
    }
}

/// `(distances, ids int64)`, each `rows × k`, the distances in their own precision (float32
/// or float64); the distances are moved, not copied.
fn to_numpy<D: Element>(py: Python<'_>, nn: Neighbors<D>) -> Pair<'_> {
    let (rows, k) = (nn.rows(), nn.k);
    let ids: Vec<i64> = nn.ids.iter().map(|&i| i64::from(i)).collect();
    let distances = nn.distances.into_pyarray(py);
    let ids = ids.into_pyarray(py);
    (
        distances
            .reshape([rows, k])
            .expect("rows·k values")
            .into_any(),
        ids.reshape([rows, k]).expect("rows·k values"),
    )
}

/// The 2-D array in a DLPack capsule (`x.__dlpack__()`): its address, rows, cols, device
/// and dtype. The address is valid while the capsule lives.
#[pyfunction]
fn dlpack_rows(capsule: Bound<'_, PyAny>) -> PyResult<dlpack::CapsuleRows> {
    dlpack::read_capsule(&capsule, "queries")
}

/// `knn.dask`'s merge of partial answers over disjoint parts of a base
/// (`knn::merge_answers`): per part `(distances, ids, keys)`, each `rows × width` (widths may
/// differ), distances all float32 or all float64, ids int64 (global), keys float64
/// (`Index.exact_keys`); returns the merged `(distances, ids, keys)`, `rows × min(k, Σ widths)`.
#[pyfunction]
fn merge_partials<'py>(
    py: Python<'py>,
    k: usize,
    parts: Vec<Partial<'py>>,
) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    if parts
        .first()
        .is_some_and(|p| p.0.cast::<PyArray2<f64>>().is_ok())
    {
        merged::<f64>(py, k, &parts)
    } else {
        merged::<f32>(py, k, &parts)
    }
}

/// One part's `(distances, ids, keys)` as [`merge_partials`] takes them.
type Partial<'py> = (
    Bound<'py, PyAny>,
    PyReadonlyArray2<'py, i64>,
    PyReadonlyArray2<'py, f64>,
);

/// [`merge_partials`] with distances of type `D`.
fn merged<'py, D: Element + Copy + PartialEq + Send + Sync + Default>(
    py: Python<'py>,
    k: usize,
    parts: &[Partial<'py>],
) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    // Row-major copies only of what is not (a block's first columns of a wider partial).
    fn flat<'a, T: Element + Copy>(a: &'a PyReadonlyArray2<'_, T>) -> std::borrow::Cow<'a, [T]> {
        match a.as_slice() {
            Ok(s) => s.into(),
            Err(_) => a.as_array().iter().copied().collect::<Vec<_>>().into(),
        }
    }
    let rows = parts.first().map_or(0, |p| p.1.shape()[0]);
    let mut distances = Vec::with_capacity(parts.len());
    for (p, (d, i, key)) in parts.iter().enumerate() {
        let d = d.cast::<PyArray2<D>>().map_err(|_| {
            PyValueError::new_err(format!(
                "partial answer {p}: distances must be a 2-D {} array, as the first part's",
                numpy::dtype::<D>(py)
            ))
        })?;
        let d = d.readonly();
        if d.shape() != i.shape() || d.shape() != key.shape() || d.shape()[0] != rows {
            return Err(PyValueError::new_err(format!(
                "partial answer {p}: distances {:?}, ids {:?} and keys {:?} must share one \
                 shape of {rows} rows",
                d.shape(),
                i.shape(),
                key.shape()
            )));
        }
        distances.push(d);
    }
    let held: Vec<_> = (distances.iter().zip(parts))
        .map(|(d, (_, i, key))| (d.shape()[1], flat(d), flat(i), flat(key)))
        .collect();
    let answers: Vec<_> = (held.iter())
        .map(|(width, d, i, key)| knn::PartAnswer {
            width: *width,
            distances: d,
            ids: i,
            keys: key,
        })
        .collect();
    let m = py
        .detach(|| knn::merge_answers(&answers, rows, k))
        .map_err(to_py)?;
    let shape = [rows, m.k];
    let d = m.distances.into_pyarray(py).reshape(shape)?;
    let i = m.ids.into_pyarray(py).reshape(shape)?;
    let key = m.keys.into_pyarray(py).reshape(shape)?;
    pyo3::types::PyTuple::new(py, [d.into_any(), i.into_any(), key.into_any()])
}

/// Usable CUDA devices: a list of (ordinal, description).
#[pyfunction]
fn devices() -> Vec<(usize, String)> {
    knn::gpu_devices()
}

/// Why no GPU is usable, or "ok".
#[pyfunction]
fn gpu_status() -> String {
    knn::gpu_status()
}

#[pymodule]
fn _knn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeIndex>()?;
    m.add_class::<DeviceArray>()?;
    m.add_function(wrap_pyfunction!(dlpack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_status, m)?)?;
    m.add_function(wrap_pyfunction!(merge_partials, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
