"""Exact kNN on Dask: base chunks held as `knn.Index` objects on the workers (issue 22).

``search(base, queries, k)`` and ``graph(points, k)`` take Dask arrays chunked by rows (NumPy is
accepted and chunked) and return lazy ``(distances, ids)`` Dask arrays chunked like the queries,
distances in the queries' precision as ``knn.search`` gives them (float64 for float64 queries).
Each base chunk becomes one ``knn.Index`` (a delayed object, built once per chunk and shared by
every query block; Dask recomputes it if its worker is lost). Every query block is searched
against every base chunk; partials carry global ids (chunk offset + local id) and are merged
pairwise in a tree, ordered by (distance, id) -- smaller id first on ties, as ``knn.search``.

Validation (shapes, k against the total number of points, metric) runs eagerly before anything
is scheduled; NaN checks run lazily inside the chunk tasks (the engine's own message).
Tested on a 2-process LocalCluster (python/tests/test_dask.py): byte-equal to one process,
ties, k larger than a chunk, a worker lost mid-job, bad input.
"""

from __future__ import annotations

import numpy as np

from . import Index
from ._arrays import precision

__all__ = ["search", "graph", "NearestNeighbors"]


def _as_dask(x, chunks=None):
    import dask.array as da

    if not isinstance(x, da.Array):
        x = np.asarray(x)
        if x.ndim != 2:
            raise ValueError(
                "Expected 2D array, got 1D array instead; reshape your data either using "
                "array.reshape(-1, 1) if your data has a single feature or array.reshape(1, -1) "
                "if it contains a single sample."
            )
        x = da.from_array(x, chunks=(chunks or max(1, x.shape[0]), x.shape[1]))
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array, got {x.ndim}-D")
    if len(x.chunks[1]) != 1:
        x = x.rechunk({1: -1})
    return x


def _sizeof_index(index):
    # Dask otherwise takes an index for a few bytes and moves it to an idle worker (pickling
    # its rows and building it again) rather than sending the query block to it.
    return index.nbytes


try:
    from dask.sizeof import sizeof

    sizeof.register(Index)(_sizeof_index)
except ImportError:  # Dask is imported (and its absence reported) when a function is called.
    pass


def _build(rows, args):
    return Index(rows, **args)


def _partial(index, queries, k, offset):
    d, i = index.search(queries, k)
    return d, i + offset


def _partial_self(index, queries, k, offset, qstart):
    """Own chunk in a graph: search k+1, drop each row's own id (or the last entry)."""
    d, i = index.search(queries, k + 1)
    own = np.arange(queries.shape[0])[:, None] + qstart
    keep = i != own
    drop_last = keep.all(axis=1)
    keep[drop_last, -1] = False
    m = queries.shape[0]
    return d[keep].reshape(m, k), i[keep].reshape(m, k) + offset


def _merge(a, b, k):
    """The k best of two partials by (distance, id). Each row of a partial is in that order, and
    every id of `a` is below every id of `b` (adjacent base ranges, in order), so a stable sort
    by distance alone keeps ties in id order (half the time of a two-key lexsort)."""
    d = np.concatenate([a[0], b[0]], axis=1)
    i = np.concatenate([a[1], b[1]], axis=1)
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, 1), np.take_along_axis(i, order, 1)


def _tree(parts, k):
    from dask import delayed

    while len(parts) > 1:
        nxt = [delayed(_merge, pure=True)(parts[j], parts[j + 1], k)
               for j in range(0, len(parts) - 1, 2)]
        if len(parts) % 2:
            nxt.append(parts[-1])
        parts = nxt
    return parts[0]


def _run(base, queries, k, self_graph, args):
    import dask.array as da
    from dask import delayed

    starts = np.cumsum((0,) + base.chunks[0])
    bblocks = base.to_delayed().ravel()
    indexes = [delayed(_build, pure=True)(b, args) for b in bblocks]
    qstarts = np.cumsum((0,) + queries.chunks[0])
    dist_blocks, id_blocks = [], []
    for qi, qb in enumerate(queries.to_delayed().ravel()):
        m = queries.chunks[0][qi]
        parts = []
        for bi, idx in enumerate(indexes):
            size = int(starts[bi + 1] - starts[bi])
            if self_graph and bi == qi:
                kc = min(k, size - 1)
                if kc > 0:
                    parts.append(delayed(_partial_self)(idx, qb, kc, int(starts[bi]), 0))
            else:
                kc = min(k, size)
                if kc > 0:
                    parts.append(delayed(_partial)(idx, qb, kc, int(starts[bi])))
        res = _tree(parts, k)
        dist_blocks.append(da.from_delayed(res[0], (m, k), dtype=precision(queries.dtype)))
        id_blocks.append(da.from_delayed(res[1], (m, k), dtype=np.int64))
    return da.concatenate(dist_blocks, axis=0), da.concatenate(id_blocks, axis=0)


def _check_k(k, n, graph):
    # The messages of knn.search / knn.graph, raised before anything is scheduled.
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")
    if graph and k > n - 1:
        raise ValueError(f"k={k} is larger than the {n - 1} points available (a graph excludes "
                         f"each point itself: {n} points less one)")
    if not graph and k > n:
        raise ValueError(f"k={k} is larger than the {n} points available")


def search(base, queries, k, metric="l2", device="auto", *, chunks=None, **options):
    """Lazy exact kNN of every query row among the base rows; see ``knn.search``."""
    base = _as_dask(base, chunks)
    queries = _as_dask(queries, chunks)
    if base.shape[1] != queries.shape[1]:
        raise ValueError(f"dimension mismatch: base has d={base.shape[1]}, "
                         f"queries have d={queries.shape[1]}")
    _check_k(k, base.shape[0], False)
    return _run(base, queries, int(k), False, dict(metric=metric, device=device, **options))


def graph(points, k, metric="l2", device="auto", *, chunks=None, **options):
    """Lazy kNN graph (own point excluded); see ``knn.graph`` (symmetric="off" semantics)."""
    points = _as_dask(points, chunks)
    _check_k(k, points.shape[0], True)
    return _run(points, points, int(k), True, dict(metric=metric, device=device, **options))


class NearestNeighbors:
    """Dask counterpart of ``knn.sklearn.NearestNeighbors`` (as cuML's dask estimator)."""

    def __init__(self, n_neighbors=5, metric="l2", device="auto", **options):
        self.n_neighbors, self.metric, self.device, self.options = (
            n_neighbors, metric, device, options)

    def fit(self, X, y=None):
        self._fit_X = _as_dask(X)
        return self

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        k = n_neighbors or self.n_neighbors
        if X is None:
            d, i = graph(self._fit_X, k, self.metric, self.device, **self.options)
        else:
            d, i = search(self._fit_X, X, k, self.metric, self.device, **self.options)
        return (d, i) if return_distance else i
