"""Exact kNN on Dask: base chunks held as `knn.Index` objects on the workers (issue 22).

``search(base, queries, k)`` and ``graph(points, k)`` take Dask arrays chunked by rows (NumPy is
accepted and chunked) and return lazy ``(distances, ids)`` Dask arrays chunked like the queries,
distances in the queries' precision as ``knn.search`` gives them (float64 for float64 queries).
Every query block is searched against every base chunk; partials carry global ids (chunk offset
+ local id) and are merged pairwise in a tree, ordered by (distance, id) -- smaller id first on
ties, as ``knn.search``.

The task graph keeps each base chunk's searches with its index, so that nothing moves an index:

- one ``_build`` task per base chunk: its ``knn.Index`` (a delayed object, built once and shared
  by the chunk's searches; Dask recomputes it if its worker is lost);
- the query blocks cut into groups of consecutive blocks whose rows and partial output (rows x
  k x (distance + id) bytes) stay within ``_GROUP_BYTES`` (256 MiB); one ``_search_group`` task
  per (base chunk, group) takes the index and the group's blocks and returns each block's
  partial;
- one small ``getitem`` per (base chunk, query block) picks a block's partial out of its group's
  result, and one merge tree per query block (``_merge``, base chunk order) gives its answer.

4 base chunks x 4 small query blocks: 4 builds, 4 group searches, 16 getitems, 12 merges. The
scheduler places a group search where its index is (the index weighs its rows' bytes, a query
block a few MB), and with as many base chunks as workers each worker has its one search and
nothing to steal. The former graph had one search task per (query block, base chunk): Dask's
work stealing moved them, with their index, to idle workers (an index pickles its rows and is
built again there: 5-7 rebuilds per job of 4 x 4 on 4 workers), and 16 unequal tasks spread
unevenly. The index stays a task of its own rather than being built inside the search task: a
huge query set makes several groups per base chunk, which share one build.

Validation (shapes, k against the total number of points, metric) runs eagerly before anything
is scheduled; NaN checks run lazily inside the chunk tasks (the engine's own message).
Tested on a 2-process LocalCluster (python/tests/test_dask.py): byte-equal to one process,
ties, k larger than a chunk, a worker lost mid-job, bad input, the graph's shape.
"""

from __future__ import annotations

import numpy as np

from . import Index
from ._arrays import precision

__all__ = ["search", "graph", "NearestNeighbors"]

# The most bytes one search task holds: its query blocks and the partials it returns (rows x
# (d x the queries' item size + k x (distance + id) bytes)). One task per base chunk keeps the
# searches with their index (nothing for the scheduler to steal), but a task's query blocks all
# sit on its worker while it runs, its output stays there whole until every block of it is
# merged, and a lost worker recomputes it whole: past this size the query blocks are split into
# several groups (several tasks per base chunk, sharing its index), so a huge query set does not
# become one task of many GB per base chunk. 256 MiB is 424 000 float32 queries at d = 128,
# k = 10 (2.2 million by the partials alone).
_GROUP_BYTES = 256 << 20


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


def _search_group(index, blocks, ks, offset, own):
    """One base chunk's partials for a group of query blocks: ``blocks[j]`` searched for
    ``ks[j]`` neighbours; ``blocks[own]`` (a graph's own chunk, else ``own`` is -1) without each
    row's own id. A tuple, one (distances, global ids) per block."""
    return tuple(_partial_self(index, q, kc, offset, 0) if j == own else
                 _partial(index, q, kc, offset)
                 for j, (q, kc) in enumerate(zip(blocks, ks)))


def _groups(rows, row_bytes, cap):
    """Consecutive query blocks (by their row counts) in groups of at most cap bytes at
    row_bytes a row; a block larger than cap on its own is a group of one."""
    groups, cur, size = [], [], 0
    for qi, m in enumerate(rows):
        b = m * row_bytes
        if cur and size + b > cap:
            groups.append(cur)
            cur, size = [], 0
        cur.append(qi)
        size += b
    if cur:
        groups.append(cur)
    return groups


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


def _run(base, queries, k, self_graph, args, group_bytes=_GROUP_BYTES):
    import dask.array as da
    from dask import delayed

    starts = np.cumsum((0,) + base.chunks[0])
    indexes = [delayed(_build, pure=True)(b, args) for b in base.to_delayed().ravel()]
    qblocks = queries.to_delayed().ravel()
    dtype = precision(queries.dtype)
    # parts[qi]: query block qi's partials, one per base chunk that has neighbours for it.
    parts = [[] for _ in qblocks]
    row_bytes = queries.shape[1] * queries.dtype.itemsize + k * (np.dtype(dtype).itemsize + 8)
    for group in _groups(queries.chunks[0], row_bytes, group_bytes):
        for bi, idx in enumerate(indexes):
            size = int(starts[bi + 1] - starts[bi])
            # (query block, k for it) of this group; a graph's own chunk excludes each point
            # itself, and a chunk with no neighbour to give a block is left out.
            todo = [(qi, min(k, size - 1) if self_graph and qi == bi else min(k, size))
                    for qi in group]
            todo = [(qi, kc) for qi, kc in todo if kc > 0]
            if not todo:
                continue
            own = next((j for j, (qi, _) in enumerate(todo) if self_graph and qi == bi), -1)
            res = delayed(_search_group, pure=True)(
                idx, [qblocks[qi] for qi, _ in todo], [kc for _, kc in todo], int(starts[bi]), own)
            for j, (qi, _) in enumerate(todo):
                parts[qi].append(res[j])
    dist_blocks, id_blocks = [], []
    for qi, m in enumerate(queries.chunks[0]):
        res = _tree(parts[qi], k)
        dist_blocks.append(da.from_delayed(res[0], (m, k), dtype=dtype))
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
