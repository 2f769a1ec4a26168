"""knn.sklearn: scikit-learn's own estimator checks, and parity with its brute force."""

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")
from sklearn import datasets, neighbors  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from knn import sklearn as ks  # noqa: E402

ESTIMATORS = [
    ks.NearestNeighbors(device="cpu"),
    ks.KNeighborsClassifier(device="cpu"),
    ks.KNeighborsClassifier(weights="distance", device="cpu"),
    ks.KNeighborsRegressor(device="cpu"),
    ks.KNeighborsRegressor(weights="distance", device="cpu"),
    ks.KNeighborsTransformer(device="cpu"),
    ks.KNeighborsTransformer(mode="connectivity", device="cpu"),
]

# Checks we skip, with the reason (also listed in the README's Python section): none. Without
# pandas scikit-learn itself skips its `*_data_not_an_array` checks, and its array-API check
# without SCIPY_ARRAY_API.
SKIPPED = {}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=lambda est: SKIPPED)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def load(name):
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(X))
    test = order[: len(X) // 4]
    train = order[len(X) // 4:]
    return X[train], y[train], X[test]


DATASETS = ["digits", "iris", "wine", "breast_cancer"]


def tolerance(X, metric="euclidean"):
    """How far scikit-learn's float64 distances may be from ours, exact for the float64 input:
    its Euclidean form |x|^2 - 2 x.y + |y|^2 loses up to a few eps |x|^2 of a squared distance,
    so up to sqrt(eps) |x| near 0; its other metrics sum directly, off by a few eps of the
    points' L1 norms (cosine: of 1)."""
    eps = np.finfo(np.float64).eps
    scale = float(np.max(np.abs(X).sum(axis=1)))
    if metric == "euclidean":
        return 4 * np.sqrt(eps) * scale + 1e-12
    return 64 * eps * (1 + scale)


def tie_groups(dist, tol):
    """Group numbers of a sorted distance row: equal within ``tol``, same group."""
    return np.concatenate([[0], np.cumsum(np.diff(dist) > tol)])


def assert_same_neighbours(ours, theirs, ours_ind, theirs_ind, tol):
    """Distances equal within ``tol``; ids equal as sets within each group of equal distances,
    the last group (cut by k) exempt."""
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=tol)
    for r in range(ours.shape[0]):
        groups = tie_groups(theirs[r], tol)
        last = groups[-1]
        for g in range(last):
            assert set(ours_ind[r][groups == g]) == set(theirs_ind[r][groups == g]), (r, g)


def unambiguous_rows(X_fit, X, k, tol, metric="euclidean"):
    """Rows whose k nearest set is the same whatever order ties take (k-th < (k+1)-th)."""
    if X is None:
        d, _ = neighbors.NearestNeighbors(n_neighbors=k + 1, metric=metric, algorithm="brute").fit(X_fit).kneighbors()
    else:
        d, _ = neighbors.NearestNeighbors(n_neighbors=k + 1, metric=metric, algorithm="brute").fit(X_fit).kneighbors(X)
    if d.shape[1] <= k:
        return np.ones(d.shape[0], bool)
    return d[:, k] - d[:, k - 1] > 2 * tol


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "chebyshev", "cosine"])
@pytest.mark.parametrize("queries", ["given", "none"])
def test_kneighbors_and_graph_match_sklearn(name, metric, queries):
    X, _, Q = load(name)
    Q = Q if queries == "given" else None
    k = 6
    ours = ks.NearestNeighbors(n_neighbors=k, metric=metric, device="cpu").fit(X)
    theirs = neighbors.NearestNeighbors(n_neighbors=k, metric=metric, algorithm="brute").fit(X)
    d, i = ours.kneighbors(Q)
    D, I = theirs.kneighbors(Q)
    assert d.dtype == D.dtype and i.dtype == np.int64
    tol = tolerance(X, metric)
    assert_same_neighbours(d, D, i, I, tol)
    if Q is None:
        assert not (i == np.arange(len(X))[:, None]).any()
    ok = unambiguous_rows(X, Q, k, tol, metric)
    assert ok.mean() > (0.1 if metric == "chebyshev" else 0.3)  # L∞ on discrete data: many ties
    g = ours.kneighbors_graph(Q, mode="connectivity")
    G = theirs.kneighbors_graph(Q, mode="connectivity")
    assert g.shape == G.shape
    assert (g[ok] != G[ok]).nnz == 0
    gd = ours.kneighbors_graph(Q, mode="distance").toarray()[ok]
    GD = theirs.kneighbors_graph(Q, mode="distance").toarray()[ok]
    np.testing.assert_allclose(gd, GD, rtol=1e-6, atol=tol)


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("weights", ["uniform", "distance", lambda d: np.exp(-d)])
@pytest.mark.parametrize("k", [1, 5, 15])
def test_classifier_matches_sklearn(name, weights, k):
    X, y, Q = load(name)
    labels = np.array(["class-" + str(v) for v in y])  # string labels work as in sklearn
    ours = ks.KNeighborsClassifier(n_neighbors=k, weights=weights, device="cpu").fit(X, labels)
    theirs = neighbors.KNeighborsClassifier(n_neighbors=k, weights=weights, algorithm="brute").fit(X, labels)
    np.testing.assert_array_equal(ours.classes_, theirs.classes_)
    ok = unambiguous_rows(X, Q, k, tolerance(X))
    assert ok.mean() > 0.5
    p, P = ours.predict_proba(Q), theirs.predict_proba(Q)
    np.testing.assert_allclose(p[ok], P[ok], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(ours.predict(Q)[ok], theirs.predict(Q)[ok])
    assert abs(ours.score(Q, theirs.predict(Q)) - 1) < 0.05


@pytest.mark.parametrize("name", DATASETS + ["diabetes"])
@pytest.mark.parametrize("weights", ["uniform", "distance"])
def test_regressor_matches_sklearn(name, weights):
    X, y, Q = load(name)
    y = y.astype(float) + X[:, 0]  # a continuous target
    ours = ks.KNeighborsRegressor(n_neighbors=5, weights=weights, device="cpu").fit(X, y)
    theirs = neighbors.KNeighborsRegressor(n_neighbors=5, weights=weights, algorithm="brute").fit(X, y)
    ok = unambiguous_rows(X, Q, 5, tolerance(X))
    np.testing.assert_allclose(ours.predict(Q)[ok], theirs.predict(Q)[ok], rtol=1e-4, atol=1e-5)


def test_transformer_matches_sklearn():
    X, _, Q = load("iris")
    for mode in ("distance", "connectivity"):
        ours = ks.KNeighborsTransformer(mode=mode, n_neighbors=4, device="cpu").fit(X)
        theirs = neighbors.KNeighborsTransformer(mode=mode, n_neighbors=4, algorithm="brute").fit(X)
        ok = unambiguous_rows(X, Q, 4 + (mode == "distance"), tolerance(X))
        np.testing.assert_allclose(
            ours.transform(Q).toarray()[ok], theirs.transform(Q).toarray()[ok], rtol=1e-6, atol=tolerance(X)
        )
        assert ours.fit_transform(X).shape == theirs.fit_transform(X).shape


def test_pipeline_and_grid_search():
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = datasets.load_wine(return_X_y=True)
    pipe = make_pipeline(StandardScaler(), ks.KNeighborsClassifier(device="cpu"))
    search = GridSearchCV(pipe, {"kneighborsclassifier__n_neighbors": [3, 7]}, cv=3).fit(X, y)
    assert search.best_score_ > 0.9


def test_parameters():
    X, y, Q = load("iris")
    for metric, p in [("minkowski", 1), ("minkowski", np.inf), ("sqeuclidean", 2)]:
        ours = ks.NearestNeighbors(metric=metric, p=p, n_jobs=-1, device="cpu").fit(X)
        theirs = neighbors.NearestNeighbors(metric=metric, p=p, algorithm="brute").fit(X)
        np.testing.assert_allclose(ours.kneighbors(Q)[0], theirs.kneighbors(Q)[0], rtol=1e-5, atol=tolerance(X))
    cov = np.cov(X.T)
    # Mahalanobis takes float32 data only (float64 input raises rather than being rounded)
    X32, Q32 = X.astype(np.float32), Q.astype(np.float32)
    ours = ks.NearestNeighbors(metric="mahalanobis", metric_params={"VI": np.linalg.inv(cov)}, device="cpu").fit(X32)
    theirs = neighbors.NearestNeighbors(metric="mahalanobis", metric_params={"VI": np.linalg.inv(cov)}, algorithm="brute").fit(X)
    np.testing.assert_allclose(ours.kneighbors(Q32)[0], theirs.kneighbors(Q)[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="mahalanobis metric takes float32"):
        ours.kneighbors(Q)
    with pytest.raises(ValueError, match="mahalanobis metric takes float32"):
        ks.NearestNeighbors(metric="mahalanobis", device="cpu").fit(X)
    for bad in [dict(metric="minkowski", p=3), dict(metric=lambda a, b: 0.0), dict(metric="precomputed"), dict(n_jobs=0)]:
        with pytest.raises(ValueError):
            ks.NearestNeighbors(**bad).fit(X)
    with pytest.raises(ValueError, match="Expected n_neighbors <= n_samples_fit"):
        ks.NearestNeighbors(device="cpu").fit(X).kneighbors(Q, n_neighbors=len(X) + 1)
    with pytest.raises(ValueError, match="weights not recognized"):
        ks.KNeighborsClassifier(weights="nope", device="cpu").fit(X, y).predict(Q)
    with pytest.raises(ValueError, match="Reshape your data"):
        ks.KNeighborsClassifier(device="cpu").fit(X, y).predict(Q[0])


def test_effective_metric_uses_sklearn_names():
    X, _, _ = load("iris")
    for metric, p in [("minkowski", 2), ("minkowski", 1), ("chebyshev", 2), ("cosine", 2)]:
        ours = ks.NearestNeighbors(metric=metric, p=p, device="cpu").fit(X)
        theirs = neighbors.NearestNeighbors(metric=metric, p=p).fit(X)
        assert ours.effective_metric_ == theirs.effective_metric_


def test_float64_input_is_exact_float32_stays_float32():
    rng = np.random.default_rng(5)
    X = 1000 + 2e-5 * rng.random((300, 4))  # closer together than a float32 step
    Q = 1000 + 2e-5 * rng.random((20, 4))
    ours = ks.NearestNeighbors(n_neighbors=5, device="cpu").fit(X)
    d, i = ours.kneighbors(Q)
    exact = np.sqrt(((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1))  # direct, no cancellation
    want = np.argsort(exact, axis=1, kind="stable")[:, :5]
    assert d.dtype == np.float64
    np.testing.assert_array_equal(i, want)
    np.testing.assert_allclose(d, np.take_along_axis(exact, want, 1), rtol=1e-12)
    d, i = ours.kneighbors()  # each point without itself
    assert d.dtype == np.float64
    exact = np.sqrt(((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(exact, np.inf)
    np.testing.assert_array_equal(i, np.argsort(exact, axis=1, kind="stable")[:, :5])
    X32 = rng.random((100, 4), dtype=np.float32)
    d, _ = ks.NearestNeighbors(device="cpu").fit(X32).kneighbors(X32[:5])
    assert d.dtype == np.float32
    d, _ = ks.NearestNeighbors(device="cpu").fit(X32).kneighbors(X32[:5].astype(np.float64))
    assert d.dtype == np.float64
