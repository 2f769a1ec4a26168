"""Exact kNN on Dask: base chunks held as `knn.Index` objects on the workers (issue 22).

``search(base, queries, k)`` and ``graph(points, k)`` take Dask arrays chunked by rows (NumPy is
accepted and chunked) and return lazy ``(distances, ids)`` Dask arrays chunked like the queries,
distances in the queries' precision as ``knn.search`` gives them (float64 for float64 queries).
Every query block is searched against every base chunk; partials carry global ids (chunk offset
+ local id) and, with several base chunks, the exact float64 keys a search selects by
(``Index.exact_keys``), and are merged in a tree (up to ``_FAN_IN`` partials a merge): the k
best by (key, id), ordered by (distance, id) -- smaller id first on ties, as ``knn.search``.
Merging by the distances alone would not do: distinct keys may round to one float32 distance,
and ``knn.search`` keeps the smaller key (1e6 x 1e5 normal float32 rows, d = 128, k = 10, base
in 4 chunks: 2 rows of 1e5 differed at the k-th neighbour).

The task graph keeps each base chunk's searches with its index, so that nothing moves an index:

- the query blocks cut into groups of consecutive blocks whose rows and partial output (rows x
  k x (distance + id + key) bytes) stay within ``_GROUP_BYTES`` (256 MiB); one ``_search_group`` task
  per (base chunk, group) takes the chunk's index and the group's blocks, searches them (small
  blocks batched into one call, blocks of ``_BATCH_ROWS`` rows one call each; a graph's own
  block apart) and returns each block's partial;
- the chunk's ``knn.Index`` is built inside its search when one group searches it (the usual
  case), else by one ``_build`` task per base chunk (a delayed object shared by the chunk's
  searches); either way Dask recomputes it if its worker is lost;
- one merge tree per query block (``_merge``, base chunk order, each merge picking its inputs
  out of the group searches' tuples; native, on every core of its worker) gives its answer,
  and each output block (distances, ids) is one task reading its field from it.

4 base chunks x 4 small query blocks: 4 group searches (each building its index), 4 merges, 8
output blocks. The scheduler places a group search where its index or base chunk is (an index
weighs its rows' bytes, a query block a few MB), and with as many base chunks as workers each
worker has its one search and nothing to steal. The former graph had one search task per (query block, base chunk): Dask's
work stealing moved them, with their index, to idle workers (an index pickles its rows and is
built again there: 5-7 rebuilds per job of 4 x 4 on 4 workers), and 16 unequal tasks spread
unevenly. Where a huge query set makes several groups per base chunk, they share one build.
Each level of tasks costs a round trip through the scheduler (about 10 ms per level on one GPU
worker, more than the merges): hence the builds inside the searches, merges of up to 8
partials, and output blocks read straight from the last merge.

``NearestNeighbors.fit`` builds the chunks' indexes once and keeps them on their workers
(persisted); its ``kneighbors`` graphs take them instead of building.

Validation (shapes, k against the total number of points, metric) runs eagerly before anything
is scheduled; NaN checks run lazily inside the chunk tasks (the engine's own message, prefixed
with the chunk's rows).
Tested on a 2-process LocalCluster (python/tests/test_dask.py): byte-equal to one process,
ties, k larger than a chunk, a worker lost mid-job, bad input, the graph's shape.
"""

from __future__ import annotations

import numpy as np

from . import Index, _knn
from ._arrays import as_matrix, precision

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

# Query rows from which a group's blocks are searched one call each rather than copied into
# one batch (see `_batches`). One H200, a 10^6-row index: four 25 000-row blocks took 344 ms
# one by one against 13 ms to copy them into one array and 361 ms to search it; four
# 2500-row blocks 37.8 ms one by one against 0.6 + 35.1 ms. A call cost ~1 ms there, a row's
# copy ~0.13 us: the two meet near 8000 rows.
_BATCH_ROWS = 8192

