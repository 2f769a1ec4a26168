#!/usr/bin/env python3
"""Stand-in for `knn search` with the CLI's benchmark flags, to test cpu_vs_faiss.py before the
real CLI exists: `python3 bench/cpu_vs_faiss.py --quick --knn bench/fake_knn.py`. Exact f64
brute force in numpy (slow; use with --quick). Run by bench/.venv's python (needs numpy).
Writes ids to OUT.npy, Euclidean (l2) or L1 distances to OUT.dist.npy, timing to --timing-json.
"""
import argparse
import json
import statistics
import time

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("cmd")
ap.add_argument("--base")
ap.add_argument("--queries")
ap.add_argument("-k", type=int)
ap.add_argument("--metric", default="l2")
ap.add_argument("--device", default="cpu")
ap.add_argument("--repeat", type=int, default=1)
ap.add_argument("--timing-json")
ap.add_argument("-o")
ap.add_argument("--quiet", action="store_true")
a = ap.parse_args()
xb = np.load(a.base).astype(np.float64)
xq = np.load(a.queries).astype(np.float64)


def search():
    ids = np.empty((len(xq), a.k), np.int64)
    dist = np.empty((len(xq), a.k), np.float32)
    for i, q in enumerate(xq):
        diff = xb - q
        d = np.sqrt((diff * diff).sum(1)) if a.metric == "l2" else np.abs(diff).sum(1)
        o = np.lexsort((np.arange(len(d)), d))[: a.k]
        ids[i], dist[i] = o, d[o]
    return ids, dist


times = []
for _ in range(a.repeat):
    t0 = time.perf_counter()
    ids, dist = search()
    times.append((time.perf_counter() - t0) * 1e3)
np.save(a.o, ids)
np.save(a.o[: -len(".npy")] + ".dist.npy", dist)
json.dump({"median_ms": statistics.median(times), "times_ms": times}, open(a.timing_json, "w"))
