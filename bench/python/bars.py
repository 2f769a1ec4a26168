#!/usr/bin/env python3
"""Issue 21's CPU bars for the Python package, each peer in the same process on the same data.

  a  knn.Index(base).search(queries, k) against faiss-cpu IndexFlatL2 built once:
     16384 x 4096 (k=16) and 100000 x 1000 (k=10), d=128; bar >= 2x; and L1 against
     IndexFlat(METRIC_L1) at 16384 x 4096 (issue 20's CPU bar: >= 3x)
  b  knn.sklearn.KNeighborsClassifier fit + predict against scikit-learn's brute force,
     200000 x 20000, d=16, k=15; bar >= 10x, identical predictions (rows without a tie at the
     k-th distance)
  c  an index over a 1e6 x 128 C-contiguous float32 array: peak memory grows by far less than
     the array (512 MB), as the array is used in place

Run with the package installed (bash scripts/test.sh makes .venv) and faiss-cpu beside it:
  .venv/bin/python -m pip install faiss-cpu && .venv/bin/python bench/python/bars.py
--quick runs smaller sizes (a smoke test of the script). Median of --repeat runs after one
warm-up each; every thread of the machine for both sides.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

import knn


def median_time(f, repeat):
    f()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def bar_search(n, m, k, d, repeat, metric="l2"):
    import faiss

    rng = np.random.default_rng(1)
    base = rng.standard_normal((n, d), dtype=np.float32)
    queries = rng.standard_normal((m, d), dtype=np.float32)
    index = knn.Index(base, metric, device="cpu")
    if metric == "l1":
        flat, peer, bar = faiss.IndexFlat(d, faiss.METRIC_L1), "IndexFlat(METRIC_L1)", 3
    else:
        flat, peer, bar = faiss.IndexFlatL2(d), "IndexFlatL2", 2
    flat.add(base)
    ours = median_time(lambda: index.search(queries, k), repeat)
    theirs = median_time(lambda: flat.search(queries, k), repeat)
    _, ids = index.search(queries, k)
    _, fids = flat.search(queries, k)
    agree = float(np.mean(ids == fids))
    print(
        f"a  search {n} x {m}, d={d}, k={k}, {metric}: knn {ours * 1e3:.1f} ms, faiss {peer} "
        f"{theirs * 1e3:.1f} ms, {theirs / ours:.2f}x (bar {bar}x); ids equal to faiss's: "
        f"{agree:.4f}",
        flush=True,
    )


def bar_classifier(n, m, d, k, repeat):
    from sklearn import neighbors

    from knn.sklearn import KNeighborsClassifier

    rng = np.random.default_rng(2)
    X = rng.standard_normal((n, d))
    y = (X[:, 0] + 0.5 * rng.standard_normal(n) > 0).astype(int) + (X[:, 1] > 1)
    Q = rng.standard_normal((m, d))

    def ours():
        return KNeighborsClassifier(n_neighbors=k, device="cpu").fit(X, y).predict(Q)

    def theirs():
        return neighbors.KNeighborsClassifier(n_neighbors=k, algorithm="brute", n_jobs=-1).fit(X, y).predict(Q)

    t_ours = median_time(ours, repeat)
    t_theirs = median_time(theirs, max(1, repeat // 2))
    d_k, _ = neighbors.NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(X).kneighbors(Q)
    clear = d_k[:, k] - d_k[:, k - 1] > 1e-5 * d_k[:, k]
    same = np.array_equal(ours()[clear], theirs()[clear])
    print(
        f"b  classifier fit+predict {n} x {m}, d={d}, k={k}: knn {t_ours:.2f} s, scikit-learn "
        f"brute {t_theirs:.2f} s, {t_theirs / t_ours:.1f}x (bar 10x); predictions identical on "
        f"the {clear.mean():.4f} of rows without a k-th tie: {same}"
    )


def bar_memory(n, d):
    base = np.random.default_rng(3).random((n, d), dtype=np.float32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    index = knn.Index(base, device="cpu")
    index.search(base[:10], 5)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(
        f"c  index over a {n} x {d} float32 array ({base.nbytes / 2**20:.0f} MiB): peak memory "
        f"grew by {(peak - before) / 2**20:.0f} MiB (the array itself is used in place)"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the script")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    s = 8 if a.quick else 1
    # (c) first: the peak of the process is what it measures.
    bar_memory(1_000_000 // s, 128)
    bar_search(16384 // s, 4096 // s, 16, 128, a.repeat)
    bar_search(100_000 // s, 1000 // s, 10, 128, a.repeat)
    bar_search(16384 // s, 4096 // s, 16, 128, a.repeat, metric="l1")
    bar_classifier(200_000 // s, 20_000 // s, 16, 15, a.repeat)


if __name__ == "__main__":
    main()
