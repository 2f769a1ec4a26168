"""scikit-learn estimators on the exact engine: swap one import line, keep the pipeline.

``from knn.sklearn import KNeighborsClassifier`` instead of
``from sklearn.neighbors import KNeighborsClassifier``. The estimators take scikit-learn's
parameters (``n_neighbors``, ``weights``, ``metric``, ``p``, ``metric_params``, ``n_jobs``;
``algorithm`` and ``leaf_size`` are accepted and ignored: the search is always exact brute
force or the exact grid) plus ``device``, and give scikit-learn's results: the same neighbours
(among equal distances the smaller training index first), predictions, probabilities and
graphs.

Metrics: ``"minkowski"`` with ``p`` 1, 2 or inf, ``"euclidean"``, ``"manhattan"``,
``"cityblock"``, ``"chebyshev"``, ``"sqeuclidean"``, ``"cosine"``, ``"mahalanobis"``
(``metric_params={"VI": inv_cov}`` as in scikit-learn, or ``{"V": cov}``; estimated from the
training data without either), and this library's ``"hellinger"``; a distance of your own
with ``metric_params={"metric_expr": "..."}`` (see ``knn.Index``). Callable metrics and
``"precomputed"`` are not supported.

Precision: float32 input stays float32, everything else becomes float64 (as scikit-learn
does: lists, integers). float64 input is exact for its float64 values (the engines compute on
its float32 rounding, an exact float64 re-rank decides), and distances come back in the
queries' dtype, float64 for float64 input, as scikit-learn returns them (``kneighbors()``
without ``X``: the training data's dtype). ``"mahalanobis"`` and ``metric_params={"metric_expr":
...}`` take float32 data only: with float64 input (and so with lists and integers) ``fit``
and ``kneighbors`` raise a ``ValueError`` that says so; pass ``X.astype(np.float32)``.
Sparse input is refused.

Not covered: ``radius_neighbors``, ``sample_weight``.
"""

from __future__ import annotations

import numbers
import os

import numpy as np
from scipy.sparse import csr_matrix
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, TransformerMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

try:
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # scikit-learn < 1.6
    def _validate_data(estimator, *args, **kwargs):
        return estimator._validate_data(*args, **kwargs)

from ._index import Index

__all__ = [
    "NearestNeighbors",
    "KNeighborsClassifier",
    "KNeighborsRegressor",
    "KNeighborsTransformer",
]

_METRICS = {
    "euclidean": "l2", "l2": "l2", "manhattan": "l1", "cityblock": "l1", "l1": "l1",
    "chebyshev": "linf", "infinity": "linf", "linf": "linf", "sqeuclidean": "sqeuclidean",
    "cosine": "cosine", "mahalanobis": "mahalanobis", "hellinger": "hellinger",
}


def _engine_metric(metric, p, metric_params):
    """(metric name, Index keyword arguments) for scikit-learn's metric, p, metric_params."""
    params = dict(metric_params or {})
    if callable(metric) or not isinstance(metric, str):
        raise ValueError(f"metric={metric!r}: callable metrics are not supported; use a name")
    name = metric.lower()
    if "metric_expr" in params:
        return "l2", {"metric_expr": params.pop("metric_expr")}
    if name == "minkowski":
        p = params.pop("p", p)
        if p == 2:
            return "l2", {}
        if p == 1:
            return "l1", {}
        if p == np.inf:
            return "linf", {}
        raise ValueError(f"minkowski p={p!r}: only p = 1, 2 or inf are supported")
    if name not in _METRICS:
        raise ValueError(
            f"metric={metric!r} is not supported (minkowski with p 1, 2 or inf, "
            + ", ".join(sorted(_METRICS)) + ")"
        )
    if name == "mahalanobis":
        if "V" in params:
            return "mahalanobis", {"covariance": np.asarray(params["V"], dtype=np.float64)}
        if "VI" in params:
            return "mahalanobis", {"covariance": np.linalg.inv(np.asarray(params["VI"], float))}
    return _METRICS[name], {}


