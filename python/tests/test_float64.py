"""float64 input is exact with respect to the float64 values, and distances come back in the
input's precision (float64 queries: float64 distances; float32 queries: float32)."""

import pickle

import numpy as np
import pytest

import knn

# Every metric that takes float64 data (mahalanobis and metric_expr take float32 only).
METRICS = ["l2", "sqeuclidean", "l1", "linf", "cosine", "ip", "hellinger"]
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(
        not knn.devices(), reason="no usable GPU (SKIPPED; runs on the GPU machine)")),
]


def brute_force(base, queries, metric):
    """All distances in float64, computed directly on the given values (q x b)."""
    b = np.asarray(base, np.float64)
    q = np.asarray(queries, np.float64)
    if metric == "cosine":
        # 1 - x.y / (|x| |y|), an all-zero row at distance 1 from every row
        nq, nb = np.linalg.norm(q, axis=1)[:, None], np.linalg.norm(b, axis=1)[None]
        with np.errstate(invalid="ignore", divide="ignore"):
            d = 1 - (q @ b.T) / (nq * nb)
        d[(nq == 0) | (nb == 0)] = 1.0
        return np.maximum(d, 0.0)
    if metric == "ip":
        return q @ b.T
    if metric == "hellinger":
        diff = np.sqrt(q)[:, None, :] - np.sqrt(b)[None, :, :]
        return np.sqrt(0.5 * (diff**2).sum(-1))
    diff = q[:, None, :] - b[None, :, :]  # exact near 1000 (Sterbenz), then one rounding
    if metric == "l2":
        return np.sqrt((diff**2).sum(-1))
    if metric == "sqeuclidean":
        return (diff**2).sum(-1)
    if metric == "l1":
        return np.abs(diff).sum(-1)
    if metric == "linf":
        return np.abs(diff).max(-1)
    raise ValueError(metric)


def k_nearest(d, k, metric, exclude_self=False):
    """(distances, ids) of the k best of each row of ``d``, ordered by (distance, id)."""
    key = -d if metric == "ip" else d.copy()
    if exclude_self:
        np.fill_diagonal(key, np.inf)
    ids = np.lexsort((np.broadcast_to(np.arange(d.shape[1]), d.shape), key), axis=1)[:, :k]
    return np.take_along_axis(d, ids, 1), ids


def assert_equal_to_the_brute_force(got, want, what):
    (dist, ids), (want_dist, want_ids) = got, want
    assert dist.dtype == np.float64, what
    np.testing.assert_array_equal(ids, want_ids, err_msg=what)
    np.testing.assert_allclose(dist, want_dist, rtol=1e-12, atol=0, err_msg=what)


@pytest.mark.parametrize("device", DEVICES)
def test_points_closer_than_a_float32_step(device):
    # The case: in float32 every point equals the query.
    base = np.array([[1.0], [1 + 1e-9], [1 + 2e-9], [1 - 3e-9]])
    query = np.array([[1 + 2.1e-9]])
    for dist, ids in [
        knn.Index(base, device=device).search(query, 4),
        knn.search(base, query, 4, device=device),
        knn.search(base.tolist(), query.tolist(), 4, device=device),  # lists of Python floats
    ]:
        assert dist.dtype == np.float64 and ids.dtype == np.int64
        np.testing.assert_array_equal(ids, [[2, 1, 0, 3]])
        np.testing.assert_allclose(dist, [[1e-10, 1.1e-9, 2.1e-9, 5.1e-9]], rtol=0, atol=1e-15)


def jitter(rng, n, d, scale=1000.0):
    """Points near (scale, ..., scale) closer together than a float32 step there (6.1e-5 at
    1000): every coordinate rounds to ``scale`` in float32, only float64 tells them apart."""
    return scale + 2e-5 * rng.random((n, d))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("metric", METRICS)
