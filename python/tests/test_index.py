"""knn.Index, knn.search and knn.graph on NumPy arrays, lists and (when installed) PyTorch."""

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import knn


def oracle(base, queries, k, metric="l2"):
    """float64 brute force on the values as given (float32 ones widened): (distances, ids)
    ordered by (distance, id)."""
    b = np.asarray(base).astype(np.float64)
    q = np.asarray(queries).astype(np.float64)
    diff = q[:, None, :] - b[None, :, :]
    if metric == "l2":
        d = np.sqrt((diff**2).sum(-1))
    elif metric == "sqeuclidean":
        d = (diff**2).sum(-1)
    elif metric == "l1":
        d = np.abs(diff).sum(-1)
    elif metric == "linf":
        d = np.abs(diff).max(-1)
    elif metric == "cosine":
        # 1 - x.y / (|x| |y|); an all-zero row is at distance 1 from every row
        nq, nb = np.linalg.norm(q, axis=1)[:, None], np.linalg.norm(b, axis=1)[None]
        with np.errstate(invalid="ignore", divide="ignore"):
            d = 1 - (q @ b.T) / nq / nb
        d[(nq == 0) | (nb == 0)] = 1.0
        d = np.maximum(d, 0.0)
    elif metric == "hellinger":
        d = np.sqrt(0.5 * ((np.sqrt(q)[:, None] - np.sqrt(b)[None]) ** 2).sum(-1))
    elif metric == "ip":
        d = -(q @ b.T)
    else:
        raise ValueError(metric)
    ids = np.lexsort((np.broadcast_to(np.arange(b.shape[0]), d.shape), d), axis=1)[:, :k]
    dist = np.take_along_axis(d, ids, 1)
    return (-dist if metric == "ip" else dist), ids


def assert_exact(dist, ids, want_dist, want_ids):
    """Distances within float32 rounding; ids equal except among equal distances."""
    np.testing.assert_allclose(dist, want_dist, rtol=1e-5, atol=1e-5)
    for r in range(ids.shape[0]):
        if not np.array_equal(ids[r], want_ids[r]):
            # ties: the same distances, so the same sets within the tolerance
            np.testing.assert_allclose(np.sort(dist[r]), np.sort(want_dist[r]), rtol=1e-5, atol=1e-5)
            assert len(set(ids[r])) == ids.shape[1]


METRICS = ["l2", "sqeuclidean", "l1", "linf", "cosine", "ip", "hellinger"]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_search_matches_the_oracle(rng, metric, dtype):
    base = rng.random((300, 7)).astype(dtype)
    queries = rng.random((40, 7)).astype(dtype)
    index = knn.Index(base, metric, device="cpu")
    dist, ids = index.search(queries, 6)
    assert dist.dtype == dtype and ids.dtype == np.int64
    assert dist.shape == ids.shape == (40, 6)
    assert_exact(dist, ids, *oracle(base, queries, 6, metric))


def test_metric_expr_is_hellinger(rng):
    base = rng.random((200, 5), dtype=np.float32)
    queries = rng.random((20, 5), dtype=np.float32)
    mine = knn.search(base, queries, 4, metric_expr="acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)", device="cpu")
    builtin = knn.search(base, queries, 4, "hellinger", device="cpu")
    np.testing.assert_array_equal(mine[1], builtin[1])
    np.testing.assert_allclose(mine[0], builtin[0], rtol=1e-6)
    assert knn.Index(base, metric_expr="acc + abs(x - y)", device="cpu").metric == "expr"


def test_mahalanobis_with_a_given_covariance(rng):
    base = rng.random((150, 3), dtype=np.float32)
    queries = rng.random((10, 3), dtype=np.float32)
    cov = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]])
    dist, ids = knn.search(base, queries, 3, "mahalanobis", covariance=cov, device="cpu")
    assert dist.dtype == np.float32
    white = np.linalg.cholesky(np.linalg.inv(cov))  # x -> x @ L: L L^T = inverse
    want = oracle(base.astype(np.float64) @ white, queries.astype(np.float64) @ white, 3)
    np.testing.assert_allclose(dist, want[0], rtol=1e-4, atol=1e-5)
    # Estimated from the base when not given:
    assert knn.Index(base, "mahalanobis", device="cpu").search(queries, 3)[1].shape == (10, 3)


