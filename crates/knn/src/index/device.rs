//! [`Index::search_device`]: queries that already lie in a GPU's memory (a PyTorch or CuPy
//! tensor's), results written to its memory.

use super::Index;
use knn_core::{validate, CandidateRequest, Engine, KnnError, MatrixRef, Neighbors, Result};
use knn_cuda::{CudaEngine, DeviceSearch};
pub use knn_cuda::{DeviceMemory, DeviceResults};

/// Queries in a GPU's memory, for [`Index::search_device`].
#[derive(Clone, Copy, Debug)]
pub struct DeviceQueries {
    /// Device address of the first of `rows × dim` f32 values, row-major and contiguous, in
    /// the device's primary context (where PyTorch and CuPy allocate).
    pub ptr: u64,
    /// Number of queries.
    pub rows: usize,
    /// The GPU whose memory holds them (`cuda:N`).
    pub device: usize,
    /// The CUDA stream their values were written on (a `CUstream`; 0: the legacy default
    /// stream): the search's device work follows the work queued on it (the host does not
    /// wait for it).
    pub stream: u64,
}

impl Index {
    /// [`Index::search`] of queries in GPU memory, the results written to GPU memory: row i of
    /// `out` gets query i's k nearest base points, `k` ids (u32, or i64 with `out.ids_i64`) and `k` f32 distances, ordered
    /// by (distance, id), exactly what [`Index::search`] gives for the same values. Returns
    /// once the results are written (on the host's clock: every copy and kernel is done).
    ///
    /// On the index's own GPU with float32 rows and a metric that searches queries as given
    /// (squared L2, L2, inner product, L1, L∞ on data that needs no scaling), the queries are
    /// read and the results written where they lie: only a few numbers per query cross the
    /// bus, and the rows whose floor does not prove them (rare) are computed again on the
    /// host's path. Other cases (cosine, Hellinger, Mahalanobis, expressions, float64 rows,
    /// the grid's low dimensions) copy the queries to the host, search them there and copy
    /// the results back: the same answer, with the copies' time.
    ///
    /// Errors as [`Index::search`] (a NaN in the queries, k too large, ...), and when the index
    /// does not compute on that one GPU (a CPU index, several GPUs, another GPU): copy the
    /// queries to the host and call [`Index::search`].
    ///
    /// # Safety
    /// `queries.ptr` must hold `queries.rows × dim` f32 values and `out` room for
    /// `queries.rows × k` ids and as many distances, all in `queries.device`'s memory, valid
    /// and not written by anything else until this returns; `queries.stream` must be 0 or a
    /// live stream of that device's primary context.
    pub unsafe fn search_device(
        &self,
        queries: DeviceQueries,
        k: usize,
        out: DeviceResults,
    ) -> Result<()> {
        let cuda = self.cuda_on(
            queries.device,
            "the queries lie",
            ": copy them to the host and search them there",
        )?;
        self.check_search(self.dim, k)?;
        if queries.rows == 0 {
            return Ok(());
        }
        // SAFETY (here and below): as the caller vouches.
        unsafe { cuda.follow_stream(queries.stream)? };
        match unsafe { self.finish_on_device(cuda, queries, k, out) } {
            Ok(Some(done)) if self.prepared.searches_queries_as_given(done.query_top) => {
                let redo: Vec<usize> = (0..queries.rows).filter(|&i| !done.proven[i]).collect();
                unsafe { self.search_rows_on_host(cuda, queries, &redo, k, out) }
            }
            // Not for this case, or queries the host must check (values not finite) or
            // prepare (scaled): the host's path, which also gives its errors.
            Ok(_) => {
                let all: Vec<usize> = (0..queries.rows).collect();
                unsafe { self.search_rows_on_host(cuda, queries, &all, k, out) }
            }
            // The device's error, unless the host finds the queries at fault.
            Err(e) => {
                let mut host = vec![0.0f32; queries.rows * self.dim];
                unsafe { cuda.read_device(queries.ptr, &mut host)? };
                MatrixRef::new("queries", &host, self.dim)?;
                Err(e)
            }
        }
    }