def test_every_metric_equals_a_float64_brute_force_below_a_float32_step(rng, metric, device):
    d, k = 5, 7
    base = jitter(rng, 400, d)
    assert (base.astype(np.float32) == np.float32(1000)).all()  # float32 sees one point
    if metric == "cosine":
        # near-parallel points are at cosine distance ~1e-20, below float64's resolution of
        # 1 - cos: queries in other directions, whose distances differ by ~1e-10
        queries = 1000 * rng.random((30, d))
    else:
        queries = jitter(rng, 30, d)
    index = knn.Index(base, metric, device=device)
    got = index.search(queries, k)
    assert_equal_to_the_brute_force(got, k_nearest(brute_force(base, queries, metric), k, metric), metric)
    assert_equal_to_the_brute_force(
        knn.search(base, queries, k, metric, device=device),
        k_nearest(brute_force(base, queries, metric), k, metric), f"{metric}, knn.search",
    )
    if metric != "cosine":  # (cosine: the base is near-parallel, see above)
        want = k_nearest(brute_force(base, base, metric), k, metric, exclude_self=True)
        for symmetric in ("on", "off"):
            assert_equal_to_the_brute_force(index.graph(k, symmetric), want, f"{metric} graph {symmetric}")
        assert_equal_to_the_brute_force(knn.graph(base, k, metric, device=device), want, f"{metric} knn.graph")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("metric", ["l2", "l1", "cosine"])
def test_float32_queries_against_a_float64_base(rng, metric, device):
    """Exact for the float64 base (and the float32 values of the queries); float32 distances."""
    base = rng.random((500, 6))
    queries = rng.random((40, 6)).astype(np.float32)
    dist, ids = knn.Index(base, metric, device=device).search(queries, 5)
    assert dist.dtype == np.float32 and ids.dtype == np.int64
    want_dist, want_ids = k_nearest(brute_force(base, queries, metric), 5, metric)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(dist, want_dist, rtol=1e-6, atol=1e-7)


def test_float64_queries_against_a_float32_base(rng):
    """Exact for the float64 queries (and the float32 base); float64 distances."""
    base = rng.random((500, 6)).astype(np.float32)
    queries = rng.random((40, 6))
    dist, ids = knn.Index(base, device="cpu").search(queries, 5)
    assert_equal_to_the_brute_force((dist, ids), k_nearest(brute_force(base, queries, "l2"), 5, "l2"), "l2")
    # the float32 base's graph stays float32
    assert knn.Index(base, device="cpu").graph(3)[0].dtype == np.float32


def test_searches_in_pieces_number_rows_in_the_whole_set(rng):
    base = rng.random((20000, 64))
    queries = rng.random((6800, 64))  # two pieces on the CPU (about 6700 rows each)
    h = knn.Index(base, "hellinger", device="cpu")
    queries[6790, 7] = -1.0  # in the second piece
    with pytest.raises(ValueError, match="queries: row 6790, column 7 is -1"):
        h.search(queries, 2)
    queries[6790, 7] = np.nan  # (checked before any piece)
    with pytest.raises(ValueError, match="queries: row 6790, column 7 is NaN"):
        h.search(queries, 2)
    queries[6790, 7] = 0.5
    index = knn.Index(base, device="cpu")
    dist, ids = index.search(queries, 2)
    assert dist.dtype == np.float64 and ids.shape == (6800, 2)
    for rows in (slice(0, 10), slice(6780, 6800)):  # both pieces
        want = k_nearest(brute_force(base, queries[rows], "l2"), 2, "l2")
        assert_equal_to_the_brute_force((dist[rows], ids[rows]), want, f"rows {rows}")


