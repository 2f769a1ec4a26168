"""Type stubs of the `knn` package (see help(knn.Index) for the arguments)."""

from typing import Any, Literal, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt


__version__: str

ArrayLike = Union[npt.ArrayLike, Sequence[Sequence[float]]]
# float64 for float64 queries (a graph: a float64 base), float32 for float32 ones.
Distances = Union[npt.NDArray[np.float64], npt.NDArray[np.float32]]
Ids = npt.NDArray[np.int64]
Symmetric = Union[Literal["auto", "on", "off"], bool]

class Index:
    def __init__(
        self,
        data: ArrayLike,
        metric: str = "l2",
        device: str = "auto",
        *,
        metric_expr: Optional[str] = None,
        covariance: Optional[ArrayLike] = None,
        gpu_memory: Union[int, str, None] = None,
        threads: Optional[int] = None,
    ) -> None: ...
    # (PyTorch CUDA tensors and CuPy arrays as queries give results of their own library.)
    def search(self, queries: ArrayLike, k: int) -> Tuple[Distances, Ids]: ...
    # (An index built from a PyTorch CUDA tensor or a CuPy array gives results of that library.)
    def graph(self, k: int, symmetric: Symmetric = "auto") -> Tuple[Distances, Ids]: ...
    def exact_keys(self, queries: ArrayLike, ids: ArrayLike) -> npt.NDArray[np.float64]: ...
    def add(self, data: ArrayLike) -> None: ...
    def __len__(self) -> int: ...
    @property
    def dim(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def metric(self) -> str: ...
    @property
    def device(self) -> str: ...

def search(
    base: ArrayLike,
    queries: ArrayLike,
    k: int,
    metric: str = "l2",
    device: str = "auto",
    *,
    metric_expr: Optional[str] = None,
    covariance: Optional[ArrayLike] = None,
    gpu_memory: Union[int, str, None] = None,
    threads: Optional[int] = None,
) -> Tuple[Distances, Ids]: ...
@overload
def graph(
    points: ArrayLike,
    k: int,
    metric: str = "l2",
    device: str = "auto",
    *,
    symmetric: Symmetric = "auto",
    format: Literal["arrays"] = "arrays",
    metric_expr: Optional[str] = None,
    covariance: Optional[ArrayLike] = None,
    gpu_memory: Union[int, str, None] = None,
    threads: Optional[int] = None,
) -> Tuple[Distances, Ids]: ...
@overload
def graph(
    points: ArrayLike,
    k: int,
    metric: str = "l2",
    device: str = "auto",
    *,
    symmetric: Symmetric = "auto",
    format: Literal["csr"],
    metric_expr: Optional[str] = None,
    covariance: Optional[ArrayLike] = None,
    gpu_memory: Union[int, str, None] = None,
    threads: Optional[int] = None,
) -> Any: ...  # scipy.sparse.csr_matrix
def devices() -> list[tuple[int, str]]: ...
def gpu_status() -> str: ...
