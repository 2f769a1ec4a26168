"""Queries in GPU memory (PyTorch CUDA tensors, CuPy arrays): results of the same library on
the same device, equal to the NumPy path's, for the device's own path (float32, l2/ip/l1/...)
and the host's (float64, cosine, Hellinger, an index on the CPU); a stream of the caller's;
graphs of points in GPU memory; errors with the library's messages. Skipped without a GPU, PyTorch or CuPy."""

import numpy as np
import pytest

import knn

try:
    import torch

    HAS_TORCH = torch.cuda.is_available()
except ImportError:  # pragma: no cover - depends on the machine
    HAS_TORCH = False
try:
    import cupy

    HAS_CUPY = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # pragma: no cover - no CuPy, or no driver
    HAS_CUPY = False

GPU = bool(knn.devices())
need_torch = pytest.mark.skipif(
    not (GPU and HAS_TORCH), reason="no usable GPU with PyTorch (SKIPPED; runs on the GPU machine)"
)
need_cupy = pytest.mark.skipif(
    not (GPU and HAS_CUPY), reason="no usable GPU with CuPy (SKIPPED; runs on the GPU machine)"
)


def _to_torch(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _to_cupy(a):
    return cupy.asarray(a)


def _host(x):
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else cupy.asnumpy(x)


def _same_answer_there(got, want, like):
    """`got` (distances, ids) are arrays of `like`'s library on its device, int64 ids,
    distances in `want`'s precision (float64 input: float64), equal to the NumPy `want`."""
    (d, i), (want_d, want_i) = got, want
    _same_library_and_device(d, like)
    _same_library_and_device(i, like)
    assert str(i.dtype).endswith("int64")
    assert _host(d).dtype == want_d.dtype
    np.testing.assert_array_equal(_host(i), want_i)
    np.testing.assert_array_equal(_host(d), want_d)


LIBS = [
    pytest.param(_to_torch, id="torch", marks=need_torch),
    pytest.param(_to_cupy, id="cupy", marks=need_cupy),
]


def _same_library_and_device(result, queries):
    assert type(result) is type(queries)
    if HAS_TORCH and isinstance(queries, torch.Tensor):
        assert result.device == queries.device
    else:
        assert result.device.id == queries.device.id


@pytest.mark.parametrize("to_gpu", LIBS)
@pytest.mark.parametrize("metric", ["l2", "sqeuclidean", "ip", "l1", "linf", "cosine", "hellinger"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_gpu_queries_give_the_numpy_answer(rng, to_gpu, metric, dtype):
    base = rng.random((3000, 20)).astype(np.float32)
    base[100:110] = base[5]  # duplicates: ties
    queries = rng.random((257, 20)).astype(dtype)
    queries[:3] = base[5]
    index = knn.Index(base, metric, device="cuda")
    want_d, want_i = index.search(queries, 12)
    q = to_gpu(queries)
    _same_answer_there(index.search(q, 12), (want_d, want_i), q)


@pytest.mark.parametrize("to_gpu", LIBS)
def test_tile_edges_and_large_k(rng, to_gpu):
    base = rng.random((20000, 64)).astype(np.float32)
    index = knn.Index(base, device="cuda")
    for n, k in [(1, 1), (127, 16), (128, 100), (129, 7), (1000, 1024)]:
        queries = rng.random((n, 64)).astype(np.float32)
        d, i = index.search(to_gpu(queries), k)
        want_d, want_i = index.search(queries, k)
        np.testing.assert_array_equal(_host(i), want_i)
        np.testing.assert_array_equal(_host(d), want_d)


@need_torch
def test_a_stream_of_the_callers_and_non_contiguous_tensors(rng):
    base = rng.random((5000, 32)).astype(np.float32)
    index = knn.Index(torch.from_numpy(base).cuda(), device="cuda")  # a CUDA base is copied
    queries = rng.random((600, 64)).astype(np.float32)
    want = index.search(np.ascontiguousarray(queries[:, ::2]), 9)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        q = torch.from_numpy(queries).cuda(non_blocking=True)[:, ::2] * 1.0
        d, i = index.search(q, 9)
        got = (d.cpu().numpy(), i.cpu().numpy())
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])


@need_torch
def test_an_index_on_the_cpu_returns_gpu_tensors(rng):
    base = rng.random((500, 8)).astype(np.float32)
    queries = rng.random((50, 8)).astype(np.float32)
    index = knn.Index(base, device="cpu")
    q = torch.from_numpy(queries).cuda()
    d, i = index.search(q, 4)
    assert d.is_cuda and i.is_cuda and i.dtype == torch.int64
    want = index.search(queries, 4)
    np.testing.assert_array_equal(i.cpu().numpy(), want[1])
    d, i = knn.search(base, q, 4, device="cpu")
    assert d.is_cuda


@pytest.mark.parametrize("to_gpu", LIBS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_graph_of_gpu_points_comes_back_in_their_library(rng, to_gpu, dtype):
    points = rng.random((1500, 12)).astype(dtype)
    points[200:204] = points[7]  # duplicates: ties within and across rows
    want_d, want_i = knn.graph(points, 9, device="cuda")
    p = to_gpu(points)
    for d, i in (
        knn.graph(p, 9, device="cuda"),
        knn.Index(p, device="cuda").graph(9, symmetric="off"),
        knn.Index(p, device="cpu").graph(9),
    ):
        _same_answer_there((d, i), (want_d, want_i), p)
    pytest.importorskip("scipy.sparse")
    csr = knn.graph(p, 9, device="cuda", format="csr")  # SciPy's, in host memory
    np.testing.assert_array_equal(csr.indices.reshape(-1, 9), want_i)
    np.testing.assert_array_equal(csr.data.reshape(-1, 9), want_d)


@pytest.mark.parametrize("to_gpu", LIBS)
def test_gpu_query_errors_are_the_librarys(rng, to_gpu):
    index = knn.Index(rng.random((300, 8)).astype(np.float32), device="cuda")
    queries = rng.random((40, 8)).astype(np.float32)
    queries[17, 3] = np.nan
    with pytest.raises(ValueError, match="queries: row 17, column 3 is NaN"):
        index.search(to_gpu(queries), 5)
    queries[17, 3] = 0.5
    with pytest.raises(ValueError, match="k=301"):
        index.search(to_gpu(queries), 301)
    with pytest.raises(ValueError, match="dimension|dim"):
        index.search(to_gpu(queries[:, :5]), 5)
    with pytest.raises(ValueError, match="reshape"):
        index.search(to_gpu(queries[0]), 5)
    big = np.tile(queries, (8, 1))  # 320 rows
    big[250, 1] = np.inf
    with pytest.raises(ValueError, match="row 250, column 1"):
        index.search(to_gpu(big), 5)
