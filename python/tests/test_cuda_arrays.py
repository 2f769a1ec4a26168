"""Queries in GPU memory (PyTorch CUDA tensors, CuPy arrays, JAX arrays): results of the same
library on the same device, equal to the NumPy path's, for the device's own path (float32,
l2/ip/l1/...) and the host's (float64, cosine, Hellinger, an index on the CPU); a stream of the
caller's; graphs of points in GPU memory; errors with the library's messages. Skipped without a
GPU or without the library. Also, on any machine: the DLPack capsule reader."""

import os

import numpy as np
import pytest

import knn
from knn import _knn

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
if GPU:
    # JAX takes 75 % of a GPU's memory at its first array unless told not to.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)  # float64 arrays, int64 ids (see below)
        HAS_JAX = any(d.platform == "gpu" for d in jax.devices())
    except Exception:  # pragma: no cover - no JAX, or a CPU-only JAX
        HAS_JAX = False
else:
    HAS_JAX = False

need_torch = pytest.mark.skipif(
    not (GPU and HAS_TORCH), reason="no usable GPU with PyTorch (SKIPPED; runs on the GPU machine)"
)
need_cupy = pytest.mark.skipif(
    not (GPU and HAS_CUPY), reason="no usable GPU with CuPy (SKIPPED; runs on the GPU machine)"
)
need_jax = pytest.mark.skipif(
    not HAS_JAX, reason="no usable GPU with JAX's CUDA backend (SKIPPED; runs on the GPU machine)"
)


def _to_torch(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _to_cupy(a):
    return cupy.asarray(a)


def _to_jax(a):
    return jax.device_put(a, jax.devices("gpu")[0])


def _is_jax(x):
    return HAS_JAX and isinstance(x, jax.Array)


def _host(x):
    if HAS_TORCH and isinstance(x, torch.Tensor):
        return x.cpu().numpy()
    if _is_jax(x):
        return np.asarray(x)
    return cupy.asnumpy(x)


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
    pytest.param(_to_jax, id="jax", marks=need_jax),
]


def _same_library_and_device(result, queries):
    if _is_jax(queries):
        assert _is_jax(result) and result.devices() == queries.devices()
        return
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
def test_queries_still_being_written_on_the_default_stream_are_waited_for(rng):
    """The library's device work runs on streams of its own: queries that PyTorch's default
    (legacy) stream is still writing are read only once that stream has written them."""
    base = rng.random((5000, 32)).astype(np.float32)
    queries = rng.random((600, 32)).astype(np.float32)
    index = knn.Index(base, device="cuda")
    want = index.search(queries, 9)
    written = torch.from_numpy(queries).cuda()
    q = torch.zeros_like(written)
    torch.cuda.synchronize()
    assert torch.cuda.current_stream().cuda_stream == 0  # the legacy default stream
    torch.cuda._sleep(20_000_000)  # the stream busy while the search is asked for
    q.copy_(written)
    d, i = index.search(q, 9)
    np.testing.assert_array_equal(i.cpu().numpy(), want[1])
    np.testing.assert_array_equal(d.cpu().numpy(), want[0])


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
@pytest.mark.parametrize("metric", ["hellinger", "l2", "sqeuclidean", "ip", "l1", "cosine"])
def test_a_graph_of_a_gpu_index_is_written_on_its_gpu(rng, to_gpu, metric):
    """An index of float32 points in GPU memory writes its graph where the results lie (the
    device's own path for all but cosine, the host's for cosine): the NumPy index's graph, in
    the points' library, on their device, again on a second call."""
    points = rng.random((3000, 32)).astype(np.float32)
    points[200:204] = points[7]  # duplicates: ties within and across rows
    want = knn.Index(points, metric, device="cuda").graph(25)
    p = to_gpu(points)
    index = knn.Index(p, metric, device="cuda")
    for _ in range(2):
        _same_answer_there(index.graph(25), want, p)
    with pytest.raises(ValueError, match="k=3000"):
        index.graph(3000)


