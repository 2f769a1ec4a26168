"""knn.dask.search (4 base chunks, LocalCluster) against knn.search in one process (issue 22).

    python bench/python/dask_overhead.py [n_base] [n_queries] [d] [k] [workers]

Default 1e6 x 1e4, d=128, k=10. Reports both times, the ratio, the merge's share (sum of merge
task durations / sum of all task durations), the bytes sent between workers and how many
chunk indexes were sent from one worker to another (each built again there from its rows),
the base chunks each worker held and the task time each worker spent (the balance).
"""

import sys
import time

import numpy as np

import knn
import knn.dask as kd


def index_moves(dask_worker, base_name=None):
    """Chunk indexes (`_build` results) and base chunks (keys of the array named `base_name`)
    this worker received from another: where one group searches a chunk, its index is built in
    the search task, so moving that search moves its base chunk (and builds the index there)."""
    def moved(key):
        return str(key).startswith("_build") or (isinstance(key, tuple) and key[0] == base_name)

    return sum(moved(key) for e in dask_worker.transfer_incoming_log for key in e["keys"])


def on_workers(client, x, rows):
    """``x`` held by the workers in chunks of ``rows`` rows as data loaded there would be: each
    chunk made by a task on its worker (a copy of the chunk the client sent). Chunks sent from
    the client arrive at any byte offset of their message (distributed reads a message's first
    array into its header's buffer), their float32 rows often misaligned, and an index over
    one then starts with an aligned copy of it (one H200 worker: a 512 MB chunk's GPU index
    145 ms as received, 74 ms from an aligned copy; 128 MB chunks +9 to +25 ms)."""
    import dask.array as da
    from distributed import wait

    sent = client.persist(da.from_array(x, chunks=(rows, x.shape[1])))
    held = client.persist(sent.map_blocks(np.copy))
    wait(held)
    return held


def main():
    nb, nq, d, k, w = (int(float(a)) for a in (sys.argv[1:] + ["1e6", "1e4", "128", "10", "2"][len(sys.argv) - 1:]))
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(0)
    base = rng.standard_normal((nb, d), dtype=np.float32)
    queries = rng.standard_normal((nq, d), dtype=np.float32)

    t = time.perf_counter()
    D, I = knn.search(base, queries, k, device="cpu")
    one = time.perf_counter() - t

    with LocalCluster(n_workers=w, threads_per_worker=max(1, 2 // w), processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        b = on_workers(client, base, -(-nb // 4))
        q = on_workers(client, queries, -(-nq // w))
        from distributed import get_task_stream

        t = time.perf_counter()
        with get_task_stream(client) as ts:
            d_, i_ = client.compute(kd.search(b, q, k, device="cpu"), sync=True)
        dask_t = time.perf_counter() - t
        assert d_.tobytes() == D.tobytes() and i_.tobytes() == I.tobytes(), "answers differ"
        busy, by_worker = {}, {}
        for task in ts.data:
            name = task["key"][0] if isinstance(task["key"], tuple) else task["key"]
            name = str(name).split("-")[0]
            for s_ in task["startstops"]:
                if s_["action"] == "compute":
                    busy[name] = busy.get(name, 0.0) + s_["stop"] - s_["start"]
                    by_worker[task["worker"]] = (by_worker.get(task["worker"], 0.0)
                                                 + s_["stop"] - s_["start"])
        total = sum(busy.values())
        merge = busy.get("_merge", 0.0)
        incoming = client.run(lambda dask_worker: sum(
            e.get("total", 0) for e in dask_worker.transfer_incoming_log))
        moved = client.run(index_moves, base_name=b.name)
        holders = [ws[0] for ws in client.who_has(b).values() if ws]
        chunks_at = sorted((holders.count(a) for a in set(holders)), reverse=True)
    print(f"{nb} x {nq}, d={d}, k={k}, {w} workers: knn.search {one:.3f} s, knn.dask.search "
          f"{dask_t:.3f} s, ratio {dask_t / one:.2f}x; bytes between workers "
          f"{sum(incoming.values())}; indexes or base chunks moved {sum(moved.values())}; merge {merge:.3f} s "
          f"= {100 * merge / total:.1f} % of task time; base chunks per worker {chunks_at}; task "
          f"time by worker {sorted((round(v, 2) for v in by_worker.values()), reverse=True)}; "
          f"by kind {dict((n, round(v, 3)) for n, v in busy.items())}")


if __name__ == "__main__":
    main()
