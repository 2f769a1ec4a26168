"""How the driver's calls on one GPU wait for another GPU's work: the mechanism behind a
multi-GPU graph's start skew (knn-cuda NOTES, stops 56 and 57). Needs two GPUs and CuPy.

While GPU 0 runs a 150 ms kernel:
- copies from GPU 0 to GPU 1 on the legacy default streams or on streams of their own, with and
  without peer access, and between stream-ordered (pool) allocations with and without the
  pools shared: when is each done?
- GPU 0's thread releases memory (unlocks host memory, frees device memory at once or in stream
  order) while GPU 1 launches or allocates;
- a thread page-locks MB megabytes of host memory (portable, or plain in either GPU's
  context) while GPU 1 launches, allocates or uploads.
Times are ms from GPU 0's launch. Also every lock and unlock with both GPUs idle and busy.
Usage: python3 bench/gpu/pin_skew.py [MB]"""
import ctypes
import sys
import threading
import time

import cupy as cp
import numpy as np

MB = int(sys.argv[1]) if len(sys.argv) > 1 else 400
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cuda.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}"""
kernels = []
for d in (0, 1):
    with cp.cuda.Device(d):
        kernels.append(cp.RawKernel(SPIN, "spin"))
        kernels[d]((1,), (1,), (np.uint64(1000),))
        cp.cuda.Device(d).synchronize()
host = np.full(MB << 18, np.nan, dtype=np.float32)
small = np.ones(4 << 20, dtype=np.float32)


def bind(d):
    cp.cuda.Device(d).use()
    cp.cuda.runtime.free(0)


def lock(flags):
    r = cuda.cuMemHostRegister_v2(host.ctypes.data, host.nbytes, flags)
    assert r == 0, f"cuMemHostRegister: {r}"


def unlock():
    assert cuda.cuMemHostUnregister(host.ctypes.data) == 0


def ms(t, t0):
    return (t - t0) * 1e3


def gpu1_work(work, start, t):
    """On GPU 1, 10 ms after `start` lets go: `work` ('launch' a 1 ms kernel, 'alloc' or
    'alloc async' 64 MB, 'upload' 16 MB), noting in `t` when it began, was queued and was done."""
    bind(1)
    start.wait()
    time.sleep(0.010)
    t["gpu1 in"] = time.perf_counter()
    if work == "launch":
        kernels[1]((1,), (1,), (np.uint64(1_000_000),))
    elif work == "alloc":
        b = cp.cuda.runtime.malloc(64 << 20)
    elif work == "alloc async":
        b = cp.cuda.runtime.mallocAsync(64 << 20, 0)
    else:
        b = cp.asarray(small)
    t["gpu1 queued"] = time.perf_counter()
    cp.cuda.runtime.deviceSynchronize()
    if work == "alloc":
        cp.cuda.runtime.free(b)
    elif work == "alloc async":
        cp.cuda.runtime.freeAsync(b, 0)
    t["gpu1 done"] = time.perf_counter()


def case(how, work):
    """how: None, ('portable', d) or ('plain', d); work: 'launch', 'alloc' or 'upload'."""
    t = {}
    start = threading.Barrier(3)

    def locker():
        if how:
            bind(how[1])
        start.wait()
        time.sleep(0.005)
        if how:
            t["lock in"] = time.perf_counter()
            lock(1 if how[0] == "portable" else 0)
            t["lock out"] = time.perf_counter()

    threads = [
        threading.Thread(target=locker),
        threading.Thread(target=gpu1_work, args=(work, start, t)),
    ]
    for th in threads:
        th.start()
    bind(0)
    start.wait()
    t0 = time.perf_counter()
    kernels[0]((1,), (1,), (np.uint64(150_000_000),))
    for th in threads:
        th.join()
    cp.cuda.runtime.deviceSynchronize()
    t["gpu0 done"] = time.perf_counter()
    if how:
        bind(how[1])
        u = time.perf_counter()
        unlock()
        t["unlock (idle) ms"] = (time.perf_counter() - u) * 1e3
    parts = [f"{k} {ms(v, t0):7.1f}" if "ms" not in k else f"{k} {v:.1f}" for k, v in t.items()]
    name = "no lock" if not how else f"{how[0]} in ctx {how[1]}"
    print(f"{name:18} {work:7} | " + " | ".join(parts), flush=True)


def alone(how, busy):
    """The lock's own time with both GPUs idle or both running 150 ms kernels."""
    if busy:
        for d in (0, 1):
            bind(d)
            kernels[d]((1,), (1,), (np.uint64(150_000_000),))
    bind(how[1])
    t0 = time.perf_counter()
    lock(1 if how[0] == "portable" else 0)
    t1 = time.perf_counter()
    unlock()
    t2 = time.perf_counter()
    for d in (0, 1):
        bind(d)
        cp.cuda.runtime.deviceSynchronize()
    t3 = time.perf_counter()
    state = "both busy" if busy else "idle"
    print(f"{how[0]} in ctx {how[1]}, GPUs {state}: lock {ms(t1, t0):.1f} ms, unlock "
          f"{ms(t2, t1):.1f} ms, kernels done {ms(t3, t0):.1f} ms", flush=True)


