"""Exact k-nearest neighbours on CPUs and NVIDIA GPUs.

| task | call |
|---|---|
| build once, search many times | ``knn.Index(base).search(queries, k) -> (distances, ids)`` |
| one-off search | ``knn.search(base, queries, k)`` |
| kNN graph (own id excluded) | ``knn.Index(points).graph(k)``, ``knn.graph(points, k, format="csr")`` |
| scikit-learn estimators | ``knn.sklearn.NearestNeighbors``, ``KNeighborsClassifier``, ... |
| GPUs | ``knn.devices()``, ``knn.gpu_status()`` |

Every answer is exact: each row is a true k-nearest set, ordered by (distance, id), the same
on every device and thread count. See ``help(knn.Index)`` for every argument.
"""

from ._index import Index, graph, search
from ._knn import __version__, devices, gpu_status

__all__ = ["Index", "search", "graph", "devices", "gpu_status", "__version__"]