def _threads(n_jobs):
    """CPU threads for scikit-learn's ``n_jobs`` (None or -1: every core)."""
    if n_jobs is None or n_jobs == -1:
        return None
    if not isinstance(n_jobs, numbers.Integral) or n_jobs == 0:
        raise ValueError(f"n_jobs={n_jobs!r}: expected None, -1 or a non-zero integer")
    if n_jobs > 0:
        return int(n_jobs)
    return max(1, (os.cpu_count() or 1) + 1 + int(n_jobs))


class _Neighbors(BaseEstimator):
    """What every estimator here shares: fit builds a ``knn.Index``, kneighbors searches it."""

    def __init__(
        self, n_neighbors=5, *, algorithm="auto", leaf_size=30, metric="minkowski", p=2,
        metric_params=None, n_jobs=None, device="auto",
    ):
        self.n_neighbors = n_neighbors
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device

    def _fit(self, X, y=None, **y_checks):
        if not isinstance(self.n_neighbors, numbers.Integral) or isinstance(self.n_neighbors, bool) or self.n_neighbors < 1:
            raise ValueError(f"n_neighbors must be a positive integer, got {self.n_neighbors!r}")
        if y is None:
            X = _validate_data(self, X, dtype=[np.float64, np.float32], order="C")
        else:
            X, y = _validate_data(self, X, y, dtype=[np.float64, np.float32], order="C", **y_checks)
        name, extra = _engine_metric(self.metric, self.p, self.metric_params)
        self._index = Index(X, name, self.device, threads=_threads(self.n_jobs), **extra)
        # scikit-learn's names: minkowski with p 1, 2 or inf is manhattan, euclidean, chebyshev
        self.effective_metric_ = (
            "expr" if "metric_expr" in extra
            else {"l2": "euclidean", "l1": "manhattan", "linf": "chebyshev"}.get(name, name)
        )
        self.effective_metric_params_ = dict(self.metric_params or {})
        self.n_samples_fit_ = X.shape[0]
        self._fit_dtype = X.dtype
        return X, y

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        """The k nearest training points of each query.

        Parameters
        ----------
        X : array_like of shape (n_queries, n_features), default None
            Queries. None: the training points, each without itself (its own index left out;
            duplicates of it still count, at distance 0), as scikit-learn does.
        n_neighbors : int, default ``self.n_neighbors``
        return_distance : bool, default True

        Returns
        -------
        neigh_dist : ndarray of shape (n_queries, n_neighbors)
            Distances, ascending, in the queries' dtype (float64 for float64 input, exact for
            its values; ``X=None``: the training data's dtype). Only with ``return_distance``.
        neigh_ind : ndarray of int64, shape (n_queries, n_neighbors)
            Indices of the neighbours in the training data.
        """
        check_is_fitted(self)
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"Expected n_neighbors > 0. Got {k!r}")
        k = int(k)
        if X is None:
            if k >= self.n_samples_fit_:
                raise ValueError(
                    "Expected n_neighbors < n_samples_fit when X is None (each point is "
                    f"left out of its own list), but n_neighbors = {k}, "
                    f"n_samples_fit = {self.n_samples_fit_}"
                )
            dist, ind = self._index.graph(k)
            dtype = self._fit_dtype
        else:
            X = _validate_data(self, X, dtype=[np.float64, np.float32], order="C", reset=False)
            if k > self.n_samples_fit_:
                raise ValueError(
                    "Expected n_neighbors <= n_samples_fit, but "
                    f"n_neighbors = {k}, n_samples_fit = {self.n_samples_fit_}, "
                    f"n_samples = {X.shape[0]}"
                )
            dist, ind = self._index.search(X, k)
            dtype = X.dtype
        if return_distance:
            return dist.astype(dtype, copy=False), ind
        return ind

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """The k-neighbours graph of the queries as a CSR matrix (n_queries, n_samples_fit).

        Parameters
        ----------
        X : array_like of shape (n_queries, n_features), default None
            None: the training points, each without itself.
        n_neighbors : int, default ``self.n_neighbors``
        mode : {"connectivity", "distance"}, default "connectivity"
            Ones, or the distances, as stored entries.
        """
        if mode not in ("connectivity", "distance"):
            raise ValueError(
                f'Unsupported mode, must be one of "connectivity", or "distance" but got "{mode}" instead'
            )
        dist, ind = self.kneighbors(X, n_neighbors, return_distance=True)
        values = np.ones(ind.size, dtype=np.float64) if mode == "connectivity" else dist.ravel()
        rows = ind.shape[0]
        indptr = np.arange(0, ind.size + 1, ind.shape[1] if rows else 1, dtype=np.int64)[: rows + 1]
        return csr_matrix((values, ind.ravel(), indptr), shape=(rows, self.n_samples_fit_))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = False
        tags.input_tags.positive_only = self.metric == "hellinger"
        return tags


