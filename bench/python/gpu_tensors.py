#!/usr/bin/env python3
"""Issue 21's GPU bar: an index built once from a PyTorch CUDA tensor (16384 x 128), searched
with CUDA tensor queries (4096 x 128, k=16) that return CUDA tensors, against PyTorch
``addmm`` + ``topk`` on the same tensors (TF32 off, the exact float32 form), and the same with
CuPy arrays and JAX arrays (when installed) against the same PyTorch figure. Bar: at least 4x.
JAX's own form (jitted matmul + ``lax.top_k``, float32 precision) is timed beside it. Answers compared (ids equal
where PyTorch's k-th distance is not tied with the next).

Each side is timed from the queries' tensor to the results' tensors, synchronised, median of
4 rounds of --repeat runs after warm-up, the two sides in turns, both in this process on the
same data (CuPy arrays in turns with PyTorch again; the JAX figures: --repeat runs against the
PyTorch figure of the tensors' turns).

Run on the GPU machine with the package installed (its wheel, built here with maturin):
  python3 bench/python/gpu_tensors.py [--n 16384] [--m 4096] [--d 128] [--k 16] [--parts] [--torch-only]

--parts also times the parts of one PyTorch search in this process (median and 90th
percentile of --repeat calls, each synchronised): the queries' wrapper (`CudaRows`), the two
result tensors, the native call alone on kept tensors, and the whole `index.search`, with the
process's page faults, waits and preemptions per call (getrusage).
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time

import numpy as np
import torch

import knn

# JAX, when it is imported below, takes memory as it needs it (not 75 % of the GPU at once).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def times_ms(f, repeat):
    """Wall times (ms) of ``repeat`` calls of ``f``, each synchronised, after three warm-up calls."""
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def median_ms(f, repeat):
    return float(np.median(times_ms(f, repeat)))


ROUNDS = 4


def medians_in_turns(fs, repeat):
    """Median wall times (ms) of each of ``fs``, timed in turns: ``ROUNDS`` rounds of
    ``repeat`` calls each (after warm-up), so that neither side is timed only first, on a GPU
    and host that have just started working (the first side's median read 10-25 % above its
    later ones)."""
    times = [[] for _ in fs]
    for _ in range(ROUNDS):
        for t, f in zip(times, fs):
            t.extend(times_ms(f, repeat))
    return [float(np.median(t)) for t in times]


def parts(index, queries, k, repeat, sync=None):
    """Median and 90th percentile (µs) of each part of a search of GPU ``queries`` (PyTorch,
    CuPy or JAX), each call followed by ``sync`` (default: PyTorch's device synchronisation)."""
    from knn._arrays import CudaRows

    rows = CudaRows(queries, "queries")
    native = index._native
    out = rows.results(k, native)

    def call():
        native.search_device(rows.ptr, rows.rows, rows.device, rows.stream, k,
                             out.ids_ptr, out.distances_ptr, out.ids_i64)

    steps = {
        "CudaRows": lambda: CudaRows(queries, "queries"),
        "result arrays": lambda: rows.results(k, native),
        "native search_device": call,
        "results handed over": out.arrays,
        "index.search": lambda: index.search(queries, k),
    }
    for name, f in steps.items():
        before = resource.getrusage(resource.RUSAGE_SELF)
        t = np.array(times_ms(lambda: (f(), sync and sync()), repeat)) * 1e3
        after = resource.getrusage(resource.RUSAGE_SELF)
        # Per call (three warm-up calls included): page faults and context switches of the
        # whole process, where host time that the kernels do not explain may go.
        calls = repeat + 3
        faults = (after.ru_minflt - before.ru_minflt) / calls
        switches = (after.ru_nvcsw - before.ru_nvcsw) / calls
        preempted = (after.ru_nivcsw - before.ru_nivcsw) / calls
        print(f"  {name}: median {np.median(t):.1f} us, p90 {np.percentile(t, 90):.1f} us; "
              f"per call {faults:.1f} page faults, {switches:.1f} waits, {preempted:.1f} preemptions")
    busy_threads(steps["index.search"], repeat, sync)


def thread_ticks():
    """CPU time (clock ticks) of each thread of this process, by thread id, with its name."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        ticks[tid] = (name, int(fields[11]) + int(fields[12]), int(fields[36]))
    return ticks


def cpu_ticks():
    """Busy clock ticks of each CPU of the machine (/proc/stat), by CPU number."""
    busy = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *v = line.split()
                v = list(map(int, v))
                busy[int(name[3:])] = sum(v) - v[3] - v[4]
    return busy


def busy_threads(f, repeat, sync):
    """Where the host's time goes while ``f`` is called ``repeat`` times: the threads of this
    process that used CPU time (share of the wall time, last CPU), and the machine's busy
    CPUs, with the CPU this thread ran on and its hyperthread siblings."""
    t0, c0, w0 = thread_ticks(), cpu_ticks(), time.perf_counter()
    for _ in range(repeat):
        f()
        sync and sync()
    t1, c1, wall = thread_ticks(), cpu_ticks(), time.perf_counter() - w0
    hz = os.sysconf("SC_CLK_TCK")
    me = str(threading.get_native_id())
    for tid, (name, ticks, cpu) in t1.items():
        share = (ticks - t0.get(tid, (name, 0, cpu))[1]) / hz / wall
        if share > 0.02:
            print(f"  thread {name} ({'this one' if tid == me else tid}): {share:.0%} busy, on cpu {cpu}")
    mine = t1[me][2]
    try:
        with open(f"/sys/devices/system/cpu/cpu{mine}/topology/thread_siblings_list") as g:
            siblings = g.read().strip()
    except OSError:
        siblings = "?"
    busy = {c: (c1[c] - c0.get(c, 0)) / hz / wall for c in c1}
    shown = ", ".join(f"{c}: {b:.0%}" for c, b in sorted(busy.items()) if b > 0.05)
    print(f"  this thread on cpu {mine} (siblings {siblings}); busy CPUs: {shown}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--parts", action="store_true", help="also time the parts of one search")
    p.add_argument("--torch-only", action="store_true",
                   help="time PyTorch tensors only (not CuPy or JAX arrays)")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    base = torch.rand(a.n, a.d, device="cuda", generator=g)
    queries = torch.rand(a.m, a.d, device="cuda", generator=g)
    bn = (base * base).sum(1)

    def torch_search():
        qn = (queries * queries).sum(1, keepdim=True)
        dist = torch.addmm(qn + bn, queries, base.t(), beta=1.0, alpha=-2.0)
        return torch.topk(dist, a.k, dim=1, largest=False)

    t0 = time.perf_counter()
    index = knn.Index(base, "l2", device="cuda")
    build = (time.perf_counter() - t0) * 1e3
    ours, peer = medians_in_turns([lambda: index.search(queries, a.k), torch_search], a.repeat)
    d, i = index.search(queries, a.k)
    assert d.is_cuda and i.is_cuda and i.dtype == torch.int64
    td, ti = torch_search()
    # Compare rows whose k-th distance is clear of the next one in PyTorch's (rounded) order.
    same = (i.cpu() == ti.cpu()).all(1).float().mean().item()
    print(f"index built from a CUDA tensor in {build:.1f} ms")
    print(f"torch tensors: knn {ours:.3f} ms, torch addmm+topk {peer:.3f} ms: {peer / ours:.2f}x "
          f"(bar 4x); rows with ids equal to torch's: {same:.4f}")
    if a.parts:
        parts(index, queries, a.k, a.repeat)
    if a.torch_only:
        return
    cupy_arrays(index, queries, i, torch_search, a)
    jax_arrays(index, base, queries, i, peer, a)


def cupy_arrays(index, queries, i, torch_search, a):
    try:
        import cupy
    except ImportError:
        print("cupy: not installed")
        return
    cq = cupy.asarray(queries)
    ours_cupy, peer = medians_in_turns([lambda: index.search(cq, a.k), torch_search], a.repeat)
    cd, ci = index.search(cq, a.k)
    assert isinstance(ci, cupy.ndarray) and ci.dtype == cupy.int64
    assert (cupy.asnumpy(ci) == i.cpu().numpy()).all()
    print(f"cupy arrays: knn {ours_cupy:.3f} ms against torch {peer:.3f} ms: "
          f"{peer / ours_cupy:.2f}x (bar 4x); ids equal to the torch tensors' search")


def jax_arrays(index, base, queries, i, peer, a):
    """The same queries as JAX arrays (int32 ids: JAX's default has no int64), against the
    PyTorch figure and against JAX's own jitted search."""
    try:
        import jax
        import jax.dlpack
        import jax.numpy as jnp
    except ImportError:
        print("jax: not installed")
        return
    if not any(d.platform == "gpu" for d in jax.devices()):
        print("jax: no GPU backend")
        return
    jq = jax.dlpack.from_dlpack(queries)
    jb = jax.dlpack.from_dlpack(base)

    def sync(x):
        jax.block_until_ready(x)

    def ours():
        sync(index.search(jq, a.k))

    ours_jax = median_ms(ours, a.repeat)
    jd, ji = index.search(jq, a.k)
    assert isinstance(ji, jax.Array) and list(ji.devices()) == list(jq.devices())
    assert (np.asarray(ji) == i.cpu().numpy()).all()

    @jax.jit
    def jax_search(q, b):
        d = (jnp.sum(q * q, 1, keepdims=True) + jnp.sum(b * b, 1)
             - 2 * jnp.matmul(q, b.T, precision=jax.lax.Precision.HIGHEST))
        neg, ids = jax.lax.top_k(-d, a.k)
        return -neg, ids

    own = median_ms(lambda: sync(jax_search(jq, jb)), a.repeat)
    if a.parts:
        parts(index, jq, a.k, a.repeat)
    print(f"jax arrays ({ji.dtype} ids): knn {ours_jax:.3f} ms against torch {peer:.3f} ms: "
          f"{peer / ours_jax:.2f}x (bar 4x); against JAX's jitted matmul + top_k {own:.3f} ms: "
          f"{own / ours_jax:.2f}x; ids equal to the torch tensors' search")


if __name__ == "__main__":
    main()
