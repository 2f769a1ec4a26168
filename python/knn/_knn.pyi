"""The native module (PyO3); use the `knn` package's API instead."""

from typing import Optional, Tuple

import numpy as np
import numpy.typing as npt

__version__: str

class NativeIndex:
    def __init__(
        self,
        data: npt.NDArray[np.float32],
        metric: str = "l2",
        device: str = "auto",
        metric_expr: Optional[str] = None,
        covariance: Optional[npt.NDArray[np.float32]] = None,
        gpu_memory: Optional[int] = None,
        threads: Optional[int] = None,
    ) -> None: ...
    def search(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]: ...
    def graph(
        self, k: int, symmetric: str = "auto"
    ) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]: ...
    def add(self, data: npt.NDArray[np.float32]) -> None: ...
    def rows(self) -> npt.NDArray[np.float32]: ...
    def __len__(self) -> int: ...
    dim: int
    metric: str
    device: str
    shares_rows: bool

def devices() -> list[tuple[int, str]]: ...
def gpu_status() -> str: ...