@need_torch
def test_a_gpu_graph_follows_the_current_stream():
    """Results made on a side stream are written after the work queued there."""
    points = np.random.default_rng(5).random((10_000, 256)).astype(np.float32)
    want = knn.Index(points, "hellinger", device="cuda").graph(100)
    index = knn.Index(torch.from_numpy(points).cuda(), "hellinger", device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # the stream busy while the graph is asked for
        d, i = index.graph(100)
    side.synchronize()
    np.testing.assert_array_equal(i.cpu().numpy(), want[1])
    np.testing.assert_array_equal(d.cpu().numpy(), want[0])


@need_torch
def test_ctrl_c_during_a_large_gpu_graph_returns_at_once(ctrl_c):
    """A graph of more than a quarter of a second of kernels, written in GPU memory, is
    watched for Ctrl-C: `KeyboardInterrupt` comes before the graph is done, and the index
    gives the same graph afterwards."""
    import _thread
    import threading
    import time

    # L1 (no tensor cores): about a second of kernels on an H200.
    points = np.random.default_rng(9).random((300_000, 128)).astype(np.float32)
    index = knn.Index(torch.from_numpy(points).cuda(), "l1", device="cuda")
    d0, i0 = index.graph(10)
    torch.cuda.synchronize()
    start = time.perf_counter()
    index.graph(10)
    torch.cuda.synchronize()
    whole = time.perf_counter() - start
    timer = threading.Timer(0.05, _thread.interrupt_main)
    start = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        index.graph(10)
        time.sleep(5)  # (the KeyboardInterrupt would come later)
    timer.join()
    print(f"graph {whole:.2f} s, interrupted after {time.perf_counter() - start:.2f} s")
    if whole > 0.5:
        assert time.perf_counter() - start < whole, (time.perf_counter() - start, whole)
    d1, i1 = index.graph(10)
    assert torch.equal(i0, i1) and torch.equal(d0, d1)


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


@need_jax
def test_jax_without_x64_gives_int32_ids(rng):
    """JAX's default has no 64-bit types: ids come as int32 (JAX's index type then), from the
    device's own path and from the host's."""
    base = rng.random((4000, 24)).astype(np.float32)
    queries = rng.random((300, 24)).astype(np.float32)
    want_d, want_i = knn.Index(base, device="cuda").search(queries, 10)
    jax.config.update("jax_enable_x64", False)
    try:
        for index in (knn.Index(base, device="cuda"), knn.Index(base, "cosine", device="cuda")):
            d, i = index.search(_to_jax(queries), 10)
            assert i.dtype == jnp.int32 and d.dtype == jnp.float32
            if index.metric == "l2":
                np.testing.assert_array_equal(np.asarray(i), want_i)
                np.testing.assert_array_equal(np.asarray(d), want_d)
            else:
                np.testing.assert_array_equal(np.asarray(i), index.search(queries, 10)[1])
        gd, gi = knn.Index(_to_jax(base), device="cuda").graph(10)
        assert gi.dtype == jnp.int32 and gd.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(gi), knn.Index(base, device="cuda").graph(10)[1])
    finally:
        jax.config.update("jax_enable_x64", True)


@need_jax
def test_jax_results_outlive_the_index_and_are_freed(rng):
    """Results made by the native layer belong to JAX: they stay valid after the index goes,
    can be computed on, and many of them do not pile up in GPU memory."""
    base = rng.random((3000, 16)).astype(np.float32)
    q = _to_jax(rng.random((500, 16)).astype(np.float32))
    index = knn.Index(base, device="cuda")
    want = index.search(np.asarray(q), 8)
    d, i = index.search(q, 8)
    del index
    np.testing.assert_array_equal(np.asarray(i), want[1])
    assert float(jnp.sum(d)) == pytest.approx(float(want[0].astype(np.float64).sum()), rel=1e-5)
    index = knn.Index(base, device="cuda")
    big = _to_jax(rng.random((20000, 16)).astype(np.float32))
    for _ in range(3):
        index.search(big, 64)
    free = _free_memory()
    # 100 searches of 20000 x 64 results (15.4 MB each): 1.5 GB if nothing were freed. The
    # frees happen on a thread of the library's, shortly after each result goes.
    for _ in range(100):
        index.search(big, 64)
    assert np.asarray(index.search(q, 8)[1]).tolist() == want[1].tolist()
    if free is not None:
        import gc
        import time

        gc.collect()
        deadline = time.monotonic() + 5
        while free - _free_memory() > 500 << 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert free - _free_memory() <= 500 << 20


def _free_memory():
    """Free memory of the GPU JAX uses (bytes, as the driver counts it), or None."""
    if HAS_TORCH:
        return torch.cuda.mem_get_info(jax.devices("gpu")[0].local_hardware_id)[0]
    if HAS_CUPY:
        return cupy.cuda.runtime.memGetInfo()[0]
    return None


def test_dlpack_capsules_are_read_as_given():
    """The capsule reader behind JAX's queries, on NumPy's capsules (host memory, any machine):
    address, shape, type; refuses what the engine cannot read as one block of rows."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    r = _knn.dlpack_rows(a.__dlpack__())
    assert (r.ptr, r.rows, r.cols, r.device, r.dtype) == (a.ctypes.data, 3, 4, (1, 0), "float32")
    view = a[1:]  # an offset into the same memory
    assert _knn.dlpack_rows(view.__dlpack__()).ptr == a.ctypes.data + 16
    assert _knn.dlpack_rows(np.zeros((2, 3)).__dlpack__()).dtype == "float64"
    assert _knn.dlpack_rows(a[::2][:1].__dlpack__()).rows == 1  # one row: its stride is unused
    for strided in (a[:, ::2], a[::2]):
        with pytest.raises(ValueError, match="not C-contiguous"):
            _knn.dlpack_rows(strided.__dlpack__())
    with pytest.raises(ValueError, match="2-D"):
        _knn.dlpack_rows(a.ravel().__dlpack__())
    with pytest.raises(ValueError, match="DLPack capsule"):
        _knn.dlpack_rows(a)
