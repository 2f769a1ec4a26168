"""``knn.Index``, ``knn.search`` and ``knn.graph``."""

from __future__ import annotations

import numpy as np

from . import _knn
from ._arrays import (
    CudaRows, as_k, as_matrix, cuda_library, current_stream, device_results, gpu_home,
    parse_bytes, to_gpu,
)

_SYMMETRIC = {True: "on", False: "off", "auto": "auto", "on": "on", "off": "off"}


class Index:
    """An exact k-nearest-neighbour index over a fixed set of base points.

    Built once, searched many times, from any number of threads at once (the GIL is released
    while it computes). Every answer is exact with respect to the values given (float64 ones
    included): each row holds a true k-nearest set, ordered by (distance, id) with the smaller
    id first among equal distances, the same on every device and thread count.

    Parameters
    ----------
    data : array_like, shape (n, d)
        The base points: a NumPy array of any real dtype and memory order, a nested list, a
        PyTorch CPU tensor, a host array of another library through DLPack, or anything NumPy
        converts. PyTorch, CuPy and JAX arrays in GPU memory are copied to the host once
        (graphs then come back to their GPU, see :meth:`graph`). Kept in float64 when NumPy
        makes float64 of it (float64 arrays and tensors, lists of Python floats; longdouble
        is rounded to float64), else in float32 (float32, float16, integers: integers beyond
        2**24 in magnitude are rounded, pass float64 to keep them exact); see Notes. NaN,
        infinite values, values beyond the float32 range (about 3.4e38), empty input and 1-D
        input are refused with a ``ValueError``. A C-contiguous float32 or float64 array is
        used in place, with no copy: the index keeps a reference to it, and it must not be
        modified while the index lives (the answers would no longer be exact). Other inputs
        are converted once, into an array the index keeps.
    metric : str, default "l2"
        ``"l2"`` (Euclidean), ``"sqeuclidean"``, ``"ip"`` (inner product, largest first, the
        similarity is reported), ``"cosine"`` (1 - cos), ``"l1"``, ``"linf"``, ``"hellinger"``
        (sqrt(0.5 * sum (sqrt x - sqrt y)^2), inputs >= 0) or ``"mahalanobis"``. Aliases:
        ``"euclidean"``, ``"manhattan"``, ``"cityblock"``, ``"chebyshev"``. Cosine: an
        all-zero row is at distance 1 from every row (scikit-learn's convention).
        ``"mahalanobis"`` takes float32 data only (see Notes).
    device : str, default "auto"
        ``"auto"`` (a usable NVIDIA GPU, else the CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``;
        several GPUs as ``"cuda:0,1"`` or ``"cuda:all"`` (searches of a base from 256 MiB
        give each GPU a part of the base, symmetric graphs a share of their pairs, anything
        else rounds of queries; the answer is the same as on one). The same wheel runs with or without a
        GPU; CUDA is loaded at run time.
    metric_expr : str, optional
        A distance of your own instead of ``metric``: a per-coordinate accumulation over
        ``acc`` (running value, from 0), ``x`` (query coordinate) and ``y`` (base coordinate),
        optionally followed by ``; FINAL``, a non-decreasing step over ``acc`` for the reported
        distance. For example ``"acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)"`` is Hellinger.
        Numbers, ``+ - * /``, ``^n`` (whole n), ``abs sqrt exp log min max``. Takes float32
        data only (see Notes).
    covariance : array_like, shape (d, d), optional
        For ``metric="mahalanobis"``: the covariance (symmetric positive definite). Without
        it the covariance is estimated from the base (unbiased, divisor n - 1). Used in
        float32.
    gpu_memory : int or str, optional
        Cap on the GPU memory used for tiles, in bytes or as ``"2GiB"``, ``"512MiB"``;
        smaller caps stream the base from host memory. Default: 70 % of free memory.
    threads : int, optional
        CPU threads. Default: one per core.

    Attributes
    ----------
    dim : int
        Dimension of the points.
    metric : str
        The metric's name (``"expr"`` for ``metric_expr``).
    device : str
        The device in use: ``"cpu"``, ``"cuda:N"``, or ``"cuda:0,1"`` for several GPUs.

    Notes
    -----
    Precision. The engines compute on float32 values, and an exact float64 re-rank decides:
    float64 input stays float64 (the engines compute on its float32 rounding, and the re-rank
    reads the float64 values), so answers are exact for the float64 values themselves, even
    for points closer than a float32 step. Distances come back in the precision of the
    input: ``search`` gives float64 distances for float64 queries and float32 distances for
    float32 queries (whatever the base's precision: float32 queries against a float64 base
    are exact for the float64 base, with float32 distances); ``graph`` gives float64
    distances when the base is float64. Rows added in float64 to a float32 index make it a
    float64 index (its float32 rows are widened exactly). Ids are int64.

    ``metric="mahalanobis"`` and ``metric_expr`` compute on float32 features of their own,
    and exactness for float64 values is proven for the other metrics only: they refuse
    float64 data and float64 queries with a ``ValueError`` (nothing is rounded behind your
    back). Pass float32 for them: ``data.astype(np.float32)``.

    Ctrl-C raises ``KeyboardInterrupt`` and leaves the index usable: a search stops between
    pieces of work (well under a second each); an interrupted ``graph`` returns at once and
    finishes its current work on a thread of its own.

    Examples
    --------
    >>> import numpy as np, knn
    >>> base = np.array([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    >>> index = knn.Index(base, device="cpu")
    >>> distances, ids = index.search([[0.9, 0.1]], k=2)
    >>> ids
    array([[1, 0]])
    >>> distances.dtype  # float64 queries (a list of Python floats): float64 distances
    dtype('float64')

    float64 values closer than a float32 step keep their order:

    >>> points = np.array([[1.0], [1 + 1e-9], [1 + 2e-9], [1 - 3e-9]])
    >>> knn.Index(points, device="cpu").search([[1 + 2.1e-9]], k=4)[1]
    array([[2, 1, 0, 3]])
    """

    def __init__(
        self,
        data,
        metric: str = "l2",
        device: str = "auto",
        *,
        metric_expr: str | None = None,
        covariance=None,
        gpu_memory: int | str | None = None,
        threads: int | None = None,
    ):
        self._build(data, metric, device, metric_expr, covariance, gpu_memory, threads, "auto")

    def _build(self, data, metric, device, metric_expr, covariance, gpu_memory, threads,
               symmetric: str):
        """``__init__``'s work; ``symmetric`` ("auto", "on" or "off") is how the index's graphs
        compute pairs (``graph`` with another setting builds a second index for that call,
        so a one-off :func:`graph` builds its index with its own)."""
        if not isinstance(metric, str):
            raise TypeError(f"metric must be a string, not {metric!r}")
        if not isinstance(device, str):
            raise TypeError(f"device must be a string such as 'cpu' or 'cuda:0', not {device!r}")
        if threads is not None:
            threads = as_k(threads, "threads")
        # A base in GPU memory: its graphs come back there, in its library.
        self._home = gpu_home(data)
        rows = as_matrix(data, "base")
        cov = None if covariance is None else as_matrix(covariance, "covariance", keep_float64=False)
        self._args = dict(
            metric=metric, device=device, metric_expr=metric_expr, covariance=cov,
            gpu_memory=gpu_memory, threads=threads,
        )
        self._native = _knn.NativeIndex(
            rows, metric, device, metric_expr, cov, parse_bytes(gpu_memory), threads, symmetric
        )

    def search(self, queries, k: int):
        """The k nearest base points of every query.

        Parameters
        ----------
        queries : array_like, shape (m, d)
            Query points, converted like the base (float64 stays float64, exact). A PyTorch
            CUDA tensor, a CuPy array or a JAX array on a GPU gives results of its own library
            on its device (see Notes).
        k : int
            Neighbours per query, 1 <= k <= len(index).

        Returns
        -------
        distances : ndarray of float64 or float32, shape (m, k)
            Row i: the distances of query i's neighbours, ascending (for ``"ip"``: the inner
            products, descending). In the queries' precision: float64 for float64 queries
            (lists of Python floats included), float32 for float32 ones, whatever the base's.
        ids : ndarray of int64, shape (m, k)
            Row i: the neighbours' row numbers in the base (ids of added rows continue).

        Notes
        -----
        Queries in GPU memory (a PyTorch CUDA tensor, a CuPy array, a JAX array on one GPU)
        give a tensor (an array) of the same library on the same device for each result,
        after the work queued on the library's current stream there (a JAX array is read once
        JAX computed it; its results are memory of ours that JAX adopts through DLPack, with
        int32 ids unless ``jax_enable_x64`` is on, as JAX has no int64 then). When the index computes on that GPU with float32
        rows and the metric is ``"l2"``, ``"sqeuclidean"``, ``"ip"``, ``"l1"`` or
        ``"linf"``, the queries are read and the results written in GPU memory (other dtypes
        are converted to float32 there first); otherwise, and for float64 queries (whose
        exact search reads them on the host), they are copied to the host and the results
        back. The answer is the same either way.

        Raises
        ------
        ValueError
            Bad input (NaN or infinite values naming row and column, a dimension mismatch,
            k = 0 or k > len(index), negative values for Hellinger).
        """
        k = as_k(k)
        lib = cuda_library(queries)
        if lib is not None:
            return self._search_cuda(CudaRows(queries, "queries", lib), k)
        return self._native.search(as_matrix(queries, "queries"), k)

    def _search_cuda(self, rows: CudaRows, k: int):
        """:meth:`search` of rows in GPU memory (see its Notes)."""
        # The library's own checks of the shape and k, with its messages, before any memory
        # is read or made (asked only when one may fail: the call costs a tenth of a small
        # GPU search's overhead).
        native = self._native
        if rows.dim != native.dim or k > len(native):
            native.check_search(rows.dim, k)
        on_gpu = native.device == f"cuda:{rows.device}" and not rows.float64
        if not on_gpu:
            distances, ids = native.search(as_matrix(rows.host(), "queries"), k)
            return rows.wrap(distances), rows.wrap(ids)
        out = rows.results(k, native)
        if rows.rows > 0:
            native.search_device(
                rows.ptr, rows.rows, rows.device, rows.stream, k,
                out.ids_ptr, out.distances_ptr, out.ids_i64,
            )
        return out.arrays()

    def graph(self, k: int, symmetric="auto"):
        """The kNN graph of the base: each point's k nearest *other* points.

        A point's own id is left out; duplicates of it are still its neighbours, at
        distance 0.

        Parameters
        ----------
        k : int
            Neighbours per point, 1 <= k < len(index).
        symmetric : {"auto", "on", "off"} or bool, default "auto"
            Compute each unordered pair's distance once and take it into both points' lists:
            ``"auto"`` where that was measured faster, ``"on"``/``"off"`` force it. The answer
            is the same either way. An index is built for ``"auto"``: ``"on"`` or ``"off"``
            builds a second index of the same rows for the call (its preparation, and on a GPU
            its upload), which the one-off :func:`graph` avoids.

        Returns
        -------
        distances : ndarray of float64 or float32, shape (n, k)
            float64 when the base is float64 (also after float64 rows were added), else
            float32.
        ids : ndarray of int64, shape (n, k)

        Notes
        -----
        An index built from a PyTorch CUDA tensor, a CuPy array or a JAX array on a GPU gives
        a tensor (an array) of that library on that GPU for each result, after the work
        queued on the library's current stream there (JAX: int32 ids unless
        ``jax_enable_x64`` is on, as for :meth:`search`). When the index computes on that
        GPU with float32 rows, the graph is computed from the base the index keeps there and
        written where the results lie (for ``"l2"``, ``"sqeuclidean"``, ``"ip"``, ``"l1"``,
        ``"linf"`` and ``"hellinger"``; others, and float64 bases, are computed on the host's
        path and copied there). The answer is the same either way.
        """
        k = as_k(k)
        home, native = self._home, self._native
        # (k checked first: the results' memory is made before the native call.)
        on_gpu = home is not None and native.device == f"cuda:{home[1]}" and not native.float64
        if on_gpu and k < len(native):
            out = device_results(home, len(native), k, native)
            native.graph_device(
                k, _symmetric_mode(symmetric), home[1], current_stream(home),
                out.ids_ptr, out.distances_ptr, out.ids_i64, (out.ids, out.distances),
            )
            return out.arrays()
        distances, ids = self._graph_on_host(k, symmetric)
        if home is not None:
            return to_gpu(distances, home), to_gpu(ids, home)
        return distances, ids

    def _graph_on_host(self, k: int, symmetric):
        """:meth:`graph` as NumPy arrays, wherever the base came from."""
        return self._native.graph(as_k(k), _symmetric_mode(symmetric))

    def exact_keys(self, queries, ids):
        """The exact float64 keys a search selects neighbours by.

        A search keeps each query's k base points with the smallest (key, id) and reports
        their distances, rounded to the queries' precision: distinct keys may round to one
        float32 distance. To merge answers of several indexes over parts of one base (shards)
        into what one index over the whole base answers, merge by (key, id), then order each
        row by (distance, id); ``knn.dask`` does so.

        Parameters
        ----------
        queries : array_like, shape (m, d)
            The queries as they were searched (converted the same way).
        ids : array_like of int, shape (m, j)
            Base row numbers of this index, j per query (a search's ``ids``, or any others).

        Returns
        -------
        keys : ndarray of float64, shape (m, j)
            Entry [i, t]: the key of query i and base row ``ids[i, t]`` -- the squared
            distance for ``"l2"`` and ``"sqeuclidean"``, minus the inner product for ``"ip"``,
            cosine similarity's negative for ``"cosine"``, ... (smaller is nearer).

        Raises
        ------
        ValueError
            Queries not finite or of another dimension, ids outside the index or not one row
            per query.
        """
        return self._native.exact_keys(as_matrix(queries, "queries"),
                                       np.asarray(ids, dtype=np.int64))

    def add(self, data) -> None:
        """Append points to the base; their ids continue from ``len(index)``.

        Parameters
        ----------
        data : array_like, shape (m, d)
            Points of the index's dimension, validated and converted like the base. float64
            rows stay float64; added to a float32 index they make it a float64 index (its
            rows widened exactly, the rows copied into the index).
        """
        self._native.add(as_matrix(data, "added rows"))

    def __len__(self) -> int:
        return len(self._native)

    @property
    def dim(self) -> int:
        """Dimension of the points."""
        return self._native.dim

    @property
    def nbytes(self) -> int:
        """Bytes of the points as given (``len × dim`` values of 4 or 8 bytes): what pickling
        the index sends. Dask weighs an index by it when it places tasks."""
        return self._native.nbytes

    @property
    def metric(self) -> str:
        """The metric's name (``"expr"`` for a ``metric_expr``)."""
        return self._native.metric

    @property
    def device(self) -> str:
        """The device in use: ``"cpu"``, ``"cuda:N"``, or ``"cuda:0,1"`` for several GPUs."""
        return self._native.device

    def __repr__(self) -> str:
        return f"knn.Index(n={len(self)}, dim={self.dim}, metric={self.metric!r}, device={self.device!r})"

    def __reduce__(self):
        args = dict(self._args)
        return (_rebuild, (self._native.rows(), args))


