"""knn.dask on a LocalCluster of 2 worker processes: answers equal knn.search / knn.graph."""

import numpy as np
import pytest

import knn

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
import knn.dask as kd  # noqa: E402


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def _data(kind, n, d, seed):
    rng = np.random.default_rng(seed)
    if kind == "ties":  # few distinct values: many equal distances, duplicates across chunks
        return rng.integers(0, 3, (n, d)).astype(np.float32)
    return rng.standard_normal((n, d)).astype(np.float32)


def _equal_one_process(client, b, q, k, rows, graph_points=None, metric="l2"):
    """knn.dask.search of ``b`` (chunks of ``rows`` rows) and ``q`` (blocks of ``rows // 2``
    rows), and knn.dask.graph of ``graph_points`` (default ``b``), equal knn.search and
    knn.graph byte for byte."""
    p = b if graph_points is None else graph_points
    d, i = client.compute(kd.search(da.from_array(b, chunks=(rows, b.shape[1])),
                                    da.from_array(q, chunks=(rows // 2, q.shape[1])), k,
                                    metric=metric), sync=True)
    D, I = knn.search(b, q, k, metric=metric)
    assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()
    d, i = client.compute(kd.graph(da.from_array(p, chunks=(rows, p.shape[1])), k,
                                   metric=metric), sync=True)
    D, I = knn.graph(p, k, metric=metric)
    assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()


@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("k", [1, 7, 40])  # 40 > one base chunk of 25
def test_search_and_graph_equal_one_process(client, kind, k):
    _equal_one_process(client, _data(kind, 103, 5, 1), _data(kind, 37, 5, 2), k, 25)


def _tasks(lazy, name):
    graph = {}
    for x in lazy:
        graph.update(x.__dask_graph__())
    return [key for key in graph if str(key).startswith(name + "-")]


def test_one_search_per_base_chunk_and_group():
    # Each base chunk's searches are one task holding its index (none to steal from its worker):
    # 4 base chunks x 4 query blocks (one group) are 4 searches, each building its index, not
    # 16 searches; each block's 4 partials are one merge, each output block one task.
    b, q = _data("random", 1000, 8, 7), _data("random", 1000, 8, 8)
    lazy = kd.search(da.from_array(b, chunks=(250, 8)), da.from_array(q, chunks=(250, 8)), 10)
    assert not _tasks(lazy, "_build") and len(_tasks(lazy, "_search_group")) == 4
    assert len(_tasks(lazy, "_merge")) == 4
    out = [key for x in lazy for key in x.__dask_graph__() if str(key).startswith("('knn-")]
    assert len(set(out)) == 8
    # 20 base chunks: a tree of merges of at most 8 (3 + 1 per block)
    lazy = kd.search(da.from_array(b, chunks=(50, 8)), da.from_array(q, chunks=(250, 8)), 10)
    assert len(_tasks(lazy, "_merge")) == 4 * 4
    assert len(_tasks(kd.graph(da.from_array(b, chunks=(250, 8)), 10), "_search_group")) == 4
    # Many small query blocks: groups of consecutive blocks while their rows and output (rows x
    # (d x item size + k x (distance + id + exact key) bytes)) stay within the cap; one search
    # per (base chunk, group).
    assert kd._GROUP_BYTES == 256 << 20
    assert kd._groups([5] * 12, 16, 320) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert kd._groups([5, 30, 5, 5], 16, 320) == [[0], [1], [2, 3]]  # 30 rows alone > cap
    args = dict(metric="l2", device="auto")
    base = da.from_array(b[:300], chunks=(100, 8))
    # d=8, k=4: 112 bytes a float32 row (32 + 4 x 20), 160 a float64 one (64 + 4 x 24): blocks
    # of 5 rows, 3 (1680 bytes) or 2 (1600) to a group of at most 1700 bytes
    for dtype, groups in ((np.float32, 4), (np.float64, 6)):
        queries = da.from_array(q[:60].astype(dtype), chunks=(5, 8))
        lazy = kd._run(base, queries, 4, False, args, group_bytes=1700)
        assert len(_tasks(lazy, "_search_group")) == 3 * groups
        assert len(_tasks(lazy, "_build")) == 3  # several groups share each chunk's build
    # A group's blocks searched in batches of at least _BATCH_ROWS rows; a block that large
    # alone.
    assert kd._batches([(0, 5), (1, 5), (2, 20), (3, 4), (4, 3)], 10) == [[0, 1], [2], [3, 4]]
    assert kd._batches([(1, 3)], 10) == [[1]] and kd._batches([], 10) == []
    assert kd._BATCH_ROWS == 8192
    # In one process: a large block searched alone, the small ones around it as one batch;
    # each block's partial is its own search's (global ids, keys when asked).
    big = _data("random", 8200, 8, 9)
    blocks = [q[:5], big, q[5:12]]
    index = knn.Index(b)
    out = kd._search_group(index, args, blocks, [3, 4, 2], 1000, -1, True)
    for block, k, (d, i, key) in zip(blocks, [3, 4, 2], out):
        D, I = index.search(block, k)
        assert d.tobytes() == D.tobytes() and (i - 1000).tobytes() == I.tobytes()
        assert key.tobytes() == index.exact_keys(block, I).tobytes()
    # the default cap: 12 blocks of 5 rows are one group, one search per base chunk
    lazy = kd.search(base, da.from_array(q[:60], chunks=(5, 8)), 4)
    assert len(_tasks(lazy, "_search_group")) == 3


@pytest.mark.parametrize("k", [7, 40])
def test_groups_of_query_blocks_equal_one_process(client, k):
    # Several groups per base chunk, a graph's own block at any place in its group, and a chunk
    # of one point (no other point of it for its own block: that block is left out of its group,
    # with the 51-row cap, or its group has no search against that chunk, with the 20-row cap).
    b, q = _data("ties", 103, 5, 9), _data("ties", 37, 5, 10)
    args = dict(metric="l2", device="auto")
    for chunks in ((25, 5), ((50, 1, 52), 5), (10, 5)):
        base = da.from_array(b, chunks=chunks)
        for cap_rows in (20, 51):
            cap = cap_rows * (5 * 4 + k * 12)  # float32, d=5
            d, i = client.compute(kd._run(base, da.from_array(q, chunks=(10, 5)), k, False,
                                          args, group_bytes=cap), sync=True)
            D, I = knn.search(b, q, k)
            assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()
            d, i = client.compute(kd._run(base, base, k, True, args, group_bytes=cap), sync=True)
            D, I = knn.graph(b, k)
            assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()


def test_index_weighed_by_its_rows():
    # The scheduler weighs an index by its rows' bytes, so that it sends query blocks to it.
    from dask.sizeof import sizeof

    rows = _data("random", 30, 5, 4)
    for given, width in ((rows, 4), (rows.astype(np.float64), 8)):
        index = knn.Index(given, device="cpu")
        assert index.nbytes == 30 * 5 * width
        assert sizeof(index) == index.nbytes
    index.add(rows[:7])
    assert sizeof(index) == 37 * 5 * 8


def test_numpy_input_and_laziness(client):
    b = _data("random", 50, 3, 3)
    d, i = kd.search(b, b[:9], 4, chunks=16)
    assert isinstance(d, da.Array) and d.chunks == ((9,), (4,))
    D, I = knn.search(b, b[:9], 4)
    assert np.array_equal(client.compute(i, sync=True), I)


def test_nearest_neighbors_keeps_its_indexes(client):
    # fit builds one index per chunk on the workers and keeps it: later kneighbors calls (with
    # queries, or the graph of the fitted points) take those (finished futures in their graph,
    # nothing to build), and the workers still hold them afterwards. (The scheduler may copy a
    # small index to an idle worker for a search, and Dask's memory manager may then drop either
    # replica: which worker holds it may change, that one does not.)
    b, q = _data("ties", 300, 6, 11), _data("ties", 40, 6, 12)
    nn = kd.NearestNeighbors(n_neighbors=7, device="cpu").fit(da.from_array(b, chunks=(75, 6)))

    def held(dask_worker):  # how many knn.Index objects a worker holds
        return sum(isinstance(v, knn.Index) for v in dask_worker.data.values())

    assert sum(client.run(held).values()) == 4
    builds = [v for key, v in nn.kneighbors(q)[0].__dask_graph__().items() if "_build" in str(key)]
    assert len(builds) == 4 and all(isinstance(f, distributed.Future) and f.done() for f in builds)
    for _ in range(2):
        d, i = client.compute(nn.kneighbors(da.from_array(q, chunks=(15, 6))), sync=True)
        D, I = knn.search(b, q, 7, device="cpu")
        assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()
        d, i = client.compute(nn.kneighbors(n_neighbors=5), sync=True)
        D, I = knn.graph(b, 5, device="cpu")
        assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()
    who = client.who_has(builds)
    assert all(who[f.key] for f in builds) and all(f.status == "finished" for f in builds)
    with pytest.raises(ValueError, match="dimension mismatch"):
        nn.kneighbors(q[:, :5])
    b[123, 4] = np.nan  # the engine's message, raised by fit
    with pytest.raises(ValueError, match="chunk of rows 75 to 149 .*row 48, column 4 is NaN"):
        kd.NearestNeighbors(device="cpu").fit(da.from_array(b, chunks=(75, 6)))


def test_worker_lost_mid_job(client):
    b, q = _data("ties", 4000, 16, 4), _data("ties", 1000, 16, 5)
    lazy = kd.search(da.from_array(b, chunks=(100, 16)), da.from_array(q, chunks=(50, 16)), 9)
    futs = client.compute(list(lazy))

    def held(dask_scheduler):  # workers holding a chunk's partials (its index built there)
        return sorted({ws.address for ts in dask_scheduler.tasks.values()
                       if "_search_group" in str(ts.key) for ws in (ts.who_has or ())})

    for _ in range(500):
        victims = client.run_on_scheduler(held)
        if victims or all(f.done() for f in futs):
            break
        __import__("time").sleep(0.01)
    assert victims and not all(f.done() for f in futs), "the job ended before a worker could be lost"
    client.restart_workers([victims[0]])  # that worker's processes and memory are gone
    d, i = client.gather(futs)
    D, I = knn.search(b, q, 9)
    assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()


@pytest.mark.parametrize("call", [
    lambda b: kd.search(b, b, 0), lambda b: kd.search(b, b, 11),
    lambda b: kd.graph(b, 10), lambda b: kd.search(b, np.ones((2, 3), np.float32), 2),
])
def test_bad_input_same_errors_nothing_scheduled(client, call):
    b = _data("random", 10, 4, 6)
    ref = {0: lambda: knn.search(b, b, 0), 1: lambda: knn.search(b, b, 11),
           2: lambda: knn.graph(b, 10), 3: lambda: knn.search(b, np.ones((2, 3), np.float32), 2)}
    ntasks = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    with pytest.raises(ValueError) as got:
        call(da.from_array(b, chunks=(4, 4)))
    msgs = []
    for f in ref.values():
        try:
            f()
        except ValueError as e:
            msgs.append(str(e))
    assert str(got.value) in msgs
    # nothing was submitted: the scheduler knows no more tasks than before the call
    assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) <= ntasks


@pytest.mark.parametrize("metric", ["l2", "sqeuclidean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_keys_that_round_to_one_distance(client, metric, dtype):
    # From the origin, row 0 (first chunk) has key 1 + 4e-8 and row 3 (second chunk) 1 + 1e-8:
    # both distances round to 1.0 in float32; knn.search keeps row 3, the smaller key. Merged
    # by distances, the first chunk's smaller id would win.
    b = np.array([[1, 2e-4], [9, 9], [9, 8], [1, 1e-4], [8, 9], [7, 9]], np.float32)
    q = np.zeros((3, 2), dtype)
    D, I = knn.search(b, q, 1, metric=metric)
    assert I[0, 0] == 3
    d, i = client.compute(kd.search(da.from_array(b, chunks=(3, 2)), da.from_array(q), 1,
                                    metric=metric), sync=True)
    assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()
    # Two neighbours: the tied distances come in id order, as knn.search gives them.
    D, I = knn.search(b, q, 2, metric=metric)
    d, i = client.compute(kd.search(da.from_array(b, chunks=(3, 2)), da.from_array(q), 2,
                                    metric=metric), sync=True)
    assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()


@pytest.mark.parametrize("metric", ["l2", "cosine", "hellinger", "ip", "l1"])
def test_near_ties_on_random_data_equal_one_process(client, metric):
    # Points on an integer lattice, each moved by at most 2e-4 along a third axis: from a point
    # a few cells away, the keys of a cell's points differ by less than float32 resolves, so
    # distances tie in groups and knn.search picks within a tie by key. Merged by distances,
    # search / graph rows differed for every metric here (l2 at k = 5: 300 of 300 / 1439 of
    # 2000; cosine 144 / 46; hellinger 85 / 2; ip 0 / 2000; l1 300 / 9).
    rng = np.random.default_rng(9)

    def lattice(n, lo, hi):
        x = np.zeros((n, 3), np.float32)
        x[:, :2] = rng.integers(lo, hi, (n, 2))
        x[:, 2] = rng.random(n) * 2e-4
        return x

    b, q, p = lattice(4000, 0, 4), lattice(300, 4, 6), lattice(2000, 0, 40)
    q[:, 2] = 0
    for k in (1, 5):
        _equal_one_process(client, b, q, k, 500, graph_points=p, metric=metric)


def test_mahalanobis_over_chunks_needs_a_covariance():
    b = _data("random", 40, 3, 7)
    with pytest.raises(ValueError, match="covariance="):
        kd.search(da.from_array(b, chunks=(10, 3)), b, 2, metric="mahalanobis")
    with pytest.raises(ValueError, match="covariance="):
        kd.NearestNeighbors(2, metric="mahalanobis").fit(da.from_array(b, chunks=(10, 3)))
    cov = np.cov(b, rowvar=False)
    d, i = da.compute(*kd.search(da.from_array(b, chunks=(10, 3)), b, 2, metric="mahalanobis",
                                 covariance=cov))
    D, I = knn.search(b, b, 2, metric="mahalanobis", covariance=cov)
    assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()


def test_graph_of_points_not_their_own_nearest(client):
    # Inner products: point 0's own product (1) is below its two others' (3 + 1e-8 for row 1,
    # 3 + 2e-8 for row 2, both 3.0 in float32): knn.graph keeps row 2, the larger product; the
    # 2 nearest without point 0 have it last in (distance, id) order.
    p = np.array([[1, 1e-4], [3, 1e-4], [3, 2e-4], [0.5, 0]], np.float32)
    D, I = knn.graph(p, 1, metric="ip")
    assert I[0, 0] == 2
    for rows in (4, 2):
        d, i = client.compute(kd.graph(da.from_array(p, chunks=(rows, 2)), 1, metric="ip"),
                              sync=True)
        assert d.tobytes() == D.tobytes() and i.tobytes() == I.tobytes()


def test_merge_of_partials():
    # The native merge behind the tree: by (key, id), then equal distances by id; a partial's
    # first columns (not C-contiguous) as a group search hands them over; bad partials refused.
    from knn import _knn

    d1 = np.array([[1.0, 2.0, 5.0]], np.float32)
    i1 = np.array([[9, 5, 4]], np.int64)
    k1 = np.array([[1.0, 2.0, 5.0]])
    d2 = np.array([[2.0, 3.0]], np.float32)
    i2 = np.array([[12, 13]], np.int64)
    k2 = np.array([[1.5, 3.0]])
    d, i, key = _knn.merge_partials(3, [(d1, i1, k1), (d2, i2, k2)])
    # id 12's key 1.5 is below id 5's 2.0; both report 2.0, so id 5 comes first.
    assert d.dtype == np.float32 and d.tolist() == [[1.0, 2.0, 2.0]]
    assert i.tolist() == [[9, 5, 12]] and key.tolist() == [[1.0, 2.0, 1.5]]
    two = [np.vstack([x, x])[:, :2] for x in (d1, i1, k1)]
    assert not two[0].flags.c_contiguous
    d, i, key = _knn.merge_partials(9, [tuple(two)])
    assert i.tolist() == [[9, 5], [9, 5]] and d.tolist() == [[1.0, 2.0], [1.0, 2.0]]
    with pytest.raises(ValueError, match="partial answer 1: distances"):
        _knn.merge_partials(2, [(d1, i1, k1), (d2.astype(np.float64), i2, k2)])
    with pytest.raises(ValueError, match="share one shape"):
        _knn.merge_partials(2, [(d1, i1, k1), (d2, i2, k1)])
