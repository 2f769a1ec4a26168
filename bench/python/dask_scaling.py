#!/usr/bin/env python3
"""Issue 22's scaling bars on one machine (the GPU machine: 16 cores, one GPU).

  CPU: knn.dask.search on a LocalCluster of 1, 2 and 4 worker processes, each computing with
       --threads cores (the engine's threads; one task at a time per worker), 4 base chunks and
       4 query blocks; bar: at least 3.2x from 1 to 4 workers. knn.search in one process on
       every core is printed beside it, and every answer must equal its answer byte for byte.
  GPU: one worker holding the GPU (device="cuda"), base in 4 chunks and in one, against
       knn.search on the same GPU in this process; bar: at most 1.3x its time. Then the
       same with the indexes kept: knn.dask.NearestNeighbors fitted once and kneighbors timed,
       against knn.Index built once in this process and searched.

Each time is the median of 3 runs of the whole computation after the inputs are on the
workers, made there as data loaded there would be (`dask_overhead.on_workers`: chunks sent
from the client arrive misaligned, and an index copies them), indexes built inside it as
knn.search builds its own, on standard-normal float32 data, on both sides (one run each was too noisy to read a ratio from: 2 workers once took 3.04
s against 3.60 s for one and 1.18 s for four); on the GPU a worker's first large index also
sizes its device memory pool and page-locked staging buffers, which knn.search's warm-up has
done in this process.

  python3 bench/python/dask_scaling.py [--n 1e6] [--m 1e4] [--d 128] [--k 10]
      [--threads 4] [--workers 1,2,4] [--no-gpu] [--profile]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import knn
import knn.dask as kd
from dask_overhead import index_moves, on_workers  # this folder's other Dask bench


def timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


def median_of_3(f):
    """The first result of f and the median of 3 timed runs (s)."""
    runs = [timed(f) for _ in range(3)]
    return runs[0][0], sorted(r[1] for r in runs)[1]


def on_cluster(base, queries, k, workers, threads, device, base_chunks=4, repeat=1,
               profile=False, fitted=False):
    """knn.dask.search on a fresh LocalCluster (inputs persisted on the workers first), or with
    ``fitted`` a NearestNeighbors fitted once (its indexes kept) and its kneighbors timed."""
    import contextlib

    import dask.array as da
    from distributed import Client, LocalCluster, get_task_stream

    nb, d = base.shape
    opts = dict(device=device) if device != "cpu" else dict(device="cpu", threads=threads)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        b = on_workers(client, base, -(-nb // base_chunks))
        q = on_workers(client, queries, -(-len(queries) // 4))
        # Every worker's modules imported and engine opened (a GPU's context and kernels), as
        # in this process: a fresh worker's first task otherwise imports dask.array and
        # knn.dask while its task is unpickled, before the task starts (1.3 s with no task
        # running in a 4-worker job). A small job then warms the scheduler's path; its tasks
        # need not reach every worker.
        client.run(warm_worker, d, opts)
        small = da.from_array(base[:1000], chunks=(250, d))
        client.compute(kd.search(small, small[:10], 1, **opts), sync=True)
        before = sum(client.run(index_moves, base_name=b.name).values())
        if fitted:
            nn = kd.NearestNeighbors(n_neighbors=k, **opts).fit(b)

            def job():
                return client.compute(nn.kneighbors(q), sync=True)
        else:
            def job():
                return client.compute(kd.search(b, q, k, **opts), sync=True)
        runs = []
        for _ in range(repeat):
            with (get_task_stream(client) if profile else contextlib.nullcontext()) as ts:
                runs.append(timed(job))
            if profile:
                print(task_profile(ts.data, runs[-1][1]), flush=True)
        if profile:
            # Dask's own cost of a job of this shape on this cluster: the same query blocks in,
            # two arrays of the same chunks out, each block a trivial task (no search).
            def floor_job():
                return client.compute((q.map_blocks(_first_columns, k, np.float32),
                                       q.map_blocks(_first_columns, k, np.int64)), sync=True)

            floor_job()
            floor = sorted(timed(floor_job)[1] for _ in range(3))[1]
            print(f"  Dask's floor, the same blocks in and out with no search: {floor * 1e3:.1f} ms"
                  " (median of 3)", flush=True)
        if profile and workers == 1:
            # The same search in the worker, outside Dask's tasks: what the worker's process
            # itself costs against this one (one worker: it holds every chunk).
            print("  knn.search inside the worker (base and queries there, median of 3): "
                  + ", ".join(f"{t:.3f} s" for t in client.run(
                search_here, b.__dask_keys__(), q.__dask_keys__(), k, opts)
                              .values()), flush=True)
        moved = sum(client.run(index_moves, base_name=b.name).values()) - before
        holders = [ws[0] for ws in client.who_has(b).values() if ws]
        spread = sorted((holders.count(a) for a in set(holders)), reverse=True)
    (dist, ids), t = runs[0][0], sorted(r[1] for r in runs)[len(runs) // 2]
    return dist, ids, t, f"{moved} indexes or base chunks moved between workers, base chunks per worker {spread}"


def _first_columns(block, k, dtype):
    """A query block's first k columns as ``dtype``: an output block of the search's shape."""
    return block[:, :k].astype(dtype)


def warm_worker(d, opts):
    """In a worker: the modules a search task needs imported, and the engine opened by a
    small search."""
    import dask.array  # noqa: F401
    import knn.dask  # noqa: F401

    rows = np.random.default_rng(0).standard_normal((1000, d), dtype=np.float32)
    knn.search(rows, rows[:10], 1, **opts)


def task_profile(tasks, wall):
    """One line: the job's wall time, the time its tasks spanned and how much of it no task
    ran, and the workers' busy time per task kind (compute and transfers)."""
    import collections

    per = collections.Counter()
    spans = sorted((ss["start"], ss["stop"]) for t in tasks for ss in t["startstops"])
    for t in tasks:
        kind = str(t["key"]).strip("('\"").split("-")[0]
        for ss in t["startstops"]:
            per[f"{kind} {ss['action']}"] += ss["stop"] - ss["start"]
    # Time no task ran between the first start and the last end (the scheduler's round trips
    # between dependent tasks, with one worker thread).
    idle, end = 0.0, spans[0][0]
    for a, b in spans:
        idle += max(0.0, a - end)
        end = max(end, b)
    busy = " ".join(f"{k} {v * 1e3:.1f}" for k, v in per.most_common())
    return (f"  job {wall * 1e3:.1f} ms, first task start to last task end "
            f"{(end - spans[0][0]) * 1e3:.1f} ms, no task running {idle * 1e3:.1f} ms of it; "
            f"task time (ms): {busy}")