def _rebuild(rows, args):
    return Index(rows, **args)


def _symmetric_mode(symmetric) -> str:
    """``symmetric`` as the native layer takes it: "auto", "on" or "off"."""
    try:
        return _SYMMETRIC[symmetric]
    except (KeyError, TypeError):
        raise ValueError(
            f"symmetric={symmetric!r}: expected 'auto', 'on', 'off', True or False"
        ) from None


def search(base, queries, k: int, metric: str = "l2", device: str = "auto", **options):
    """The k nearest ``base`` points of every query, in one call.

    ``Index(base, metric, device, **options).search(queries, k)``: see :class:`Index` for
    the arguments (``metric_expr``, ``covariance``, ``gpu_memory``, ``threads``).

    Returns
    -------
    distances : ndarray of float64 or float32, shape (m, k)
        In the queries' precision (float64 for float64 queries), as :meth:`Index.search`.
    ids : ndarray of int64, shape (m, k)
    """
    return Index(base, metric, device, **options).search(queries, k)


def graph(
    points, k: int, metric: str = "l2", device: str = "auto", *, symmetric="auto",
    format: str = "arrays", **options,
):
    """The kNN graph of ``points``: each point's k nearest other points, in one call.

    Parameters
    ----------
    points : array_like, shape (n, d)
    k : int
        Neighbours per point, 1 <= k < n.
    metric, device, metric_expr, covariance, gpu_memory, threads
        As for :class:`Index`.
    symmetric : {"auto", "on", "off"} or bool, default "auto"
        As for :meth:`Index.graph`.
    format : {"arrays", "csr"}, default "arrays"
        ``"arrays"``: ``(distances, ids)``, each (n, k), distances float64 for float64
        points, else float32 (for points in GPU memory: of their library, on their GPU, as
        :meth:`Index.graph`). ``"csr"``: a
        ``scipy.sparse.csr_matrix`` of shape (n, n) whose row i holds point i's neighbours
        with their distances (as stored entries, zeros included), in (distance, id) order,
        in host memory whatever the points. Needs SciPy.
    """
    if format not in ("arrays", "csr"):
        raise ValueError(f"format={format!r}: expected 'arrays' or 'csr'")
    # Built with the graph's own setting, so that the graph does not build a second index.
    index = Index.__new__(Index)
    index._build(points, metric, device, options.pop("metric_expr", None),
                 options.pop("covariance", None), options.pop("gpu_memory", None),
                 options.pop("threads", None), _symmetric_mode(symmetric))
    if options:
        raise TypeError(f"graph() got an unexpected keyword argument {next(iter(options))!r}")
    if format == "arrays":
        return index.graph(k, symmetric)
    distances, ids = index._graph_on_host(k, symmetric)
    return to_csr(distances, ids, ids.shape[0])


def to_csr(values, ids, columns: int):
    """A ``scipy.sparse.csr_matrix`` of shape (rows, columns) from (rows, k) values and ids."""
    try:
        from scipy.sparse import csr_matrix
    except ImportError:
        raise ImportError("format='csr' needs SciPy (pip install scipy)") from None
    rows, k = ids.shape
    indptr = np.arange(0, rows * k + 1, k, dtype=np.int64)
    return csr_matrix((values.ravel(), ids.ravel(), indptr), shape=(rows, columns))
