"""The native module (PyO3); use the `knn` package's API instead."""

from typing import Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

# float32 or float64, C-contiguous and aligned (the package converts every input so).
Rows = Union[npt.NDArray[np.float32], npt.NDArray[np.float64]]
# In the queries' precision (a graph: the base's).
Distances = Union[npt.NDArray[np.float32], npt.NDArray[np.float64]]

class NativeIndex:
    def __init__(
        self,
        data: Rows,
        metric: str = "l2",
        device: str = "auto",
        metric_expr: Optional[str] = None,
        covariance: Optional[npt.NDArray[np.float32]] = None,
        gpu_memory: Optional[int] = None,
        threads: Optional[int] = None,
        symmetric: str = "auto",
    ) -> None: ...
    def search(self, queries: Rows, k: int) -> Tuple[Distances, npt.NDArray[np.int64]]: ...
    def check_search(self, dim: int, k: int) -> None: ...
    def exact_keys(
        self, queries: Rows, ids: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]: ...
    def search_device(
        self,
        queries: int,
        rows: int,
        device: int,
        stream: int,
        k: int,
        ids: int,
        distances: int,
        ids_i64: bool = True,
    ) -> None: ...
    def device_results(
        self, device: int, rows: int, k: int, ids_i64: bool
    ) -> Tuple[DeviceArray, DeviceArray]: ...
    def graph(
        self, k: int, symmetric: str = "auto"
    ) -> Tuple[Distances, npt.NDArray[np.int64]]: ...
    def graph_device(
        self,
        k: int,
        symmetric: str,
        device: int,
        stream: int,
        ids: int,
        distances: int,
        ids_i64: bool = True,
        keep: Optional[object] = None,
    ) -> None: ...
    def add(self, data: Rows) -> None: ...
    def rows(self) -> Rows: ...
    def __len__(self) -> int: ...
    dim: int
    metric: str
    device: str
    nbytes: int
    shares_rows: bool
    float64: bool

class DeviceArray:
    """Results in GPU memory of the native layer's, handed over through DLPack."""

    ptr: int
    def __dlpack__(
        self,
        *,
        stream: Optional[object] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> object: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...

class CapsuleRows:
    """The 2-D array a DLPack capsule describes."""

    ptr: int
    rows: int
    cols: int
    device: Tuple[int, int]
    dtype: str

def dlpack_rows(capsule: object) -> CapsuleRows: ...
def devices() -> list[tuple[int, str]]: ...
def gpu_status() -> str: ...
def merge_partials(
    k: int,
    parts: list[Tuple[Distances, npt.NDArray[np.int64], npt.NDArray[np.float64]]],
) -> Tuple[Distances, npt.NDArray[np.int64], npt.NDArray[np.float64]]: ...