# Partials merged by one task (a block's partials are k x its rows each): each level of the
# tree is a round trip through the scheduler, which cost more than the merges on one GPU
# worker; 8 keeps a merge's input under 8 partials' size.
_FAN_IN = 8


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


def _build(rows, args, offset):
    """The ``Index`` of the base chunk whose first row is ``offset``; its errors say which
    chunk (the engine numbers rows within it)."""
    try:
        return Index(rows, **args)
    except ValueError as e:
        raise ValueError(f"base chunk of rows {offset} to {offset + len(rows) - 1} (rows "
                         f"numbered within it): {e}") from None


def _partial(index, queries, d, i, offset, keys):
    """A partial: distances, global ids, and with ``keys`` the exact keys of the local ids
    ``i`` (what a merge selects by)."""
    if not keys:
        return d, i + offset
    return d, i + offset, index.exact_keys(queries, i)


def _partial_self(index, queries, k, offset, qstart, keys):
    """Own chunk in a graph: search k+1, drop each row's own id, or where the point is not
    among its k+1 nearest (inner products, expressions) the largest by (key, id): the last
    entry by distance may not be that one when distances tie."""
    d, i = index.search(queries, k + 1)
    own = np.arange(queries.shape[0])[:, None] + qstart
    keep = i != own
    missing = np.flatnonzero(keep.all(axis=1))
    if len(missing):
        key = index.exact_keys(as_matrix(queries, "queries")[missing], i[missing])
        # Equal keys stand in id order: the last of the largest.
        keep[missing, k - np.argmax(key[:, ::-1], axis=1)] = False
    m = queries.shape[0]
    return _partial(index, queries, d[keep].reshape(m, k), i[keep].reshape(m, k), offset, keys)


def _search_group(index, args, blocks, ks, offset, own, keys):
    """One base chunk's partials for a group of query blocks: ``blocks[j]`` searched for
    ``ks[j]`` neighbours; ``blocks[own]`` (a graph's own chunk, else ``own`` is -1) without each
    row's own id. A tuple, one (distances, global ids[, exact keys with ``keys``]) per block.
    ``index``: the chunk's ``Index`` (a ``_build`` task's), or its rows, indexed here with
    ``args``.

    Small blocks are searched together (see ``_batches``): a row's answer does not depend on
    the rows searched with it, and one call pays the engine's fixed cost (a GPU's uploads,
    launches and downloads) once rather than per block. Each block takes the first ``ks[j]`` of
    the largest k asked: rows come in (distance, id) order, so those are its ``ks[j]`` best."""
    if not isinstance(index, Index):
        index = _build(index, args, offset)
    out = [None] * len(blocks)
    if 0 <= own:
        out[own] = _partial_self(index, blocks[own], ks[own], offset, 0, keys)
    for batch in _batches([(j, blocks[j].shape[0]) for j in range(len(blocks)) if j != own]):
        queries = blocks[batch[0]] if len(batch) == 1 else np.concatenate([blocks[j] for j in batch])
        d, i = index.search(queries, max(ks[j] for j in batch))
        whole = _partial(index, queries, d, i, offset, keys)
        start = 0
        for j in batch:
            end = start + blocks[j].shape[0]
            out[j] = tuple(x[start:end, :ks[j]] for x in whole)
            start = end
    return tuple(out)


def _batches(blocks, rows=None):
    """``(j, rows)`` blocks in batches searched as one: small blocks together, in order, until
    a batch holds ``rows`` (``_BATCH_ROWS``) query rows, so that a search's fixed cost is paid
    once per batch; a block of that many rows alone, as copying it into a batch costs more than
    the call it saves."""
    rows = _BATCH_ROWS if rows is None else rows
    out, cur, held = [], [], 0
    for j, m in blocks:
        if m >= rows:
            out.append([j])
            continue
        cur.append(j)
        held += m
        if held >= rows:
            out.append(cur)
            cur, held = [], 0
    if cur:
        out.append(cur)
    return out


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