def release(what, work):
    """While GPU 0 runs its 150 ms kernel, GPU 0's thread releases memory (`what`: 'unlock' a
    locked range, 'free' a 64 MB device buffer, 'free async' one in stream order); 10 ms in,
    another thread starts `work` on GPU 1."""
    t = {}
    bind(0)
    if what == "unlock":
        lock(0)
    else:
        buf = cp.cuda.runtime.malloc(64 << 20)
    cp.cuda.runtime.deviceSynchronize()
    start = threading.Barrier(2)

    th = threading.Thread(target=gpu1_work, args=(work, start, t))
    th.start()
    start.wait()
    t0 = time.perf_counter()
    kernels[0]((1,), (1,), (np.uint64(150_000_000),))
    time.sleep(0.005)
    t["release in"] = time.perf_counter()
    if what == "unlock":
        unlock()
    elif what == "free":
        cp.cuda.runtime.free(buf)
    else:
        cp.cuda.runtime.freeAsync(buf, 0)
    t["release out"] = time.perf_counter()
    th.join()
    cp.cuda.runtime.deviceSynchronize()
    t["gpu0 done"] = time.perf_counter()
    parts = [f"{k} {ms(v, t0):7.1f}" for k, v in t.items()]
    print(f"{what:18} {work:7} | " + " | ".join(parts), flush=True)


def peer_copy(enabled, streams):
    """While GPU 0 runs its 150 ms kernel, GPU 1 copies 64 MB from GPU 0 (written before the
    kernel), with or without peer access enabled: when is the copy done? `streams`: whether
    GPU 0's kernel and GPU 1's copy run on the legacy default streams ('legacy') or on streams
    of their own that do not synchronise with it ('own')."""
    bind(0)
    src = cp.zeros(16 << 20, dtype=np.float32)
    s0 = cp.cuda.Stream(non_blocking=True) if streams == "own" else cp.cuda.Stream.null
    cp.cuda.runtime.deviceSynchronize()
    bind(1)
    dst = cp.empty(16 << 20, dtype=np.float32)
    s1 = cp.cuda.Stream(non_blocking=True) if streams == "own" else cp.cuda.Stream.null
    t0 = time.perf_counter()
    bind(0)
    kernels[0]((1,), (1,), (np.uint64(150_000_000),), stream=s0)
    time.sleep(0.005)
    bind(1)
    t1 = time.perf_counter()
    cp.cuda.runtime.memcpyPeerAsync(dst.data.ptr, 1, src.data.ptr, 0, src.nbytes, s1.ptr)
    t2 = time.perf_counter()
    s1.synchronize()
    t3 = time.perf_counter()
    bind(0)
    cp.cuda.runtime.deviceSynchronize()
    t4 = time.perf_counter()
    state = "enabled" if enabled else "not enabled"
    print(f"peer copy GPU 0 -> 1, peer access {state}, {streams} streams: queued "
          f"{ms(t1, t0):.1f}-{ms(t2, t0):.1f} ms, done {ms(t3, t0):.1f} ms, GPU 0 done "
          f"{ms(t4, t0):.1f} ms", flush=True)


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def pool_access(dev, peer):
    """Lets GPU `peer` read and write GPU `dev`'s stream-ordered pool."""
    pool = ctypes.c_void_p()
    assert cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev) == 0
    desc = AccessDesc(Location(1, peer), 3)
    assert cuda.cuMemPoolSetAccess(pool, ctypes.byref(desc), 1) == 0