class NearestNeighbors(_Neighbors):
    """Unsupervised exact nearest neighbours: scikit-learn's ``NearestNeighbors``.

    Parameters
    ----------
    n_neighbors : int, default 5
        Neighbours per query for :meth:`kneighbors`.
    algorithm, leaf_size
        Accepted for compatibility and ignored: the search is always exact.
    metric : str, default "minkowski"
        See the module's documentation for the metrics.
    p : float, default 2
        Minkowski power: 1, 2 or inf.
    metric_params : dict, optional
        ``{"VI": ...}`` or ``{"V": ...}`` for Mahalanobis, ``{"metric_expr": "..."}``.
    n_jobs : int, optional
        CPU threads; None or -1: every core.
    device : str, default "auto"
        ``"auto"`` (a GPU when usable, else the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
        or several GPUs: ``"cuda:0,1"``, ``"cuda:all"``.
    """

    def fit(self, X, y=None):
        """Index the training points ``X`` (n_samples, n_features)."""
        self._fit(X)
        return self


class _Supervised(_Neighbors):
    def __init__(
        self, n_neighbors=5, *, weights="uniform", algorithm="auto", leaf_size=30, p=2,
        metric="minkowski", metric_params=None, n_jobs=None, device="auto",
    ):
        super().__init__(
            n_neighbors, algorithm=algorithm, leaf_size=leaf_size, metric=metric, p=p,
            metric_params=metric_params, n_jobs=n_jobs, device=device,
        )
        self.weights = weights

    def _weights(self, dist):
        """Neighbour weights as scikit-learn computes them (None for uniform)."""
        if self.weights in (None, "uniform"):
            return None
        if self.weights == "distance":
            with np.errstate(divide="ignore"):
                w = 1.0 / dist
            exact = np.isinf(w)
            rows = exact.any(axis=1)
            w[rows] = exact[rows]  # a query on a training point takes that point's vote only
            return w
        if callable(self.weights):
            return self.weights(dist)
        raise ValueError(
            f"weights not recognized: should be 'uniform', 'distance', or a callable function, got {self.weights!r}"
        )