def _pick(x, j):
    """A query block's partial: ``x[j]`` of a group search's tuple, or ``x`` (a merge's)
    when ``j`` is None."""
    return x if j is None else x[j]


def _merge(k, *parts):
    """The k best of several partials (distances, ids, exact keys) by (key, id), ordered by
    (distance, id) as ``knn.search`` orders them; ``parts`` alternate a task's result and the
    ``j`` that ``_pick`` reads it with. Native (``knn::merge_answers``, on every core): NumPy's
    row-wise sorts took 60-85 ms a merge of four 25 000 x 10 partials on one GPU worker, a
    quarter of a 4-chunk job of 10^5 queries."""
    parts = [_pick(parts[p], parts[p + 1]) for p in range(0, len(parts), 2)]
    return _knn.merge_partials(k, parts)


def _field(x, j, f):
    """Field ``f`` (0: distances, 1: ids) of a query block's answer (see ``_pick``)."""
    return _pick(x, j)[f]


def _tree(parts, k):
    """One query block's answer from its partials, each (task, j) as ``_pick`` reads it: a
    tree of merges of up to ``_FAN_IN`` partials each, in base chunk order."""
    from dask import delayed

    while len(parts) > 1:
        parts = [(delayed(_merge, pure=True)(k, *(x for p in few for x in p)), None)
                 if len(few) > 1 else few[0]
                 for few in (parts[j:j + _FAN_IN] for j in range(0, len(parts), _FAN_IN))]
    return parts[0]


def _run(base, queries, k, self_graph, args, group_bytes=_GROUP_BYTES, indexes=None):
    """``(distances, ids)`` of every query block against every base chunk; ``indexes``: the
    chunks' indexes already built (``NearestNeighbors.fit``'s), else built in the job."""
    import dask.array as da
    from dask import delayed
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    _check_covariance(args, base)
    starts = np.cumsum((0,) + base.chunks[0])
    qblocks = queries.to_delayed().ravel()
    dtype = precision(queries.dtype)
    # Partials are merged (several base chunks) by their exact keys.
    keys = len(base.chunks[0]) > 1
    row_bytes = (queries.shape[1] * queries.dtype.itemsize
                 + k * (np.dtype(dtype).itemsize + 8 + 8 * keys))
    groups = _groups(queries.chunks[0], row_bytes, group_bytes)
    # A chunk searched by one group builds its index in that search (one task and one round
    # trip through the scheduler less); several groups share a `_build` task's.
    if indexes is None:
        indexes = [b if len(groups) == 1 else delayed(_build, pure=True)(b, args, int(start))
                   for b, start in zip(base.to_delayed().ravel(), starts)]
    # parts[qi]: query block qi's partials, one per base chunk that has neighbours for it.
    parts = [[] for _ in qblocks]
    for group in groups:
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
                idx, args, [qblocks[qi] for qi, _ in todo], [kc for _, kc in todo],
                int(starts[bi]), own, keys)
            for j, (qi, _) in enumerate(todo):
                parts[qi].append((res, j))
    # Each output block is one task reading its field straight from the block's last merge or
    # search (no getitem, from_delayed or concatenate tasks between: on one GPU worker those
    # tiny tasks cost more than the merges).
    ends = [_tree(p, k) for p in parts]
    token = tokenize([(x.key, j) for x, j in ends], k)
    out = []
    for f, (what, dt) in enumerate((("distances", dtype), ("ids", np.int64))):
        name = f"knn-{what}-{token}"
        layer = {(name, qi, 0): (_field, x.key, j, f) for qi, (x, j) in enumerate(ends)}
        graph = HighLevelGraph.from_collections(name, layer, dependencies=[x for x, _ in ends])
        out.append(da.Array(graph, name, chunks=(queries.chunks[0], (k,)), dtype=dt))
    return tuple(out)