def pooled_copy(label):
    """64 MB from GPU 0 to GPU 1 between stream-ordered (pool) allocations, both GPUs idle."""
    bind(0)
    s0 = cp.cuda.Stream(non_blocking=True)
    src = cp.cuda.runtime.mallocAsync(64 << 20, s0.ptr)
    s0.synchronize()
    bind(1)
    s1 = cp.cuda.Stream(non_blocking=True)
    dst = cp.cuda.runtime.mallocAsync(64 << 20, s1.ptr)
    s1.synchronize()
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        cp.cuda.runtime.memcpyPeerAsync(dst, 1, src, 0, 64 << 20, s1.ptr)
        s1.synchronize()
        times.append(ms(time.perf_counter(), t0))
    cp.cuda.runtime.freeAsync(dst, s1.ptr)
    s1.synchronize()
    bind(0)
    cp.cuda.runtime.freeAsync(src, s0.ptr)
    s0.synchronize()
    print(f"pool to pool, 64 MB, {label}: " + " ".join(f"{t:.2f}" for t in times) + " ms",
          flush=True)


print(f"{MB} MB of host memory")
pooled_copy("peer access not enabled")
for streams in ("legacy", "own"):
    peer_copy(False, streams)
bind(1)
cp.cuda.runtime.deviceEnablePeerAccess(0)
bind(0)
cp.cuda.runtime.deviceEnablePeerAccess(1)
for streams in ("legacy", "own"):
    peer_copy(True, streams)
pooled_copy("peer access enabled")
pool_access(0, 1)
pool_access(1, 0)
pooled_copy("peer access enabled, pools shared")
for rep in range(2):
    for work in ("launch", "alloc"):
        for what in ("unlock", "free", "free async"):
            release(what, work)
hows = [("portable", 0), ("plain", 0), ("plain", 1)]
for how in hows:
    for busy in (False, True):
        alone(how, busy)
def split_lock():
    """The whole buffer locked portable from one thread, against each GPU locking its half in
    its own context at once (a thread each), GPUs idle."""
    t0 = time.perf_counter()
    bind(0)
    lock(1)
    t1 = time.perf_counter()
    unlock()
    half = host.nbytes // 2
    done = {}

    def part(d):
        bind(d)
        a = time.perf_counter()
        r = cuda.cuMemHostRegister_v2(host.ctypes.data + d * half, half, 0)
        assert r == 0, f"cuMemHostRegister: {r}"
        done[d] = time.perf_counter() - a

    t2 = time.perf_counter()
    threads = [threading.Thread(target=part, args=(d,)) for d in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t3 = time.perf_counter()
    for d in (0, 1):
        bind(d)
        assert cuda.cuMemHostUnregister(host.ctypes.data + d * half) == 0
    print(f"{MB} MB locked portable: {ms(t1, t0):.1f} ms; halves, each in its GPU's context at "
          f"once: {ms(t3, t2):.1f} ms (" + ", ".join(f"{v * 1e3:.1f}" for v in done.values())
          + ")", flush=True)


split_lock()
split_lock()
for rep in range(2):
    for work in ("launch", "alloc", "alloc async", "upload"):
        for how in [None] + hows:
            case(how, work)