    /// `bytes` of GPU `device`'s memory (its primary context), uninitialised, freed when
    /// the [`DeviceMemory`] drops: room for [`Index::search_device`]'s results where the
    /// caller's library does not make writable arrays (JAX, which adopts this memory through
    /// DLPack). Errors when the index does not compute on that one GPU.
    pub fn alloc_device(&self, device: usize, bytes: usize) -> Result<DeviceMemory> {
        self.cuda_on(device, "results", "")?.alloc_device(bytes)
    }

    /// [`Index::graph`] with its results written to GPU memory: row i of `out` gets point
    /// i's k nearest other points (its own id left out), `k` ids (u32, or i64 with
    /// `out.ids_i64`) and `k` f32 distances, ordered by (distance, id), exactly what
    /// [`Index::graph`] gives. The device work follows the work queued on `stream` (a
    /// `CUstream` of GPU `device`'s primary context; 0: its legacy default stream), such as
    /// the stream the caller's results were made on. Returns once the results are written.
    ///
    /// On the index's own GPU with float32 rows and a metric it finishes there (squared L2,
    /// L2, inner product, L1, L∞, Hellinger; not on the grid's low dimensions), the
    /// graph is computed from the resident base, written where the results lie and proven
    /// there: only a summary crosses the bus, and the rows the floors do not prove (rare) are
    /// computed again on the host's path. Other cases compute the graph on the host's path
    /// and copy it there: the same answer, with the copy's time.
    ///
    /// Errors as [`Index::graph`] (k = 0 or k ≥ [`Index::len`], an overflow), and when the
    /// index does not compute on that one GPU.
    ///
    /// # Safety
    /// `out` must have room for `len × k` ids and as many distances in GPU `device`'s memory,
    /// valid and not written by anything else until this returns; `stream` must be 0 or a
    /// live stream of that device's primary context.
    pub unsafe fn graph_device(
        &self,
        k: usize,
        device: usize,
        stream: u64,
        out: DeviceResults,
    ) -> Result<()> {
        let cuda = self.cuda_on(device, "the results lie", "")?;
        let n = self.len();
        validate(&self.metric, self.base(), None, k)?;
        // SAFETY (here and below): as the caller vouches.
        unsafe { cuda.follow_stream(stream)? };
        let base = self.base();
        let brute = std::ptr::addr_eq(
            self.knn.engine_for(base.rows(), self.dim, &self.metric)?,
            self.knn.engine(),
        );
        let done = match brute && self.rounded.is_none() {
            true => knn_core::with_graph_first_try(
                self.knn.engine(),
                &self.prepared,
                base,
                k,
                &self.metric,
                |req, key_scale| unsafe { cuda.graph_device(req, &self.metric, k, key_scale, out) },
            )?
            .transpose()?
            .flatten(),
            false => None,
        };
        let proven = done.unwrap_or_else(|| vec![false; n]);
        for rows in redo_runs(&proven) {
            let found = self.graph_rows(rows.clone(), k, &|_, _| {})?;
            unsafe { write_rows(cuda, &found, rows.start, out)? };
        }
        Ok(())
    }

    /// The index's engine on GPU `device`, or an error saying that `what` (lie) in that
    /// GPU's memory while the index computes elsewhere, then `hint`.
    fn cuda_on(&self, device: usize, what: &str, hint: &str) -> Result<&CudaEngine> {
        self.knn
            .cuda()
            .filter(|c| c.ordinal() == device)
            .ok_or_else(|| {
                KnnError::Option(format!(
                    "{what} in the memory of cuda:{device}, but the index computes on {}{hint}",
                    self.engine_name()
                        .unwrap_or_else(|_| self.device().to_string())
                ))
            })
    }