def search_here(bkeys, qkeys, k, opts, dask_worker=None):
    """knn.search timed in a worker that holds every chunk (median of 3 after one)."""
    import time as t

    def held(keys):
        return np.concatenate([dask_worker.data[tuple(key)] for (key,) in keys])

    base, queries = held(bkeys), held(qkeys)
    knn.search(base, queries, k, **opts)
    times = []
    for _ in range(3):
        s = t.perf_counter()
        knn.search(base, queries, k, **opts)
        times.append(t.perf_counter() - s)
    return sorted(times)[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=float, default=1e6)
    p.add_argument("--m", type=float, default=1e4)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--no-gpu", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="print each job's task times by kind, and knn.search timed in a worker")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    base = rng.standard_normal((int(a.n), a.d), dtype=np.float32)
    queries = rng.standard_normal((int(a.m), a.d), dtype=np.float32)

    workers = [int(x) for x in a.workers.split(",") if x]  # --workers "": the GPU part only
    if workers:
        (want_d, want_i), one = median_of_3(lambda: knn.search(base, queries, a.k, device="cpu"))
        print(f"{int(a.n)} x {int(a.m)}, d={a.d}, k={a.k}: knn.search, one process, every core "
              f"(CPU): {one:.2f} s", flush=True)
        _, few = median_of_3(
            lambda: knn.search(base, queries, a.k, device="cpu", threads=a.threads))
        print(f"knn.search, one process, {a.threads} threads (CPU): {few:.2f} s: every core is "
              f"{few / one:.2f}x faster", flush=True)
    times = {}
    for w in workers:
        dist, ids, t, moves = on_cluster(base, queries, a.k, w, a.threads, "cpu", repeat=3,
                                         profile=a.profile)
        same = dist.tobytes() == want_d.tobytes() and ids.tobytes() == want_i.tobytes()
        times[w] = t
        print(f"knn.dask.search, {w} worker(s) x {a.threads} threads (CPU): {t:.2f} s, "
              f"{times[min(times)] / t:.2f}x the fewest workers'; {moves}; answers "
              f"{'same' if same else 'DIFFERENT'}", flush=True)
        if not same:
            raise SystemExit("answers differ")
    if len(times) > 1:
        lo, hi = min(times), max(times)
        print(f"scaling {lo} -> {hi} workers: {times[lo] / times[hi]:.2f}x (bar 3.2x from 1 to 4)")
    if a.no_gpu or not knn.devices():
        return
    knn.search(base[:1000], queries[:10], a.k, device="cuda")  # the GPU opened, kernels loaded
    runs = [timed(lambda: knn.search(base, queries, a.k, device="cuda")) for _ in range(3)]
    (gd, gi), one_gpu = runs[0][0], sorted(r[1] for r in runs)[1]  # the median of 3
    # Base in 4 chunks (as the CPU runs), and in one chunk: the index a GPU worker holds.
    for chunks in (4, 1):
        dist, ids, t, _ = on_cluster(base, queries, a.k, 1, 1, "cuda", chunks, repeat=3,
                                     profile=a.profile)
        same = dist.tobytes() == gd.tobytes() and ids.tobytes() == gi.tobytes()
        print(f"GPU: knn.search {one_gpu:.3f} s, knn.dask.search on one GPU worker, base in "
              f"{chunks} chunk(s), 4 query blocks: {t:.3f} s: {t / one_gpu:.2f}x (bar at most "
              f"1.3x); answers {'same' if same else 'DIFFERENT'}", flush=True)
    # Indexes kept: knn.dask.NearestNeighbors fitted once, kneighbors timed, against an index
    # built once in this process and searched.
    index = knn.Index(base, device="cuda")
    runs = [timed(lambda: index.search(queries, a.k)) for _ in range(3)]
    one_index = sorted(r[1] for r in runs)[1]
    del index
    for chunks in (4, 1):
        dist, ids, t, _ = on_cluster(base, queries, a.k, 1, 1, "cuda", chunks, repeat=3,
                                     profile=a.profile, fitted=True)
        same = dist.tobytes() == gd.tobytes() and ids.tobytes() == gi.tobytes()
        print(f"GPU, indexes kept: knn.Index.search {one_index:.3f} s, knn.dask.NearestNeighbors"
              f".kneighbors on one GPU worker, fitted in {chunks} chunk(s), 4 query blocks: "
              f"{t:.3f} s: {t / one_index:.2f}x; answers {'same' if same else 'DIFFERENT'}",
              flush=True)


if __name__ == "__main__":
    main()