def test_any_dtype_order_and_lists_give_the_same_answer(rng):
    base = rng.integers(0, 20, (120, 4))
    queries = rng.integers(0, 20, (15, 4))
    want = knn.search(base.astype(np.float32), queries.astype(np.float32), 5, device="cpu")
    wide = knn.search(base.astype(np.float64), queries.astype(np.float64), 5, device="cpu")
    assert wide[0].dtype == np.float64
    np.testing.assert_array_equal(wide[0].astype(np.float32), want[0])  # both exact, rounded
    # (distances in the queries' precision: float64 for float64 queries and lists of floats)
    for b, q, dtype in [
        (base, queries, np.float32),  # int64
        (base.astype(np.int8), queries.astype(np.uint16), np.float32),
        (base.astype(np.float64), queries.astype(np.float16), np.float32),
        (base.astype(np.float16), queries.astype(np.float64), np.float64),
        (np.asfortranarray(base), np.asfortranarray(queries), np.float32),
        (np.asfortranarray(base, np.float64), np.asfortranarray(queries, np.float64), np.float64),
        (base.tolist(), queries.tolist(), np.float32),  # lists of Python ints
        (base.astype(float).tolist(), queries.astype(float).tolist(), np.float64),  # of floats
        (base[:, ::-1][:, ::-1], queries, np.float32),  # a non-contiguous view
    ]:
        got = knn.search(b, q, 5, device="cpu")
        assert got[0].dtype == dtype
        np.testing.assert_array_equal(got[0], (want if dtype == np.float32 else wide)[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_pytorch_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    base, queries = rng.random((100, 6)), rng.random((9, 6))
    got = knn.search(torch.from_numpy(base), torch.from_numpy(queries).float(), 3, device="cpu")
    want = knn.search(base, queries, 3, device="cpu")
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].dtype == np.float32  # float32 queries
    # float64 tensors stay float64 (the base used in place), as float64 arrays do
    t = torch.from_numpy(base)
    index = knn.Index(t, device="cpu")
    assert index._native.shares_rows
    got = index.search(torch.from_numpy(queries), 3)
    assert got[0].dtype == np.float64
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_index_attributes_add_and_pickle(rng, dtype):
    base = rng.random((50, 3)).astype(dtype)
    index = knn.Index(base, "cosine", device="cpu", threads=1)
    assert (len(index), index.dim, index.metric, index.device) == (50, 3, "cosine", "cpu")
    assert "n=50" in repr(index)
    extra = rng.random((5, 3)).astype(dtype)
    index.add(extra)
    assert len(index) == 55
    _, ids = index.search(extra, 1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(50, 55))  # ids continue
    again = pickle.loads(pickle.dumps(index))
    assert len(again) == 55 and again.metric == "cosine"
    rows = again._native.rows()
    assert rows.dtype == dtype  # the rows as given, in their precision
    np.testing.assert_array_equal(rows, np.vstack([base, extra]))
    q = rng.random((7, 3)).astype(dtype)
    for a, b in [(again.search(q, 4), index.search(q, 4)), (again.graph(4), index.graph(4))]:
        assert a[0].dtype == b[0].dtype == dtype
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_graph_leaves_each_point_out_and_keeps_duplicates(rng):
    points = rng.random((400, 5))
    points[10] = points[3]  # a duplicate: each is the other's neighbour at distance 0
    index = knn.Index(points, device="cpu")
    for symmetric in ("auto", "on", "off", True, False):
        dist, ids = index.graph(4, symmetric=symmetric)
        assert not (ids == np.arange(400)[:, None]).any()
        assert ids[3, 0] == 10 and ids[10, 0] == 3 and dist[3, 0] == 0.0
    want_d, want_i = oracle(points, points, 5)
    np.testing.assert_allclose(dist, want_d[:, 1:], rtol=1e-5, atol=1e-6)


def test_one_off_graphs_take_their_symmetry_setting(rng):
    """knn.graph builds its index with its own `symmetric` (one index per call, not two): the
    same graph as an index's, for every setting."""
    points = rng.random((300, 6)).astype(np.float32)
    points[40] = points[7]
    index = knn.Index(points, device="cpu")
    for symmetric in ("auto", "on", "off", True, False):
        got = knn.graph(points, 5, device="cpu", symmetric=symmetric, threads=2)
        want = index.graph(5, symmetric=symmetric)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])