def test_added_float64_rows_stay_exact(rng):
    base = np.array([[1.0], [5.0]])
    for start in (base, base.astype(np.float32)):  # a float32 index becomes a float64 one
        index = knn.Index(start, device="cpu")
        index.add(np.array([[3 + 1e-9], [3 - 2e-9]]))
        dist, ids = index.search(np.array([[3.0]]), 4)
        np.testing.assert_array_equal(ids, [[2, 3, 0, 1]])
        np.testing.assert_allclose(dist, [[1e-9, 2e-9, 2, 2]], rtol=1e-12, atol=1e-15)
        assert index._native.rows().dtype == np.float64
        gd, gi = index.graph(1)
        assert gd.dtype == np.float64
        np.testing.assert_array_equal(gi[:, 0], [3, 2, 3, 2])
        np.testing.assert_allclose(gd[:, 0], [2 - 2e-9, 2 - 1e-9, 3e-9, 3e-9], rtol=1e-12, atol=1e-15)
        # pickling keeps the float64 rows, and so the answers
        again = pickle.loads(pickle.dumps(index))
        np.testing.assert_array_equal(again._native.rows(), index._native.rows())
        for a, b in [(again.search(np.array([[3.0]]), 4), (dist, ids)), (again.graph(1), (gd, gi))]:
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    # float32 rows added to a float64 index: widened exactly, the index stays float64
    index = knn.Index(base, device="cpu")
    index.add(np.array([[2.5]], np.float32))
    assert index._native.rows().dtype == np.float64 and index.graph(1)[0].dtype == np.float64


def test_a_c_contiguous_float64_base_is_not_copied(rng):
    import sys

    base = rng.random((1000, 8))
    held = sys.getrefcount(base)
    index = knn.Index(base, device="cpu")
    assert index._native.shares_rows and sys.getrefcount(base) == held + 1  # the array itself
    del index
    assert sys.getrefcount(base) == held


@pytest.mark.parametrize("metric,options", [("mahalanobis", {}), ("l2", {"metric_expr": "acc + abs(x - y)"})])
def test_mahalanobis_and_expressions_refuse_float64_naming_float32(rng, metric, options):
    base = rng.random((50, 3))
    with pytest.raises(ValueError, match="takes float32 values.*convert the data to float32"):
        knn.Index(base, metric, device="cpu", **options)
    with pytest.raises(ValueError, match="float32"):
        knn.Index(base.tolist(), metric, device="cpu", **options)  # lists of floats are float64
    index = knn.Index(base.astype(np.float32), metric, device="cpu", **options)
    dist, _ = index.search(base[:4].astype(np.float32), 3)
    assert dist.dtype == np.float32
    with pytest.raises(ValueError, match="float32"):
        index.search(base[:4], 3)  # float64 queries
    with pytest.raises(ValueError, match="float32"):
        index.add(base[:4])  # float64 rows
    assert len(index) == 50  # (the failed add left the index as it was)


@pytest.mark.parametrize("device", DEVICES)
def test_cosine_all_zero_rows_are_at_distance_1_as_in_sklearn(rng, device):
    cosine_distances = pytest.importorskip("sklearn.metrics.pairwise").cosine_distances
    base = rng.uniform(-1, 1, (40, 4))
    base[[7, 20]] = 0.0
    queries = np.vstack([np.zeros((1, 4)), base[3], rng.uniform(-1, 1, (5, 4))])
    for dtype in (np.float64, np.float32):
        b, q = base.astype(dtype), queries.astype(dtype)
        dist, ids = knn.Index(b, "cosine", device=device).search(q, 40)
        want = cosine_distances(q.astype(np.float64), b.astype(np.float64))
        assert (want[0] == 1).all() and (want[:, [7, 20]] == 1).all()
        # the zero query: every row at distance 1, so ids in order
        np.testing.assert_array_equal(dist[0], np.ones(40))
        np.testing.assert_array_equal(ids[0], np.arange(40))
        want_dist, want_ids = k_nearest(want, 40, "cosine")
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(dist, want_dist, rtol=0, atol=1e-12 if dtype == np.float64 else 1e-6)
        # the zero rows of the base are at exactly 1 from every query
        for r in range(len(q)):
            np.testing.assert_array_equal(dist[r][np.isin(ids[r], [7, 20])], [1.0, 1.0])
        # the graph: the zero rows at 1 from every other row
        gd, gi = knn.graph(b, 3, "cosine", device=device)
        np.testing.assert_array_equal(gd[7], np.ones(3))
        np.testing.assert_array_equal(gi[7], [0, 1, 2])
