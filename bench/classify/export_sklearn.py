#!/usr/bin/env python3
"""Exports scikit-learn's digits and iris, split with a fixed seed, and the predictions of
KNeighborsClassifier(algorithm="brute") for k in {1, 3, 5, 15} and uniform/distance weights,
into crates/knn-classify/tests/data/ (small CSV files, committed). Run once:

    python3 -m venv bench/.venv && bench/.venv/bin/pip install scikit-learn numpy
    bench/.venv/bin/python bench/classify/export_sklearn.py

The Rust test crates/knn-classify/tests/sklearn.rs embeds the files and compares every
prediction.

Data: the features are cast to float32 first (and back to float64 for scikit-learn), so that
scikit-learn sees exactly the values our f32 engine sees; digits are small integers (exact either
way), iris gets f32-rounded decimals. Split: train_test_split(test_size=0.25, random_state=0).
scikit-learn runs on one thread (OMP_NUM_THREADS=1) so that its own tie order is reproducible.
Besides predictions, the neighbour ids of kneighbors() are exported for every k: the test uses
them to tell a genuine distance tie at the k-th neighbour from a real difference.
"""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pathlib  # noqa: E402

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
from sklearn.datasets import load_digits, load_iris  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.neighbors import KNeighborsClassifier  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[2] / "crates" / "knn-classify" / "tests" / "data"
KS = [1, 3, 5, 15]
WEIGHTS = ["uniform", "distance"]


def write_matrix(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(",".join(str(v) for v in r) + "\n")


def fmt(x):
    # Shortest text that reads back to the same float32 (integers without ".0").
    x = np.float32(x)
    return str(int(x)) if float(x).is_integer() else str(x)


def export(name, loader):
    X, y = loader(return_X_y=True)
    X = X.astype(np.float32).astype(np.float64)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0)
    write_matrix(OUT / f"{name}_train.csv", [[fmt(v) for v in r] + [int(c)] for r, c in zip(Xtr, ytr)])
    write_matrix(OUT / f"{name}_test.csv", [[fmt(v) for v in r] for r in Xte])
    cols, header = [], []
    for k in KS:
        for w in WEIGHTS:
            clf = KNeighborsClassifier(n_neighbors=k, weights=w, algorithm="brute")
            clf.fit(Xtr, ytr)
            cols.append(clf.predict(Xte))
            header.append(f"k{k}_{w}")
        ids = KNeighborsClassifier(n_neighbors=k, algorithm="brute").fit(Xtr, ytr).kneighbors(
            Xte, return_distance=False
        )
        write_matrix(OUT / f"{name}_neighbors_k{k}.csv", ids.tolist())
    with open(OUT / f"{name}_predictions.csv", "w") as f:
        f.write(",".join(header) + "\n")
        for row in zip(*cols):
            f.write(",".join(str(int(v)) for v in row) + "\n")
    print(f"{name}: {len(Xtr)} train, {len(Xte)} test, d={X.shape[1]}; accuracy k=5 uniform "
          f"{np.mean(cols[4] == yte):.4f}")


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"scikit-learn {sklearn.__version__}, numpy {np.__version__} -> {OUT}")
    export("digits", load_digits)
    export("iris", load_iris)