def test_graph_as_csr(rng):
    scipy_sparse = pytest.importorskip("scipy.sparse")
    points = rng.random((60, 4))
    g = knn.graph(points, 3, device="cpu", format="csr")
    assert isinstance(g, scipy_sparse.csr_matrix) and g.shape == (60, 60)
    dist, ids = knn.graph(points, 3, device="cpu")
    np.testing.assert_array_equal(g.indices.reshape(60, 3), ids)
    np.testing.assert_array_equal(g.data.reshape(60, 3), dist)


def test_many_threads_searching_one_index_agree(rng):
    base, queries = rng.random((3000, 16)), rng.random((500, 16))
    index = knn.Index(base, device="cpu")
    want = index.search(queries, 10)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: index.search(queries, 10), range(16)))
        graphs = list(pool.map(lambda _: index.graph(5), range(4)))
    for dist, ids in results:
        np.testing.assert_array_equal(ids, want[1])
        np.testing.assert_array_equal(dist, want[0])
    for g in graphs[1:]:
        np.testing.assert_array_equal(g[1], graphs[0][1])


def test_the_gil_is_released_while_searching(rng):
    base, queries = rng.random((20000, 32)), rng.random((4000, 32))
    index = knn.Index(base, device="cpu")
    ticks = []
    done = threading.Event()

    def tick():
        while not done.is_set():
            ticks.append(1)
            done.wait(0.001)

    t = threading.Thread(target=tick)
    t.start()
    index.search(queries, 10)
    done.set()
    t.join()
    assert len(ticks) > 5


@pytest.mark.parametrize("call", ["search", "graph"])
def test_ctrl_c_raises_keyboard_interrupt_and_the_index_stays_usable(rng, call, ctrl_c):
    import _thread
    base = rng.random((20000, 64)).astype(np.float32)
    index = knn.Index(base, device="cpu")
    queries = rng.random((60000, 64)).astype(np.float32)
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        if call == "search":
            index.search(queries, 10)
        else:
            big = knn.Index(np.vstack([base, queries[:20000]]), device="cpu")
            big.graph(10)
        raise AssertionError("not interrupted")  # (the KeyboardInterrupt would come later)
    timer.join()
    small = queries[:5]
    assert_exact(*index.search(small, 3), *oracle(base, small, 3))


def test_large_searches_in_pieces_number_rows_in_the_whole_query_set(rng):
    base = rng.random((20000, 64)).astype(np.float32)
    queries = rng.random((30000, 64)).astype(np.float32)  # more than one piece
    index = knn.Index(base, device="cpu")
    dist, ids = index.search(queries, 2)
    assert ids.shape == (30000, 2)
    assert_exact(dist[-20:], ids[-20:], *oracle(base, queries[-20:], 2))
    h = knn.Index(base, "hellinger", device="cpu")
    queries[28500, 7] = -1.0  # in the second piece
    with pytest.raises(ValueError, match="queries: row 28500, column 7 is -1"):
        h.search(queries, 2)


