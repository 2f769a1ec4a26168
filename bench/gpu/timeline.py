"""The device's timeline of one call of the Python package: every kernel, copy and memset with
its start (µs from the call's start) and duration, the device's busy time, and the idle gaps
longer than --gap µs. The GPU machine has no Nsight Systems; PyTorch's profiler (CUPTI) records
the work of every library in the process, ours included.

The profiler slows the host's side (each driver call costs several µs more), so read the host
gaps as upper bounds and the device's durations as they are; time a call without it
(`index_vs_torch.py`, `gpu_tensors.py`) for its wall time.

Usage (GPU machine, the package installed):
    python3 bench/gpu/timeline.py search NB NQ D K [--metric l2] [--where host|torch]
    python3 bench/gpu/timeline.py graph N D K [--metric hellinger] [--symmetric auto] [--where ..]
`--host`: also every driver and runtime call of the host in the call, with the host's own time
between them. `--where torch`: queries (a graph: the index's points) in a PyTorch CUDA tensor (results there
too); `host`: NumPy arrays.
"""
import argparse
import json
import os
import tempfile

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import knn

DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def timeline(call, runs=3, gap_us=20.0, min_us=0.0, host=False):
    """Profiles `runs` calls after three warm-up ones and prints the last call's device work."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for i in range(runs):
            with torch.profiler.record_function(f"timeline-call-{i}"):
                call()
                torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(prefix="timeline-"), "trace.json")
    p.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    calls = sorted(
        (e for e in events
         if e["name"].startswith("timeline-call-") and e.get("cat") == "user_annotation"),
        key=lambda e: e["ts"],
    )
    c = calls[-1]
    t0, t1 = c["ts"], c["ts"] + c["dur"]
    work = sorted((e for e in events if t0 <= e["ts"] <= t1 and e.get("cat") in DEVICE_WORK),
                  key=lambda e: e["ts"])
    if not work:
        print(f"call {c['dur']:.0f} µs (profiled): no device work")
        return
    busy = sum(e["dur"] for e in work)
    end = max(e["ts"] + e["dur"] for e in work)
    print(f"call {c['dur']:.0f} µs (profiled); device work from {work[0]['ts'] - t0:.0f} to "
          f"{end - t0:.0f} µs, busy {busy:.0f} µs")
    print(f"{'start':>9} {'µs':>9}  {'kind':<10} name")
    last_end = work[0]["ts"]
    for e in work:
        idle = e["ts"] - last_end
        if idle > gap_us:
            print(f"{'':>9} {idle:9.1f}  {'(idle)':<10}")
        if e["dur"] >= min_us or e["cat"] != "kernel":
            print(f"{e['ts'] - t0:9.1f} {e['dur']:9.1f}  {e['cat'][:10]:<10} {e['name'][:60]}")
        last_end = max(last_end, e["ts"] + e["dur"])
    if host:
        host_calls(events, t0, t1)


def host_calls(events, t0, t1):
    """The driver and runtime calls of the host in [t0, t1] (µs from t0), with the host's own
    time between them: where a call's serial host time goes."""
    api = sorted((e for e in events if t0 <= e["ts"] <= t1
                  and e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    print(f"host: {len(api)} driver/runtime calls, {sum(e['dur'] for e in api):.0f} µs in them")
    print(f"{'start':>9} {'µs':>9} {'before':>9}  name")
    last = t0
    for e in api:
        print(f"{e['ts'] - t0:9.1f} {e['dur']:9.1f} {e['ts'] - last:9.1f}  {e['name'][:60]}")
        last = e["ts"] + e["dur"]
    print(f"{'':>9} {'':>9} {t1 - last:9.1f}  (to the call's end)")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["search", "graph"])
    ap.add_argument("sizes", type=int, nargs="+", help="search: NB NQ D K; graph: N D K")
    ap.add_argument("--metric", default=None, help="default l2 (search), hellinger (graph)")
    ap.add_argument("--where", choices=["host", "torch"], default="host",
                    help="search: queries (and results) as NumPy arrays or PyTorch CUDA tensors; "
                         "graph: the index's points (and the results) so")
    ap.add_argument("--symmetric", default="auto", help="graph: auto, on or off")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gap", type=float, default=20.0, help="idle gaps shown from this many µs")
    ap.add_argument("--min", type=float, default=0.0, help="kernels shown from this many µs")
    ap.add_argument("--host", action="store_true",
                    help="also the host's driver and runtime calls, with the time between them")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    if a.what == "search":
        nb, nq, d, k = a.sizes
        index = knn.Index(rng.random((nb, d), dtype=np.float32), a.metric or "l2", device="cuda")
        q = rng.random((nq, d), dtype=np.float32)
        if a.where == "torch":
            q = torch.from_numpy(q).cuda()
        print(f"search {nb} x {nq}, d={d}, k={k}, {index.metric}, queries on the {a.where}")
        timeline(lambda: index.search(q, k), a.runs, a.gap, a.min, a.host)
    else:
        n, d, k = a.sizes
        points = rng.random((n, d), dtype=np.float32)
        if a.where == "torch":
            points = torch.from_numpy(points).cuda()
        index = knn.Index(points, a.metric or "hellinger", device="cuda")
        print(f"graph n={n}, d={d}, k={k}, {index.metric}, symmetric={a.symmetric}, "
              f"points and results on the {a.where}")
        timeline(lambda: index.graph(k, a.symmetric), a.runs, a.gap, a.min, a.host)


if __name__ == "__main__":
    main()