    /// The errors [`Index::search`] gives for queries of dimension `dim` and this `k` before
    /// it reads a value (a dimension that is not the index's, k = 0 or k > [`Index::len`]),
    /// for callers that hand over values later or elsewhere (GPU memory).
    pub fn check_search(&self, dim: usize, k: usize) -> Result<()> {
        let none = MatrixRef::new_unchecked_values("queries", &[], dim)?;
        validate(&self.metric, self.base(), Some(none), k).map(|_| ())
    }

    /// The first try of a search of `queries` finished on the device, when the index and its
    /// engine allow it (see [`Index::search_device`]).
    unsafe fn finish_on_device(
        &self,
        cuda: &CudaEngine,
        queries: DeviceQueries,
        k: usize,
        out: DeviceResults,
    ) -> Result<Option<DeviceSearch>> {
        let base = self.base();
        let brute = std::ptr::addr_eq(
            self.knn.engine_for(base.rows(), self.dim, &self.metric)?,
            self.knn.engine(),
        );
        // Float32 rows searched as given (a bound of 0 asks only about the base's side).
        if !brute || self.rounded.is_some() || !self.prepared.searches_queries_as_given(0.0) {
            return Ok(None);
        }
        let (kernel, available) = (self.metric.kernel(), base.rows());
        let width = cuda
            .candidate_width(k, available, kernel)
            .clamp(k, available);
        let req = CandidateRequest {
            base,
            queries: MatrixRef::new_unchecked_values("queries", &[], self.dim)?,
            kernel,
            width,
            exclude: None,
            precise: false,
            base_key: Some(self.prepared.key),
            exact_data: true,
            exact_from: None,
        };
        let rows = knn_cuda::DeviceQueries {
            ptr: queries.ptr,
            rows: queries.rows,
        };
        // SAFETY: as the caller of `search_device` vouches; the engine's stream follows the
        // queries' (see `search_device`).
        unsafe { cuda.search_device(&req, &self.metric, k, 1.0, rows, out) }
    }

    /// Rows `rows` of the queries searched on the host's path (copied to the host in one
    /// piece, or row by row when few), their results copied into their rows of `out`.
    unsafe fn search_rows_on_host(
        &self,
        cuda: &CudaEngine,
        queries: DeviceQueries,
        rows: &[usize],
        k: usize,
        out: DeviceResults,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let d = self.dim;
        let mut host = vec![0.0f32; rows.len() * d];
        // SAFETY (here and below): each row lies in the caller's buffers.
        if rows.len() == queries.rows {
            unsafe { cuda.read_device(queries.ptr, &mut host)? };
        } else {
            for (i, &r) in rows.iter().enumerate() {
                let at = queries.ptr + (r * d * 4) as u64;
                unsafe { cuda.read_device(at, &mut host[i * d..(i + 1) * d])? };
            }
        }
        let found = MatrixRef::new("queries", &host, d)
            .and_then(|q| self.search(q, k))
            .map_err(|e| e.renumber_query_rows(|i| rows[i]))?;
        // SAFETY (here and below): each row lies in the caller's buffers.
        if rows.len() == queries.rows {
            return unsafe { write_rows(cuda, &found, 0, out) };
        }
        for (i, &r) in rows.iter().enumerate() {
            let one = Neighbors {
                k,
                ids: found.ids[i * k..(i + 1) * k].to_vec(),
                distances: found.distances_of(i).to_vec(),
            };
            unsafe { write_rows(cuda, &one, r, out)? };
        }
        Ok(())
    }
}

/// Runs of rows a device graph redoes at most (each one call of the host's path).
const MAX_REDO_RUNS: usize = 64;