# Every error is a Python exception with the library's message; never a crash.
ERRORS = [
    (lambda: knn.Index([[0, 1], [np.nan, 2]]), ValueError, "base: row 1, column 0 is NaN"),
    (lambda: knn.search([[0, 1]], [[0, 1], [2, np.inf]], 1), ValueError, "queries: row 1, column 1 is inf"),
    (lambda: knn.search([[0, 1]], [[0, 1, 2]], 1), ValueError, "dimension mismatch: base has d=2, queries have d=3"),
    (lambda: knn.Index(np.zeros((0, 3))), ValueError, "the base set is empty"),
    (lambda: knn.Index(np.zeros((4, 0))), ValueError, "dimension must be at least 1"),
    (lambda: knn.search(np.zeros((10, 2)), [[0, 0]], 20), ValueError, "k=20 is larger than the 10 points available"),
    (lambda: knn.search(np.zeros((10, 2)), [[0, 0]], 0), ValueError, "k must be at least 1"),
    (lambda: knn.search(np.zeros((10, 2)), [[0, 0]], 2.0), TypeError, "k must be an integer"),
    (lambda: knn.Index(np.zeros(5)), ValueError, r"Reshape your data either using array.reshape\(-1, 1\)"),
    (lambda: knn.search(np.zeros((5, 2)), np.zeros(2), 1), ValueError, r"array.reshape\(1, -1\)"),
    (lambda: knn.Index(np.zeros((2, 2, 2))), ValueError, "expected a 2-D array"),
    (lambda: knn.Index(np.zeros((3, 2), complex)), ValueError, "not a real number type"),
    (lambda: knn.Index([["a", "b"]]), ValueError, "not a real number type"),
    (lambda: knn.Index([[1, 2], [3]]), ValueError, "not an array of numbers"),
    (lambda: knn.Index([[1e300, 0.0]]), ValueError, "base: row 0, column 0 is 1e300, beyond the float32 range"),
    (lambda: knn.search([[1.0, 0.0]], [[0.0, 0.0], [0.0, -1e40]], 1), ValueError, "queries: row 1, column 1 is -1e40, beyond the float32 range"),
    (lambda: knn.Index([[0.0, 0.0]], "mahalanobis", covariance=np.eye(2, dtype=np.float32)), ValueError, "mahalanobis metric takes float32"),
    (lambda: knn.Index([[1.0]], covariance=[[1e300]]), ValueError, r"covariance: row 0, column 0 is 1e\+300, beyond the float32 range"),
    (lambda: knn.Index([[1.0, -0.5]], "hellinger"), ValueError, "needs values >= 0"),
    (lambda: knn.Index([[1.0]], "nope"), ValueError, "unknown metric 'nope'"),
    (lambda: knn.Index([[1.0]], device="tpu"), ValueError, "unknown device 'tpu'"),
    (lambda: knn.Index([[1.0]], device="cuda:0,zz"), ValueError, "'zz' is not a GPU number"),
    (lambda: knn.Index([[1.0]], metric_expr="acc + sqr(x - y)"), ValueError, "metric_expr: .*unknown function 'sqr'"),
    (lambda: knn.Index(np.eye(3, dtype=np.float32), "mahalanobis", covariance=np.eye(2)), ValueError, "covariance is 2×2, the data has d=3"),
    (lambda: knn.Index(np.eye(3), covariance=np.eye(3)), ValueError, "covariance is only for metric='mahalanobis'"),
    (lambda: knn.Index(np.eye(3), threads=0), ValueError, "threads must be at least 1"),
    (lambda: knn.Index(np.eye(3), gpu_memory="lots"), ValueError, "not a size"),
    (lambda: knn.Index(np.eye(3), metric=2), TypeError, "metric must be a string"),
    (lambda: knn.Index(np.eye(3)).graph(3), ValueError, "k=3 is larger than the 2 points available"),
    (lambda: knn.Index(np.eye(3)).graph(1, symmetric="maybe"), ValueError, "symmetric='maybe'"),
    (lambda: knn.graph(np.eye(3), 1, format="coo"), ValueError, "format='coo'"),
    (lambda: knn.graph(np.eye(3), 1, symmetric="maybe"), ValueError, "symmetric='maybe'"),
    (lambda: knn.graph(np.eye(3), 1, colour="red"), TypeError, "unexpected keyword argument 'colour'"),
    (lambda: knn.Index(np.eye(3)).add(np.eye(2)), ValueError, "the added rows have d=2, the index has d=3"),
    (lambda: knn.Index(np.eye(3)).add([[0, np.nan, 0]]), ValueError, "added rows: row 0, column 1 is NaN"),
    (lambda: knn.Index(np.eye(3, dtype=np.float32)).add([[0, np.inf, 0]]), ValueError, "added rows: row 0, column 1 is inf"),
    (lambda: knn.Index(np.eye(3)).add([[0, 1e300, 0]]), ValueError, "added rows: row 0, column 1 is 1e300, beyond"),
    (lambda: knn.Index(np.eye(3)).search(np.eye(2), 1), ValueError, "dimension mismatch: base has d=3, queries have d=2"),
    (lambda: knn.Index(np.eye(3)).search(np.zeros((1, 0)), 1), ValueError, "dimension must be at least 1"),
]


@pytest.mark.parametrize("call,kind,message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_errors(call, kind, message):
    with pytest.raises(kind, match=message):
        call()


def test_a_missing_gpu_is_a_clear_error():
    if knn.devices():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError):
        knn.Index(np.eye(3), device="cuda")
    assert knn.Index(np.eye(3), device="auto").device == "cpu"
    assert isinstance(knn.gpu_status(), str)


