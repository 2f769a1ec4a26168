"""Inputs as the native code takes them: 2-D, C-contiguous float32 or float64 NumPy arrays."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_RESHAPE_HINT = (
    "Reshape your data either using array.reshape(-1, 1) if your data has a single "
    "feature or array.reshape(1, -1) if it contains a single sample."
)


def precision(dtype) -> type:
    """The precision the engine keeps for input of ``dtype``: ``np.float64`` for floating types
    wider than float32 (float64 itself; longdouble is rounded to it) and for Python objects
    (which NumPy makes float64), ``np.float32`` for every other real type."""
    dtype = np.dtype(dtype)
    if dtype.kind == "O" or (dtype.kind == "f" and dtype.itemsize > 4):
        return np.float64
    return np.float32


def as_matrix(x, what: str, *, keep_float64: bool = True) -> np.ndarray:
    """``x`` as a 2-D aligned C-contiguous float64 or float32 array (see :func:`precision`),
    without a copy when it already is one.

    Accepts NumPy arrays of any real dtype and memory order, nested lists (Python floats are
    float64, so a list of floats stays float64), and objects NumPy converts (PyTorch CPU
    tensors, array-likes, host arrays through DLPack); PyTorch, CuPy and JAX arrays in GPU
    memory are copied to the host. Refuses 1-D input with scikit-learn's hint. ``keep_float64=False``:
    always float32 (for parameters such as a covariance).
    """
    if cuda_library(x) is not None:
        x = to_host(x)
    if _is_torch_tensor(x):
        if x.device.type != "cpu":
            raise ValueError(
                f"{what}: a {x.device.type} tensor; only CPU and CUDA tensors are taken "
                "(use tensor.cpu())"
            )
        x = x.detach().numpy()
    elif not isinstance(x, np.ndarray) and hasattr(x, "__dlpack_device__"):
        x = _from_dlpack(x, what)
    try:
        a = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: not an array of numbers ({e})") from None
    if a.dtype.kind not in "biuf":
        if a.dtype.kind == "O":
            try:
                a = a.astype(np.float64)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{what}: not an array of numbers ({e})") from None
        else:
            raise ValueError(
                f"{what}: dtype {a.dtype} is not a real number type "
                "(use integers, float32 or float64)"
            )
    if a.ndim == 1:
        raise ValueError(
            f"{what}: expected 2D array, got 1D array instead:\narray={a}.\n{_RESHAPE_HINT}"
        )
    if a.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array (rows x dimension), got {a.ndim}-D")
    dtype = precision(a.dtype) if keep_float64 else np.float32
    if dtype is np.float32 and a.dtype.kind == "f" and a.dtype.itemsize > 4:
        big = np.abs(a) > np.finfo(np.float32).max
        if np.any(big & np.isfinite(a)):
            row, col = np.argwhere(big & np.isfinite(a))[0]
            raise ValueError(
                f"{what}: row {row}, column {col} is {float(a[row, col])!r}, beyond the "
                "float32 range it is used in"
            )
    return _contiguous(a, dtype)


# Copies from this size on are made on several threads (see `_contiguous`).
_THREADED_COPY_BYTES = 32 << 20
# Rows per piece of a threaded copy: about this many bytes of output.
_COPY_PIECE_BYTES = 8 << 20


def _contiguous(a: np.ndarray, dtype, piece_bytes: int = _COPY_PIECE_BYTES) -> np.ndarray:
    """``a`` as an aligned C-contiguous 2-D array of ``dtype``: ``a`` itself when it is one,
    else a copy (values cast as ``np.require`` casts them).

    A large copy is made in pieces of rows on several threads (NumPy releases the GIL while it
    copies). Such copies are common: a Fortran-order or strided array, float64 data kept in
    float32, and the chunks a Dask worker receives, which sit at any byte offset of their
    message, so that float32 rows are often misaligned: a 512 MB chunk took 150 ms to copy on
    one thread, which was most of building its GPU index (70 ms)."""
    if a.dtype == dtype and a.flags.c_contiguous and a.flags.aligned:
        return a
    rows, dim = a.shape
    row_bytes = dim * np.dtype(dtype).itemsize
    threads = min(os.cpu_count() or 1, 16)
    if rows * row_bytes < _THREADED_COPY_BYTES or threads < 2:
        return np.require(a, dtype, ["C_CONTIGUOUS", "ALIGNED"])
    out = np.empty((rows, dim), dtype)
    step = max(1, piece_bytes // max(1, row_bytes))

    def piece(start):
        np.copyto(out[start:start + step], a[start:start + step], casting="unsafe")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(piece, range(0, rows, step)))
    return out


def _from_dlpack(x, what: str):
    """A host array of another library (JAX, CuPy's host arrays, ...) through DLPack, no copy."""
    device_type = int(x.__dlpack_device__()[0])
    if device_type not in (1, 3):  # kDLCPU, kDLCUDAHost
        raise ValueError(
            f"{what}: an array in device memory (DLPack device type {device_type}) of a library "
            "other than PyTorch, CuPy and JAX: copy it to the host first (np.asarray(a)), or "
            "pass a PyTorch tensor or CuPy array (torch.from_dlpack(a))"
        )
    try:
        return np.from_dlpack(x)
    except (TypeError, ValueError, RuntimeError, BufferError):
        return x  # left to np.asarray


def cuda_library(x) -> str | None:
    """``"torch"`` for a PyTorch tensor in GPU memory, ``"cupy"`` for a CuPy array, ``"jax"``
    for a JAX array on a CUDA GPU, else None."""
    if _is_torch_tensor(x):
        return "torch" if x.device.type == "cuda" else None
    t = type(x)
    if t.__module__.startswith("cupy") and t.__name__ == "ndarray":
        return "cupy"
    if _is_jax_array(x) and _KDL_CUDA in (d[0] for d in _jax_dlpack_devices(x)):
        return "jax"
    return None


def to_host(x):
    """A PyTorch, CuPy or JAX array in GPU memory copied to a NumPy array (after the work
    queued on its library's current stream, or once JAX computed it)."""
    lib = cuda_library(x)
    if lib == "torch":
        return x.detach().cpu().numpy()
    if lib == "jax":
        return np.asarray(x)
    return x.get()


# DLPack's device type of CUDA device memory.
_KDL_CUDA = 2


def _is_jax_array(x) -> bool:
    t = type(x)
    return t.__module__.startswith("jax") and hasattr(x, "__dlpack_device__") and hasattr(
        x, "devices"
    )


def _jax_dlpack_devices(x) -> list[tuple[int, int]]:
    """``(DLPack device type, id)`` of each device a JAX array lies on (several when sharded)."""
    devices = list(x.devices())
    if len(devices) == 1:
        return [tuple(int(v) for v in x.__dlpack_device__())]
    return [(_KDL_CUDA if d.platform == "gpu" else 1, d.local_hardware_id or 0) for d in devices]


def _jax_ordinal(x, what: str) -> int:
    """The CUDA ordinal of the one GPU a JAX array lies on; a sharded array is refused."""
    if len(x.devices()) != 1:
        raise ValueError(
            f"{what}: a JAX array sharded over {len(x.devices())} devices; gather it on one "
            "GPU first (jax.device_put(a, device))"
        )
    return int(x.__dlpack_device__()[1])


def _jax_x64() -> bool:
    """JAX's ``jax_enable_x64``: without it JAX has no int64 or float64 arrays (it makes them
    int32 and float32), so ids are given as int32."""
    import jax

    return bool(jax.config.jax_enable_x64)


def _jax_device(ordinal: int):
    """JAX's device for CUDA GPU ``ordinal`` of this process."""
    import jax

    for d in jax.devices():
        if d.platform == "gpu" and d.local_hardware_id == ordinal:
            return d
    raise ValueError(f"JAX has no device for cuda:{ordinal}")


def _torch_stream(torch, device: int) -> int:
    """PyTorch's current stream on GPU ``device`` as a ``CUstream`` address. Its raw form
    (used by PyTorch's own compiler) when there is one: ``torch.cuda.current_stream`` makes a
    ``Stream`` object, 15 µs of a search that takes 0.4 ms."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


class CudaRows:
    """Rows in GPU memory as the native code reads them: a 2-D C-contiguous float32 array of
    PyTorch, CuPy or JAX (converted on its device when it is not one), its address, device and
    the library's current stream there, and results made of the same library on the same
    device.

    ``float64`` is true for float64 input, which is not converted (the exact float64 search
    runs on the host: see :meth:`knn.Index.search`).

    JAX arrays are immutable and their computation is asynchronous: they are read once JAX
    computed them (``block_until_ready``), through the DLPack capsule kept here, and results
    are written into memory of the native layer's, which JAX then adopts
    (``jax.dlpack.from_dlpack``, no copy). Ids are int64 with ``jax_enable_x64``, else int32,
    JAX's own index type then."""

    def __init__(self, x, what: str, lib: str | None = None):
        self.lib = lib or cuda_library(x)
        if x.ndim == 1:
            raise ValueError(
                f"{what}: expected 2D array, got 1D array instead:\narray={x}.\n{_RESHAPE_HINT}"
            )
        if x.ndim != 2:
            raise ValueError(f"{what}: expected a 2-D array (rows x dimension), got {x.ndim}-D")
        self.capsule = None
        if self.lib == "jax":
            self._read_jax(x, what)
        elif self.lib == "torch":
            import torch

            # (A tensor that records gradients is read through a detached view.)
            t = x.detach() if x.requires_grad else x
            if t.dtype.is_complex or t.dtype == torch.bool:
                raise ValueError(
                    f"{what}: dtype {t.dtype} is not a real number type "
                    "(use integers, float32 or float64)"
                )
            self.float64 = t.dtype == torch.float64
            if not (self.float64 or (t.dtype == torch.float32 and t.is_contiguous())):
                t = t.to(torch.float32).contiguous()
            self.array, self.device = t, t.get_device()
            self.ptr = t.data_ptr()
            self.stream = _torch_stream(torch, self.device)
        else:
            import cupy

            with x.device:
                if x.dtype.kind not in "biuf":
                    raise ValueError(
                        f"{what}: dtype {x.dtype} is not a real number type "
                        "(use integers, float32 or float64)"
                    )
                self.float64 = x.dtype == cupy.float64
                kept = self.float64 or (x.dtype == cupy.float32 and x.flags.c_contiguous)
                a = x if kept else cupy.ascontiguousarray(x, dtype=cupy.float32)
                self.stream = cupy.cuda.get_current_stream().ptr
            self.array, self.device = a, a.device.id
            self.ptr = a.data.ptr
        self.rows, self.dim = self.array.shape

    def _read_jax(self, x, what: str):
        _jax_ordinal(x, what)
        if np.dtype(x.dtype).kind not in "biuf":
            raise ValueError(
                f"{what}: dtype {x.dtype} is not a real number type "
                "(use integers, float32 or float64)"
            )
        self.float64 = np.dtype(x.dtype) == np.float64
        a = x if (self.float64 or np.dtype(x.dtype) == np.float32) else x.astype(np.float32)
        self.array, self.device = a, int(a.__dlpack_device__()[1])
        self.stream, self.ptr = 0, 0
        if not self.float64 and a.size > 0:
            from . import _knn

            a.block_until_ready()
            self.capsule = a.__dlpack__()
            held = _knn.dlpack_rows(self.capsule)
            if (held.rows, held.cols, held.dtype) != (*a.shape, "float32"):
                raise ValueError(
                    f"{what}: JAX described the array as {held.rows} x {held.cols} "
                    f"{held.dtype}, not {a.shape[0]} x {a.shape[1]} float32"
                )
            self.ptr = held.ptr

    def host(self) -> np.ndarray:
        """The rows copied to the host (float64 ones stay float64)."""
        return to_host(self.array)

    def results(self, k: int, native=None) -> "DeviceResults":
        """Uninitialised results for ``k`` neighbours of every row, int64 ids (JAX without
        ``jax_enable_x64``: int32) and float32 distances, on the rows' device, made by their
        library (by ``native``, the index, for JAX)."""
        like = self.array if self.lib == "torch" else None
        return device_results((self.lib, self.device), self.rows, k, native, like)

    def wrap(self, a: np.ndarray):
        """A host array copied to the rows' device, in their library."""
        return to_gpu(a, (self.lib, self.device))


class DeviceResults:
    """Where a search in GPU memory writes: ids and distances of the rows' library (or, for
    JAX, memory of the native layer's that JAX adopts once written), their addresses, and
    whether the ids are int64 (else int32)."""

    def __init__(self, ids, distances, ids_ptr: int, distances_ptr: int, ids_i64: bool,
                 jax: bool = False):
        self.ids, self.distances = ids, distances
        self.ids_ptr, self.distances_ptr, self.ids_i64 = ids_ptr, distances_ptr, ids_i64
        self._jax = jax

    def arrays(self):
        """``(distances, ids)`` as arrays of the rows' library, once the search wrote them."""
        if self._jax:
            import jax.dlpack

            return jax.dlpack.from_dlpack(self.distances), jax.dlpack.from_dlpack(self.ids)
        return self.distances, self.ids


def device_results(
    home: tuple[str, int], rows: int, k: int, native, like=None
) -> "DeviceResults":
    """Uninitialised results for ``k`` neighbours of ``rows`` rows, int64 ids (JAX without
    ``jax_enable_x64``: int32) and float32 distances, on GPU ``home[1]``, made by library
    ``home[0]`` (by ``native``, the index, for JAX; PyTorch's as ``like``'s, a tensor on that
    GPU, when given: ``new_empty`` costs less than ``torch.empty``)."""
    lib, device = home
    shape = (rows, k)
    if lib == "torch":
        import torch

        if like is not None:
            new = like.new_empty
            ids, dists = new(shape, dtype=torch.int64), new(shape, dtype=torch.float32)
        else:
            ids = torch.empty(shape, dtype=torch.int64, device=f"cuda:{device}")
            dists = torch.empty(shape, dtype=torch.float32, device=f"cuda:{device}")
        return DeviceResults(ids, dists, ids.data_ptr(), dists.data_ptr(), True)
    if lib == "jax":
        ids_type = "int64" if _jax_x64() else "int32"
        if ids_type == "int32" and len(native) - 1 > np.iinfo(np.int32).max:
            raise ValueError(
                "ids beyond int32 need JAX's 64-bit types: "
                "jax.config.update('jax_enable_x64', True)"
            )
        if rows == 0:
            ids = to_gpu(np.empty(shape, np.int64), home)
            dists = to_gpu(np.empty(shape, np.float32), home)
            return DeviceResults(ids, dists, 0, 0, True)
        dists, ids = native.device_results(device, rows, k, ids_type == "int64")
        return DeviceResults(ids, dists, ids.ptr, dists.ptr, ids_type == "int64", jax=True)
    import cupy

    with cupy.cuda.Device(device):
        ids, dists = cupy.empty(shape, dtype=cupy.int64), cupy.empty(shape, dtype=cupy.float32)
    return DeviceResults(ids, dists, ids.data.ptr, dists.data.ptr, True)


def current_stream(home: tuple[str, int]) -> int:
    """Library ``home[0]``'s current stream on GPU ``home[1]`` as a ``CUstream`` address (0,
    the legacy default stream, for JAX, whose arrays are read once computed)."""
    lib, device = home
    if lib == "torch":
        import torch

        return _torch_stream(torch, device)
    if lib == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return cupy.cuda.get_current_stream().ptr
    return 0


def gpu_home(x) -> tuple[str, int] | None:
    """``(library, device ordinal)`` of a PyTorch tensor, CuPy array or JAX array in GPU
    memory, else None: where results computed from ``x`` go back to."""
    lib = cuda_library(x)
    if lib is None:
        return None
    if lib == "jax":
        return lib, _jax_ordinal(x, "base")
    return lib, (x.get_device() if lib == "torch" else x.device.id)


def to_gpu(a: np.ndarray, home: tuple[str, int]):
    """A host array copied to GPU ``home[1]`` as an array of library ``home[0]`` (after the
    work queued on that library's current stream there). For JAX without
    ``jax_enable_x64``, int64 ids become int32 and float64 values float32 (JAX's types then)."""
    lib, device = home
    if lib == "torch":
        import torch

        return torch.from_numpy(a).to(f"cuda:{device}")
    if lib == "jax":
        import jax

        if not _jax_x64() and a.dtype.itemsize == 8:
            if a.dtype.kind == "i" and a.size and a.max() > np.iinfo(np.int32).max:
                raise ValueError(
                    "ids beyond int32 need JAX's 64-bit types: "
                    "jax.config.update('jax_enable_x64', True)"
                )
            a = a.astype(np.int32 if a.dtype.kind == "i" else np.float32)
        return jax.device_put(a, _jax_device(device))
    import cupy

    with cupy.cuda.Device(device):
        return cupy.asarray(a)


def _is_torch_tensor(x) -> bool:
    t = type(x)
    return t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter")


def parse_bytes(size) -> int | None:
    """A byte count from an int or a string such as ``"2GiB"``, ``"512MiB"``, ``"1e9"``."""
    if size is None:
        return None
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        if size < 1:
            raise ValueError(f"gpu_memory={size}: a size must be at least 1 byte")
        return int(size)
    if not isinstance(size, str):
        raise TypeError(f"gpu_memory: expected bytes (int) or a string like '2GiB', not {size!r}")
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z]*)\s*", size)
    units = {
        "": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
        "t": 1e12, "tb": 1e12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    }
    if m is None or m.group(2).lower() not in units:
        raise ValueError(f"gpu_memory={size!r}: not a size (e.g. 2GiB, 512MiB, 1e9)")
    try:
        value = float(m.group(1)) * units[m.group(2).lower()]
    except ValueError:
        raise ValueError(f"gpu_memory={size!r}: not a size (e.g. 2GiB, 512MiB, 1e9)") from None
    if not value >= 1:
        raise ValueError(f"gpu_memory={size!r}: a size must be at least 1 byte")
    return int(value)


def as_k(k, what: str = "k") -> int:
    """``k`` as a positive int (bools and floats refused)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, not {k!r}")
    if k < 1:
        raise ValueError(f"{what} must be at least 1 (got {k})")
    return int(k)