class KNeighborsClassifier(ClassifierMixin, _Supervised):
    """Exact k-nearest-neighbour classification: scikit-learn's ``KNeighborsClassifier``.

    Parameters
    ----------
    n_neighbors : int, default 5
    weights : {"uniform", "distance"} or callable, default "uniform"
        Votes: equal, 1 / distance (a query on a training point takes that point's vote), or
        a function of the distance array returning weights of the same shape.
    algorithm, leaf_size, p, metric, metric_params, n_jobs, device
        As for :class:`NearestNeighbors`.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The labels, sorted (any labels NumPy sorts: ints, strings).
    n_features_in_, n_samples_fit_, effective_metric_, effective_metric_params_
    """

    def fit(self, X, y):
        """Index ``X`` (n_samples, n_features) with labels ``y`` (n_samples,)."""
        _, y = self._fit(X, y)
        check_classification_targets(y)
        self.classes_, self._y = np.unique(y, return_inverse=True)
        self._y = self._y.ravel()
        self.outputs_2d_ = False
        return self

    def predict_proba(self, X):
        """Class probabilities (n_queries, n_classes), columns in ``classes_`` order."""
        check_is_fitted(self)
        dist, ind = self.kneighbors(X)
        w = self._weights(dist)
        labels = self._y[ind]
        proba = np.zeros((ind.shape[0], len(self.classes_)), dtype=np.float64)
        rows = np.repeat(np.arange(ind.shape[0]), ind.shape[1])
        np.add.at(proba, (rows, labels.ravel()), 1.0 if w is None else w.ravel())
        total = proba.sum(axis=1, keepdims=True)
        total[total == 0.0] = 1.0
        return proba / total

    def predict(self, X):
        """The most voted class of each query (ties: the first in ``classes_``)."""
        check_is_fitted(self)
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = False
        return tags


class KNeighborsRegressor(RegressorMixin, _Supervised):
    """Exact k-nearest-neighbour regression: scikit-learn's ``KNeighborsRegressor``.

    Parameters
    ----------
    n_neighbors : int, default 5
    weights : {"uniform", "distance"} or callable, default "uniform"
        Mean, 1 / distance weighted mean, or weights from a function of the distances.
    algorithm, leaf_size, p, metric, metric_params, n_jobs, device
        As for :class:`NearestNeighbors`.
    """

    def fit(self, X, y):
        """Index ``X`` (n_samples, n_features) with targets ``y`` (n_samples,) or (n_samples, n_outputs)."""
        _, y = self._fit(X, y, multi_output=True, y_numeric=True)
        self._y = np.asarray(y)
        return self

    def predict(self, X):
        """The (weighted) mean target of each query's neighbours."""
        check_is_fitted(self)
        dist, ind = self.kneighbors(X)
        w = self._weights(dist)
        y = self._y[ind]  # (n_queries, k) or (n_queries, k, n_outputs)
        if w is None:
            return y.mean(axis=1)
        if y.ndim == 3:
            w = w[:, :, None]
        return (y * w).sum(axis=1) / w.sum(axis=1)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


class KNeighborsTransformer(TransformerMixin, _Neighbors):
    """The k-neighbours graph as a sparse matrix: scikit-learn's ``KNeighborsTransformer``.

    ``transform(X)`` is ``kneighbors_graph(X, n_neighbors + 1, mode)`` in ``"distance"`` mode
    (each training point then finds itself too, as scikit-learn does), ``n_neighbors`` in
    ``"connectivity"`` mode.

    Parameters
    ----------
    mode : {"distance", "connectivity"}, default "distance"
    n_neighbors : int, default 5
    algorithm, leaf_size, metric, p, metric_params, n_jobs, device
        As for :class:`NearestNeighbors`.
    """

    def __init__(
        self, *, mode="distance", n_neighbors=5, algorithm="auto", leaf_size=30,
        metric="minkowski", p=2, metric_params=None, n_jobs=None, device="auto",
    ):
        super().__init__(
            n_neighbors, algorithm=algorithm, leaf_size=leaf_size, metric=metric, p=p,
            metric_params=metric_params, n_jobs=n_jobs, device=device,
        )
        self.mode = mode

    def fit(self, X, y=None):
        """Index the training points ``X``."""
        self._fit(X)
        self._n_features_out = self.n_samples_fit_
        return self

    def transform(self, X):
        """The graph of ``X`` against the training points, CSR (n_queries, n_samples_fit)."""
        check_is_fitted(self)
        add_one = self.mode == "distance"
        return self.kneighbors_graph(X, mode=self.mode, n_neighbors=self.n_neighbors + add_one)

    def fit_transform(self, X, y=None):
        """``fit(X).transform(X)``."""
        return self.fit(X).transform(X)