def test_help_explains_every_argument():
    doc = knn.Index.__doc__
    for arg in ["data", "metric", "device", "metric_expr", "covariance", "gpu_memory", "threads"]:
        assert f"{arg} :" in doc, arg
    for method in (knn.Index.search, knn.Index.graph, knn.Index.add, knn.search, knn.graph):
        assert "Returns" in method.__doc__ or "Parameters" in method.__doc__


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_c_contiguous_base_is_used_in_place(rng, dtype):
    import gc
    import sys

    base = rng.random((1000, 8)).astype(dtype)
    held = sys.getrefcount(base)
    index = knn.Index(base, device="cpu")
    assert index._native.shares_rows and sys.getrefcount(base) == held + 1  # the array itself
    for other in (np.asfortranarray(base), base.astype(np.float16)):
        held = sys.getrefcount(other)
        copied = knn.Index(other, device="cpu")
        assert sys.getrefcount(other) == held  # a copy of it was made and is kept instead
        del copied
    del base  # the index keeps the array alive
    gc.collect()
    rows = index._native.rows()
    assert rows.dtype == dtype
    dist, ids = index.search(rows[:3], 1)
    assert dist.dtype == dtype
    np.testing.assert_array_equal(ids[:, 0], [0, 1, 2])
    index.add(np.zeros((1, 8), dtype))
    assert len(index) == 1001 and not index._native.shares_rows


@pytest.mark.skipif(not knn.devices(), reason="no usable GPU (SKIPPED; runs on the GPU machine)")
@pytest.mark.parametrize("metric", ["l2", "cosine", "l1", "hellinger"])
def test_gpu_gives_the_cpu_answer(rng, metric):
    base = rng.random((5000, 24)).astype(np.float32)
    queries = rng.random((300, 24)).astype(np.float32)
    gpu = knn.Index(base, metric, device="cuda")
    assert gpu.device.startswith("cuda")
    cpu = knn.Index(base, metric, device="cpu")
    for a, b in [(gpu.search(queries, 10), cpu.search(queries, 10)), (gpu.graph(7), cpu.graph(7))]:
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_allclose(a[0], b[0], rtol=1e-6, atol=1e-7)


def test_several_gpus_give_the_cpu_answer(rng):
    """``device="cuda:all"``: every usable GPU (refused, with the reason, where there is none).
    With several GPUs, a base of more than 256 MiB is split among them; smaller ones and
    graphs split the queries."""
    gpus = [n for n, _ in knn.devices()]
    if not gpus:
        with pytest.raises(ValueError, match="no usable GPU for 'all'"):
            knn.Index([[1.0]], device="cuda:all")
        return
    n = 600_000 if len(gpus) > 1 else 5000  # 600 000 x 112 float32: 269 MB
    base = rng.random((n, 112), dtype=np.float32)
    queries = rng.random((200, 112), dtype=np.float32)
    index = knn.Index(base, device="cuda:all")
    assert index.device == "cuda:" + ",".join(map(str, gpus))
    cpu = knn.Index(base, device="cpu")
    a, b = index.search(queries, 10), cpu.search(queries, 10)
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6, atol=1e-7)
    small = knn.Index(base[:3000], device="cuda:all")
    a, b = small.graph(5), knn.Index(base[:3000], device="cpu").graph(5)
    np.testing.assert_array_equal(a[1], b[1])


def test_unaligned_and_big_endian_arrays(rng):
    base = rng.random((64, 4)).astype(np.float32)
    raw = np.frombuffer(b"\0" + base.tobytes(), dtype=np.float32, offset=1).reshape(64, 4)
    assert not raw.flags.aligned
    want = knn.search(base, base[:5], 3, device="cpu")
    raw64 = np.frombuffer(b"\0" + base.astype(np.float64).tobytes(), np.float64, offset=1)
    raw64 = raw64.reshape(64, 4)
    assert not raw64.flags.aligned
    for b in (raw, base.astype(">f4"), base.astype(">f8"), raw64):
        got = knn.search(b, base[:5], 3, device="cpu")
        np.testing.assert_array_equal(got[1], want[1])
    got = knn.search(base, raw64[:5], 3, device="cpu")
    assert got[0].dtype == np.float64
    np.testing.assert_array_equal(got[1], want[1])