/// The rows not `proven`, in runs of consecutive rows (each computed again as rows of the
/// graph). Beyond [`MAX_REDO_RUNS`] runs, the runs separated by the fewest proven rows are
/// joined (their proven rows computed again too, to the same values) until that many are left.
fn redo_runs(proven: &[bool]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for i in (0..proven.len()).filter(|&i| !proven[i]) {
        match runs.last_mut() {
            Some(r) if r.end == i => r.end += 1,
            _ => runs.push(i..i + 1),
        }
    }
    if runs.len() > MAX_REDO_RUNS {
        // Join across the smallest gaps: gap j lies between runs j and j + 1.
        let mut gaps: Vec<usize> = (0..runs.len() - 1).collect();
        gaps.sort_by_key(|&j| (runs[j + 1].start - runs[j].end, j));
        let mut join = vec![false; runs.len() - 1];
        for &j in &gaps[..runs.len() - MAX_REDO_RUNS] {
            join[j] = true;
        }
        let mut joined: Vec<std::ops::Range<usize>> = Vec::with_capacity(MAX_REDO_RUNS);
        for (j, r) in runs.into_iter().enumerate() {
            match joined.last_mut() {
                Some(last) if join[j - 1] => last.end = r.end,
                _ => joined.push(r),
            }
        }
        runs = joined;
    }
    runs
}

/// Writes the rows of `found` to rows `at..` of `out` (ids in the caller's type).
///
/// # Safety
/// `out` must have room for those rows in `cuda`'s device memory.
unsafe fn write_rows(
    cuda: &CudaEngine,
    found: &Neighbors,
    at: usize,
    out: DeviceResults,
) -> Result<()> {
    let k = found.k;
    let ids_at = out.ids + (at * k * out.id_bytes()) as u64;
    // SAFETY: as the caller vouches.
    unsafe {
        if out.ids_i64 {
            let wide: Vec<i64> = found.ids.iter().map(|&i| i64::from(i)).collect();
            cuda.write_device(&wide, ids_at)?;
        } else {
            cuda.write_device(&found.ids, ids_at)?;
        }
        cuda.write_device(&found.distances, out.distances + (at * k * 4) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::{redo_runs, MAX_REDO_RUNS};

    #[test]
    fn unproven_rows_are_redone_in_runs() {
        assert!(redo_runs(&[true; 5]).is_empty());
        // (One range compared as its bounds: clippy reads `[0..3]` as a mistake.)
        let whole = |r: Vec<std::ops::Range<usize>>| -> Vec<(usize, usize)> {
            r.iter().map(|r| (r.start, r.end)).collect()
        };
        assert_eq!(whole(redo_runs(&[false; 3])), vec![(0, 3)]);
        let p = [true, false, false, true, false, true, true, false];
        assert_eq!(redo_runs(&p), [1..3, 4..5, 7..8]);
        let at_limit: Vec<bool> = (0..2 * MAX_REDO_RUNS).map(|i| i % 2 == 0).collect();
        assert_eq!(redo_runs(&at_limit).len(), MAX_REDO_RUNS);
        // Beyond the limit, the runs closest together are joined: rows 0 and 2 (one proven
        // row apart) before any of the runs three rows apart, the first such gap first.
        let mut p = vec![true; 4 * MAX_REDO_RUNS];
        for r in 0..MAX_REDO_RUNS {
            p[4 * r] = false;
        }
        p[2] = false;
        let runs = redo_runs(&p);
        assert_eq!(runs.len(), MAX_REDO_RUNS);
        assert_eq!(runs[..2], [0..3, 4..5]);
        assert!(runs[1..].iter().all(|r| r.len() == 1));
        assert_eq!(runs.last().map(|r| r.start), Some(4 * (MAX_REDO_RUNS - 1)));
        // Every unproven row is in a run; runs are ordered and apart.
        let scattered: Vec<bool> = (0..5000).map(|i| (i * 7919) % 13 != 0).collect();
        let runs = redo_runs(&scattered);
        assert_eq!(runs.len(), MAX_REDO_RUNS);
        assert!(runs.windows(2).all(|w| w[0].end < w[1].start));
        for (i, _) in scattered.iter().enumerate().filter(|(_, &ok)| !ok) {
            assert!(runs.iter().any(|r| r.contains(&i)), "row {i}");
        }
    }
}