def _check_k(k, n, graph):
    # The messages of knn.search / knn.graph, raised before anything is scheduled.
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")
    if graph and k > n - 1:
        raise ValueError(f"k={k} is larger than the {n - 1} points available (a graph excludes "
                         f"each point itself: {n} points less one)")
    if not graph and k > n:
        raise ValueError(f"k={k} is larger than the {n} points available")


def _check_covariance(args, base):
    if (str(args.get("metric")).lower() == "mahalanobis" and args.get("covariance") is None
            and len(base.chunks[0]) > 1):
        raise ValueError(
            "metric='mahalanobis' over several base chunks needs covariance= (the base's "
            "covariance matrix, d x d): without one each chunk would estimate its own, and the "
            "answer would not be knn.search's; or give the base as one chunk")


def _check_dims(base, queries):
    if base.shape[1] != queries.shape[1]:
        raise ValueError(f"dimension mismatch: base has d={base.shape[1]}, "
                         f"queries have d={queries.shape[1]}")


def search(base, queries, k, metric="l2", device="auto", *, chunks=None, **options):
    """Lazy exact kNN of every query row among the base rows; see ``knn.search``."""
    base = _as_dask(base, chunks)
    queries = _as_dask(queries, chunks)
    _check_dims(base, queries)
    _check_k(k, base.shape[0], False)
    return _run(base, queries, int(k), False, dict(metric=metric, device=device, **options))


def graph(points, k, metric="l2", device="auto", *, chunks=None, **options):
    """Lazy kNN graph (own point excluded); see ``knn.graph`` (symmetric="off" semantics)."""
    points = _as_dask(points, chunks)
    _check_k(k, points.shape[0], True)
    return _run(points, points, int(k), True, dict(metric=metric, device=device, **options))


class NearestNeighbors:
    """Dask counterpart of ``knn.sklearn.NearestNeighbors`` (as cuML's dask estimator).

    ``fit`` indexes each chunk of the data on the worker that holds it (on its GPU when it has
    one) and keeps the indexes there (persisted): every later ``kneighbors`` searches them,
    and only the query blocks and the partial results move. ``kneighbors()`` without queries
    is the kNN graph of the fitted points (each point's own id left out). Answers are those of
    ``knn.search`` / ``knn.graph`` on the whole data in one process, ties included."""

    def __init__(self, n_neighbors=5, metric="l2", device="auto", **options):
        self.n_neighbors, self.metric, self.device, self.options = (
            n_neighbors, metric, device, options)

    def _args(self):
        return dict(metric=self.metric, device=self.device, **self.options)

    def fit(self, X, y=None):
        import dask
        from dask import delayed

        X = _as_dask(X)
        args = self._args()
        _check_covariance(args, X)
        starts = np.cumsum((0,) + X.chunks[0])
        builds = [delayed(_build, pure=True)(b, args, int(start))
                  for b, start in zip(X.to_delayed().ravel(), starts)]
        self._indexes = list(dask.persist(*builds))
        self._fit_X = X
        try:
            from distributed import futures_of, wait
        except ImportError:  # no cluster: the local scheduler built them already
            return self
        # Built before fit returns, as scikit-learn's: bad data raises here (the engine's
        # message, from the first chunk that failed), and kneighbors only searches.
        futures = futures_of(self._indexes)
        wait(futures)
        for f in futures:
            if f.status == "error":
                f.result()
        return self

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        k = int(n_neighbors or self.n_neighbors)
        base = self._fit_X
        if X is None:
            _check_k(k, base.shape[0], True)
            d, i = _run(base, base, k, True, self._args(), indexes=self._indexes)
        else:
            X = _as_dask(X)
            _check_dims(base, X)
            _check_k(k, base.shape[0], False)
            d, i = _run(base, X, k, False, self._args(), indexes=self._indexes)
        return (d, i) if return_distance else i