def test_large_copies_made_in_pieces_keep_every_value(rng):
    # Copies from 32 MiB on are made in pieces of rows on several threads: a misaligned
    # float32 array (as Dask workers receive chunks), a Fortran-order one, float64 kept in
    # float32, big-endian; pieces of 8 MiB and of 3 rows (a short last piece).
    from knn._arrays import _contiguous

    base = rng.standard_normal((66_001, 128)).astype(np.float32)  # 33.8 MB
    raw = np.frombuffer(b"\0" + base.tobytes(), np.float32, offset=1).reshape(base.shape)
    assert not raw.flags.aligned
    cases = [(raw, np.float32), (np.asfortranarray(base), np.float32),
             (base.astype(np.float64), np.float32), (base.astype(">f4"), np.float32),
             (base.astype(np.float64)[::-1], np.float64)]
    for a, dtype in cases:
        for piece in (8 << 20, 3 * 128 * 4):
            got = _contiguous(a, dtype, piece)
            assert got.dtype == dtype and got.flags.c_contiguous and got.flags.aligned
            np.testing.assert_array_equal(got, np.require(a, dtype, ["C_CONTIGUOUS"]))
    assert _contiguous(base, np.float32) is base
    want = knn.search(base, base[:5], 3, device="cpu")
    got = knn.search(raw, base[:5], 3, device="cpu")
    assert want[0].tobytes() == got[0].tobytes() and want[1].tobytes() == got[1].tobytes()


def test_huge_k_is_an_error_not_a_crash(rng):
    index = knn.Index(rng.random((20000, 64)), device="cpu")
    queries = rng.random((20000, 64))  # searched in pieces
    with pytest.raises(ValueError, match="is larger than the 20000 points available"):
        index.search(queries, 2**40)
    with pytest.raises(ValueError, match="is larger than"):
        index.graph(2**40)


class _DLPackArray:
    """An array of another library, seen only through the DLPack protocol."""

    def __init__(self, a, device=None):
        self.a, self.device = a, device

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device or self.a.__dlpack_device__()


def test_dlpack_host_arrays_and_a_clear_error_for_device_ones(rng):
    base = rng.random((100, 5)).astype(np.float32)
    want = knn.search(base, base[:4], 3, device="cpu")
    got = knn.search(_DLPackArray(base), _DLPackArray(base[:4]), 3, device="cpu")
    np.testing.assert_array_equal(got[1], want[1])
    assert got[0].dtype == np.float32
    wide = base.astype(np.float64) + 1e-12  # float64 through DLPack stays float64
    index = knn.Index(_DLPackArray(wide), device="cpu")
    assert index._native.shares_rows and index._native.rows().dtype == np.float64
    got = index.search(_DLPackArray(wide[:4]), 3)
    assert got[0].dtype == np.float64
    np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ValueError, match="device memory .* copy it to the host"):
        knn.Index(_DLPackArray(base, device=(2, 0)))


def test_searches_run_while_rows_are_added(rng):
    index = knn.Index(rng.random((2000, 8)), device="cpu")
    queries = rng.random((200, 8))
    stop = threading.Event()
    seen = []

    def search():
        while not stop.is_set():
            _, ids = index.search(queries, 5)
            seen.append(int(ids.max()))

    threads = [threading.Thread(target=search) for _ in range(3)]
    for t in threads:
        t.start()
    extra = [rng.random((100, 8)) for _ in range(5)]
    with ThreadPoolExecutor(2) as pool:  # two adds at once both land
        list(pool.map(index.add, extra))
    for rows in extra[2:]:
        index.add(rows)
    stop.set()
    for t in threads:
        t.join()
    assert len(index) == 2000 + 8 * 100 and seen
    _, ids = index.search(extra[-1], 1)
    assert (ids[:, 0] >= 2000).all()


def test_exact_keys_are_the_keys_a_search_selects_by():
    rng = np.random.default_rng(4)
    b = rng.standard_normal((300, 7)).astype(np.float32)
    q = rng.standard_normal((20, 7)).astype(np.float32)
    index = knn.Index(b, "l2")
    d, i = index.search(q, 5)
    keys = index.exact_keys(q, i)
    want = ((b[i].astype(np.float64) - q[:, None, :].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_allclose(keys, want, rtol=1e-15)
    assert (np.diff(keys, axis=1) >= 0).all()
    assert (np.sqrt(keys).astype(np.float32) == d).all()
    ip = knn.Index(b, "ip").exact_keys(q, i)
    np.testing.assert_allclose(ip, -(b[i].astype(np.float64) * q[:, None, :]).sum(-1),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="not every id is a row"):
        index.exact_keys(q, i + 300)
    with pytest.raises(ValueError, match="ids for 20 queries"):
        index.exact_keys(q, i[:10])
    with pytest.raises(ValueError, match="NaN"):
        index.exact_keys(np.full((20, 7), np.nan), i)
    with pytest.raises(ValueError, match="dimension"):
        index.exact_keys(q.reshape(35, 4), i)
