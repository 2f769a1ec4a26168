"""How fast the host writes fresh memory (first touch: a page fault and a zeroed page per 4 KiB)
against warm memory and against memory advised to use transparent huge pages (2 MiB pages,
`madvise(MADV_HUGEPAGE)`): the bound on copying results from pinned staging into a fresh output.

Usage: python3 bench/gpu/host_pages.py [MiB] [threads]
"""
import ctypes
import mmap
import sys
import threading
import time

import numpy as np

MADV_HUGEPAGE = 14
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def fresh(nbytes, huge):
    m = mmap.mmap(-1, nbytes + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, dtype=np.uint8)
    if huge:
        addr = a.ctypes.data
        start = (addr + (2 << 20) - 1) & ~((2 << 20) - 1)
        rc = libc.madvise(start, nbytes, MADV_HUGEPAGE)
        assert rc == 0, ctypes.get_errno()
        off = start - addr
    else:
        off = 0
    return m, a[off:off + nbytes]


def copy(dst, src, threads):
    parts = np.array_split(np.arange(len(dst)), threads)
    def one(p):
        dst[p[0]:p[-1] + 1] = src[p[0]:p[-1] + 1]
    ts = [threading.Thread(target=one, args=(p,)) for p in parts]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return time.perf_counter() - t


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    nb = mib << 20
    src = np.random.default_rng(0).integers(0, 255, nb, dtype=np.uint8)
    for path in ["enabled", "defrag"]:
        try:
            print(path, open(f"/sys/kernel/mm/transparent_hugepage/{path}").read().strip())
        except OSError as e:
            print(path, e)
    for threads in [1, 4, 8]:
        for what in ["warm", "fresh 4K", "fresh huge"]:
            ts = []
            for _ in range(5):
                m, dst = fresh(nb, what == "fresh huge")
                if what == "warm":
                    dst[:] = 1
                ts.append(copy(dst, src, threads))
                del dst
                m.close()
            t = sorted(ts)[2]
            print(f"{mib} MiB, {threads} threads, {what:>10}: {t * 1e3:6.1f} ms ({nb / t / 1e9:5.1f} GB/s)")


if __name__ == "__main__":
    main()
