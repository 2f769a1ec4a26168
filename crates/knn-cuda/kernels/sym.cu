// Symmetric self-join for kNN graphs (seeds 001, 002): the key of each unordered pair of the n
// points P is computed once, in a tile of the fused kernels' product, and folded into both
// points' lists: by row into the block's lists in shared memory, by column into the partner
// rows' lists in global memory. Compiled as a module of its own (common.cuh, tiles.cu, fused.cu,
// this file, -DKNN_MODULE_ONLY), loaded on the first symmetric graph.
//
// Schedule: T = ceil(n / BQ) tiles. Tile b meets the tiles J = (b + dist) mod T for dist in
// 0..=H_b, H_b = (T-1)/2, plus T/2 when T is even and b < T/2: every pair of distinct tiles
// exactly once (from the side whose forward distance is the shorter), and dist 0 is b's own
// diagonal tile, whose pairs i != j are all taken by row. Block x = b * nsplit + s takes split
// s of those distances: s, s + nsplit, s + 2 nsplit, ... (so that a point's neighbours spread
// over the splits), starting at a point of that range of its own (so that the blocks that run at
// once mostly meet different partners at each step).
//
// Output: 2 * nsplit lists per point (composites, each sorted, SENTINEL-padded, W entries),
// list y of point p at runs[(p * 2 * nsplit + y) * W + i]:
// - y = s: split s's list of p by row (in shared memory while p's tile is the block's);
// - y = nsplit + s: what split s's blocks folded into p by column, in global memory, under the
//   lock locks[J * nsplit + s] of p's tile J. Those lists' W-th entries, read without the lock
//   (stale values are larger: still bounds), pre-filter the columns; only a tile with a passing
//   column takes the lock.
// Each list keeps its Ws smallest (Ws <= W; Ws < W: truncated, as the fused kernels' splits).
// Every key a list left out is at least its final Ws-th entry, which goes into cut[p] (row lists
// here, column lists by `sym_cut`): the union of a point's lists holds every key below
// min(its W-th, cut[p]).

// Column c of the key tile for the warp's column fold: lane l holds rows l + 32j (the tile's key
// of row r, column c at work[r * RS + c * CS]: conflict-free in either layout).
template <int RS, int CS>
__device__ __forceinline__ void column_keys(const float* work, int c, float kv[BQ / 32]) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < BQ / 32; j++) kv[j] = work[(lane + 32 * j) * RS + c * CS];
}

// Point p's list by column of split s.
__device__ __forceinline__ u64* col_list(u64* runs, long long p, int nsplit, int s, int W) {
    return runs + (p * 2 * nsplit + nsplit + s) * (long long)W;
}

template <int KERNEL, int S, bool TF>
__device__ void sym_topk(const float* __restrict__ P, const float* __restrict__ pn, long long n,
                         int d, int W, int Ws, int nsplit, u64* __restrict__ runs,
                         int* __restrict__ locks, u64* __restrict__ cut) {
    // The key tile as the fused kernels' thread-per-row fold reads it (column-major for TF32),
    // followed by the rows' candidate buffers.
    constexpr int RS = TF ? 1 : TSTRIDE, CS = TF ? TSC : 1;
    constexpr int TILE_FLOATS = BQ * (TF ? TS_TF : TSTRIDE + CBUF / 4);
    const int LW = 32 * S;
    extern __shared__ __align__(16) unsigned char smem[];
    u64* lists = (u64*)smem;
    float* work = (float*)(lists + BQ * LW);
    unsigned char* buf = (unsigned char*)(work + BQ * (TF ? TSC : TSTRIDE));
    u64* scratch = (u64*)(work + TILE_FLOATS);  // a list row per warp, for column folds
    float* colthr = (float*)(scratch + (THREADS / 32) * LW);
    unsigned* grp = (unsigned*)(colthr + BB);  // per group of 4 columns: which columns pass
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    long long T = (n + BQ - 1) / BQ;
    long long b = blockIdx.x / nsplit;
    int s = blockIdx.x % nsplit;
    long long q0 = b * BQ;
    int nrows = (int)min((long long)BQ, n - q0);
    long long H = (T - 1) / 2 + ((T % 2 == 0 && b < T / 2) ? 1 : 0);
    for (int i = tid; i < BQ * LW; i += THREADS) lists[i] = SENTINEL;
    for (int i = tid; i < (THREADS / 32) * LW; i += THREADS) scratch[i] = SENTINEL;
    RowList L = {SENTINEL, 0, 0};  // row tid's list (threads tid < nrows)

    // Visits start at a different point of the range in each split: blocks (b, s) and
    // (b + 1, s - 1), which run at once, would otherwise want the same partner at every step.
    long long cnt = s <= H ? (H - s) / nsplit + 1 : 0, start = cnt * s / nsplit;
    for (long long t = 0; t < cnt; t++) {
        long long dist = s + nsplit * ((t + start) % cnt);
        long long J = (b + dist) % T;
        long long p0 = J * BB;
        int ncols = (int)min((long long)BB, n - p0);
        // The partner rows' thresholds (their lists' Ws-th keys; -inf past n), read before the
        // product hides the latency.
        if (dist != 0 && tid < BB) {
            float t = __int_as_float(0xff800000);
            if (tid < ncols) t = composite_key(__ldcg(&col_list(runs, p0 + tid, nsplit, s, W)[Ws - 1]));
            colthr[tid] = t;
        }
        if (tid < 32) grp[tid] = 0;
        keys_to_smem<KERNEL, TF, TF>(P, pn, n, q0, P, pn, n, p0, d, 1, work);
        __syncthreads();
        bool pass = false;
        if (tid < BQ) {
            // Rows, one thread each (a point never takes itself).
            if (tid < nrows)
                fold_tile_thread<RS, CS, (S >= ROW_HEAP)>(work, lists, buf, tid, q0 + tid, ncols,
                                                          (u32)p0, 1u, (u32)(q0 + tid), Ws,
                                                          SENTINEL, nullptr, Ws < W, L);
        } else if (dist != 0) {
            // Column filter, one thread per column meanwhile: does any of the tile's rows pass
            // the partner's threshold? (Columns past n never pass: a NaN key would.)
            int c = tid - BQ;
            if (c < ncols) {
                float th = colthr[c];
                for (int r = 0; r < nrows && !pass; r += 8) {
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        pass |= r + i < nrows && !(work[(r + i) * RS + c * CS] > th);
                }
                if (pass) atomicOr(&grp[c >> 2], 1u << (c & 3));
            }
        }
        if (dist != 0 && __syncthreads_or(pass)) {
            if (tid == 0) {
                while (atomicCAS(&locks[J * nsplit + s], 0, 1) != 0) __nanosleep(64);
                __threadfence();
            }
            __syncthreads();
            u64* mine_row = scratch + warp * LW;
            for (int g = warp; g < 32; g += THREADS / 32) {
                unsigned gm = grp[g];
                for (int x = 0; x < 4; x++) {
                    if (!((gm >> x) & 1u)) continue;
                    int c = 4 * g + x;
                    float kv[BQ / 32];
                    column_keys<RS, CS>(work, c, kv);
                    u64* pl = col_list(runs, p0 + c, nsplit, s, W);
                    u64 e[S];
#pragma unroll
                    for (int t = 0; t < S; t++) {
                        int i = t * 32 + lane;
                        e[t] = i < W ? __ldcg(&pl[i]) : SENTINEL;
                    }
                    u64 cv[BQ / 32];
#pragma unroll
                    for (int j = 0; j < BQ / 32; j++) {
                        int r = lane + 32 * j;
                        cv[j] = r < nrows ? composite(kv[j], (u32)(q0 + r)) : SENTINEL;
                    }
                    if (fold_row<S>(e, cv, SENTINEL, Ws, lane, mine_row)) {
#pragma unroll
                        for (int t = 0; t < S; t++) {
                            int i = t * 32 + lane;
                            if (i < W) __stcg(&pl[i], e[t]);
                        }
                    }
                }
            }
            __syncthreads();
            if (tid == 0) {
                __threadfence();
                atomicExch(&locks[J * nsplit + s], 0);
            }
        }
        __syncthreads();  // the key tile becomes staging again
    }
    // Each row's list, sorted by one warp, SENTINEL-padded to W.
    for (int r = warp; r < nrows; r += THREADS / 32) {
        u64 e[S];
        if constexpr (S == 1) {
            e[0] = warp_sort(lane < Ws ? lists[lane * BQ + r] : SENTINEL, lane);
        } else {
#pragma unroll
            for (int t = 0; t < S; t++) e[t] = SENTINEL;
#pragma unroll
            for (int t = 0; t < S; t++) {
                int j = t * 32 + lane;
                if (t * 32 < Ws) warp_merge<S>(e, j < Ws ? lists[j * BQ + r] : SENTINEL, Ws, lane);
            }
        }
        u64* o = runs + ((q0 + r) * 2 * nsplit + s) * (long long)W;
#pragma unroll
        for (int t = 0; t < S; t++)
            if (t * 32 + lane < W) o[t * 32 + lane] = e[t];
        for (int i = 32 * S + lane; i < W; i += 32) o[i] = SENTINEL;
        u64 last = warp_kth<S>(e, Ws);
        if (Ws < W && lane == 0 && last != SENTINEL) atomicMin(&cut[q0 + r], last);
    }
}

// Folds the column lists' final Ws-th entries into cut (one thread per point; Ws < W).
extern "C" __global__ void sym_cut(const u64* __restrict__ runs, long long n, int nsplit, int W,
                                   int Ws, u64* __restrict__ cut) {
    long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n) return;
    u64 c = cut[p];
    for (int s = 0; s < nsplit; s++) {
        u64 v = runs[(p * 2 * nsplit + nsplit + s) * (long long)W + Ws - 1];
        c = min(c, v);
    }
    cut[p] = c;
}

// Shared memory: BQ*32*S u64 lists, the key tile and the rows' candidate buffers (TF32: BQ*TS_TF
// floats; FP32: BQ*TSTRIDE floats and BQ*CBUF bytes), 8 warps' list rows, BB column thresholds
// and 32 group masks.
#define SYM(NAME, K, S, TF)                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, (S) == 1 && (TF) ? 2 : 1) NAME(         \
        const float* __restrict__ P, const float* __restrict__ pn, long long n, int d, int W,      \
        int Ws, int nsplit, u64* __restrict__ runs, int* __restrict__ locks,                       \
        u64* __restrict__ cut) {                                                                   \
        sym_topk<K, S, TF>(P, pn, n, d, W, Ws, nsplit, runs, locks, cut);                          \
    }
SYM(sym_tf32_sql2_w32, KERNEL_SQL2, 1, true)
SYM(sym_tf32_sql2_w64, KERNEL_SQL2, 2, true)
SYM(sym_tf32_sql2_w128, KERNEL_SQL2, 4, true)
SYM(sym_tf32_negdot_w32, KERNEL_NEGDOT, 1, true)
SYM(sym_tf32_negdot_w64, KERNEL_NEGDOT, 2, true)
SYM(sym_tf32_negdot_w128, KERNEL_NEGDOT, 4, true)
SYM(sym_l1_w32, KERNEL_L1, 1, false)
SYM(sym_l1_w64, KERNEL_L1, 2, false)
SYM(sym_l1_w128, KERNEL_L1, 4, false)
SYM(sym_linf_w32, KERNEL_LINF, 1, false)
SYM(sym_linf_w64, KERNEL_LINF, 2, false)
SYM(sym_linf_w128, KERNEL_LINF, 4, false)

// ---- Collect form (TF32 GEMM kernels): no lists while the pairs are met ----
// The fold above spends its time in insertions (each of a point's lists meets its candidates
// one by one, under locks for the columns). Here every point p first gets a threshold hi[p]
// from a sample of the points (`*_thr`); then each unordered pair's key is computed once (the
// schedule above) and appended to the buffer of each of its two points whose threshold it does
// not exceed, through a queue in shared memory; then a warp per point sorts its buffer
// (`sym_collect_finish`). Appends are rare (about r·q of n per point), so the pass costs about
// the product. Whatever the data, the result is sound: a point's buffer holds every key at
// most hi[p] unless it overflowed, and `cut` says what its list may miss.

#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)

// The largest |x| of x (len floats) as bits, folded into *out by atomicMax (the bits of
// non-negative floats order like them); *out starts at 0.
extern "C" __global__ void abs_max_bits(const float* __restrict__ x, long long len,
                                        unsigned* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    unsigned m = 0;
    for (; i < len; i += stride) m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(out, m);
}

// The scale of `round_f16` for a largest magnitude of bits `maxbits`: 2^(14 − e) for the
// magnitude's binary exponent e, so that every scaled value is below 2^15 (f16's largest finite
// value is 65504); at most 2^127. The host takes the same (`f16_scale`).
__device__ __forceinline__ float f16_scale(unsigned maxbits) {
    int e = (int)(maxbits >> 23) - 127;  // subnormal magnitudes (and 0) read as -127
    int k = min(14 - e, 127);
    return __int_as_float((k + 127) << 23);
}

// out = the n × d rows of x scaled by f16_scale(*maxbits) and rounded to nearest f16, each row
// padded with zeros to dp halves (dp % 8 == 0: dp / 2 words, a multiple of 4, for cp.async).
// |x̃ − x·s| ≤ 2⁻¹¹|x·s| + 2⁻²⁵ (f16's subnormal spacing is 2⁻²⁴).
extern "C" __global__ void round_f16(const float* __restrict__ x, long long n, int d, int dp,
                                     const unsigned* __restrict__ maxbits,
                                     unsigned short* __restrict__ out) {
    float sc = f16_scale(*maxbits);
    long long len = n * dp;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < len; i += stride) {
        long long row = i / dp;
        int col = (int)(i - row * dp);
        float v = col < d ? x[row * d + col] * sc : 0.f;
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        out[i] = h;
    }
}

// hi[p] = the r-th smallest key of point p (< n) against the sample points m·q (m < S, m·q ≠ p),
// +inf when there are fewer. One block per tile of BQ points, from tile b0 on (several GPUs
// each take a range of tiles); thread (half, row) keeps the r
// smallest keys of its row against the tile's columns of that half, unsorted in shared memory
// (the largest is its threshold); the two halves' lists are joined at the end. P̃: the points
// rounded to TF32 (H16: `round_f16`'s rows, d words each, products times us²). Shared memory:
// BQ·TS_TF floats (staging, then the key tile), 2·r·BQ floats.
template <int KERNEL, bool H16>
__device__ void sample_thresholds(const float* __restrict__ Pt, const float* __restrict__ pn,
                                  long long n, int d, int q, long long S, int r,
                                  float* __restrict__ hi, float us, long long b0) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* work = (float*)smem;
    int tid = threadIdx.x, row = tid & (BQ - 1), half = tid >> 7;
    float* kept = work + BQ * TS_TF + half * r * BQ + row;  // kept[j * BQ], j < r
    long long q0 = (b0 + blockIdx.x) * BQ, p = q0 + row;
    bool mine = p < n;
    float thr = POS_INF;
    int arg = 0;
    for (int j = 0; j < r; j++) kept[j * BQ] = POS_INF;
    for (long long m0 = 0; m0 < S; m0 += BB) {
        keys_to_smem<KERNEL, true, true, true, H16>(Pt, pn, n, q0, Pt, pn, S, m0, d, q, work, us);
        __syncthreads();
        if (mine) {
            int c0 = half * (BB / 2), c1 = (int)min((long long)c0 + BB / 2, S - m0);
            for (int c = c0; c < c1; c++) {
                float k = work[c * TSC + row];
                if (k < thr && (m0 + c) * q != p) {
                    kept[arg * BQ] = k;
                    thr = kept[0];
                    arg = 0;
                    for (int j = 1; j < r; j++) {
                        float v = kept[j * BQ];
                        if (v > thr) {
                            thr = v;
                            arg = j;
                        }
                    }
                }
            }
        }
        __syncthreads();  // the key tile becomes staging again
    }
    if (mine && half == 0) {
        // The r-th smallest of both halves' 2r keys: the v with #(< v) < r ≤ #(≤ v).
        float best = POS_INF;
        for (int a = 0; a < 2 * r; a++) {
            float v = kept[a * BQ];  // half 1's list follows half 0's
            int lt = 0, le = 0;
            for (int j = 0; j < 2 * r; j++) {
                float u = kept[j * BQ];
                lt += u < v;
                le += u <= v;
            }
            if (lt < r && r <= le) best = v;
        }
        hi[p] = best;
    }
}

// Appends composite c to point p's buffer (cap slots; the count goes on past cap, so that an
// overflow is seen). Not inlined: the queue's overflow path, rarely taken.
__device__ __noinline__ void collect(u32* __restrict__ cnt, u64* __restrict__ buf, int cap,
                                     long long p, u64 c) {
    u32 slot = atomicAdd(&cnt[p], 1u);
    if (slot < (u32)cap) buf[p * cap + slot] = c;
}

// The block's queue of appends in shared memory: taking a slot is a shared atomic (the global
// ones, whose round trips would stall the product's warps, wait for `flush`).
#ifndef COLLECT_QUEUE
#define COLLECT_QUEUE 2048
#endif
struct Queue {
    u64* comp;
    u32* point;
    int* count;
};

__device__ __forceinline__ void push(Queue q, u32* __restrict__ cnt, u64* __restrict__ buf,
                                     int cap, long long p, u64 c) {
    int s = atomicAdd(q.count, 1);
    if (s < COLLECT_QUEUE) {
        q.comp[s] = c;
        q.point[s] = (u32)p;
    } else {
        collect(cnt, buf, cap, p, c);
    }
}

// Moves the queue into the buffers (all threads; the caller syncs before and after). Four
// appends per thread and step, so that their atomics' round trips overlap.
__device__ __forceinline__ void flush(Queue q, u32* __restrict__ cnt, u64* __restrict__ buf,
                                      int cap) {
    int m = min(*q.count, COLLECT_QUEUE);
    for (int i0 = threadIdx.x; i0 < m; i0 += 4 * THREADS) {
        u32 slot[4], pt[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = i0 + u * THREADS;
            pt[u] = i < m ? q.point[i] : 0u;
            slot[u] = i < m ? atomicAdd(&cnt[pt[u]], 1u) : (u32)cap;
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (slot[u] < (u32)cap) buf[(long long)pt[u] * cap + slot[u]] = q.comp[i0 + u * THREADS];
    }
}

// Every unordered pair {i, j} of the n points once (tile b meets tiles b + dist, dist = s,
// s + nsplit, ... ≤ H_b, as `sym_topk`; blocks from tile b0 on: every tile has (T − 1) / 2
// partners or one more, so GPUs that each take a range of tiles share the pairs evenly), its key appended to i's buffer when ≤ hi[i] and to
// j's when ≤ hi[j]; a diagonal tile's pairs i ≠ j by row only. P̃: the points rounded to TF32
// (d % 4 == 0, 16-byte aligned: the staging is cp.async's; H16: `round_f16`'s rows, d words
// each, products times us²). Shared memory: the staging and key tile (BQ · TS_TF floats), the
// rows' and columns' thresholds (2 · BQ floats), the queue (COLLECT_QUEUE u64 and u32) and its
// count.
template <int KERNEL, bool H16>
__device__ void collect_pairs(const float* __restrict__ Pt, const float* __restrict__ pn,
                              long long n, int d, int nsplit, const float* __restrict__ hi,
                              u32* __restrict__ cnt, int cap, u64* __restrict__ buf, float us,
                              long long b0) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* work = (float*)smem;
    float* rh = work + BQ * TS_TF;  // after the staging and key tile
    float* ch = rh + BQ;
    Queue queue = {(u64*)(ch + BB), nullptr, nullptr};
    queue.point = (u32*)(queue.comp + COLLECT_QUEUE);
    queue.count = (int*)(queue.point + COLLECT_QUEUE);
    int tid = threadIdx.x;
    long long T = (n + BQ - 1) / BQ;
    long long b = b0 + blockIdx.x / nsplit;
    int s = blockIdx.x % nsplit;
    long long q0 = b * BQ;
    long long H = (T - 1) / 2 + ((T % 2 == 0 && b < T / 2) ? 1 : 0);
    if (tid < BQ) {
        bool ok = q0 + tid < n;
        rh[tid] = ok ? hi[q0 + tid] : NEG_INF;  // rows past n take nothing
    }
    if (tid == 0) *queue.count = 0;
    for (long long dist = s; dist <= H; dist += nsplit) {
        long long J = (b + dist) % T, p0 = J * BB;
        if (tid >= BQ) {
            int c = tid - BQ;
            bool ok = p0 + c < n;
            // Columns past n take nothing, nor do a diagonal tile's (its pairs go by row).
            ch[c] = ok && dist != 0 ? hi[p0 + c] : NEG_INF;
        }
        // The key tile (column-major), then a thread per row and half of the columns.
        keys_to_smem<KERNEL, true, true, true, H16>(Pt, pn, n, q0, Pt, pn, n, p0, d, 1, work, us);
        __syncthreads();
        {
            int row = tid & (BQ - 1), c0 = (tid >> 7) * (BB / 2);
            float tr = rh[row];
            bool live = q0 + row < n;
#pragma unroll 8
            for (int c = c0; c < c0 + BB / 2; c++) {
                float key = work[c * TSC + row], tc = ch[c];
                // One test for both sides (almost every key fails it), then each side's.
                if (key <= fmaxf(tr, tc)) {
                    // A row past n has a -inf threshold; a column past n, or of the diagonal
                    // tile, too.
                    if (key <= tr && p0 + c < n && (dist != 0 || row != c))
                        push(queue, cnt, buf, cap, q0 + row, composite(key, (u32)(p0 + c)));
                    if (key <= tc && live)
                        push(queue, cnt, buf, cap, p0 + c, composite(key, (u32)(q0 + row)));
                }
            }
        }
        __syncthreads();  // the staging, the column values and the queue's count are taken again
        // Flushed when half full (a tile adds about 2·BQ·BB·r·q/n: ~130 at n = 80 000).
        if (*queue.count >= COLLECT_QUEUE / 2 || dist + nsplit > H) {
            flush(queue, cnt, buf, cap);
            __syncthreads();
            if (tid == 0) *queue.count = 0;
        }
    }
}

// Sorts x[0..len) (len a power of two ≥ 32) ascending, by the calling warp.
__device__ __forceinline__ void warp_bitonic(u64* x, int len, int lane) {
    for (int size = 2; size <= len; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int u = lane; u < len / 2; u += 32) {
                int lo = 2 * u - (u & (stride - 1)), up = lo + stride;
                u64 a = x[lo], v = x[up];
                if ((a > v) == ((lo & size) == 0)) {
                    x[lo] = v;
                    x[up] = a;
                }
            }
            __syncwarp();
        }
}

// Fills x[m..want) of a sorted list x[0..m) (len ≥ m a power of two ≥ 32, x[m..len) SENTINEL,
// room for a power of two ≥ want) with points other than p (of n) at key +inf, not already in
// x[0..m), and sorts it again; returns the new len. Rare (lists short of W): lane 0 searches.
__device__ int fill_list(u64* x, int m, int len, int want, long long p, long long n, int lane) {
    if (lane == 0) {
        int f = m;
        for (long long id = (p + 1) % n; f < want; id = (id + 1) % n) {
            bool taken = id == p;
            for (int j = 0; j < m && !taken; j++) taken = (u32)x[j] == (u32)id;
            if (!taken) x[f++] = composite(POS_INF, (u32)id);
        }
    }
    __syncwarp();
    while (len < want) {
        for (int i = len + lane; i < 2 * len; i += 32) x[i] = i < want ? x[i] : SENTINEL;
        len <<= 1;
    }
    warp_bitonic(x, len, lane);
    return len;
}

// Point p's list (blockDim.x / 32 points per block, one warp each): the W smallest of its
// buffer, sorted (a bitonic sort in shared memory, cap u64 per warp), SENTINEL-padded; and
// cut[p], a lower bound of every composite the list misses: none (SENTINEL) when the buffer
// held every key ≤ hi[p] and at least W of them, (hi[p], NO_ID) when it held fewer (a key it
// missed is above hi[p], or NaN), (-inf, 0) (nothing proven; the pipeline retries the point)
// when it overflowed. A list short of W is filled up (`fill_list`) unless `part`: a GPU's
// part of the pairs, whose lists are merged with the other parts' before `sym_fill`.
extern "C" __global__ void sym_collect_finish(const u64* __restrict__ buf,
                                              const u32* __restrict__ cnt, int cap, long long n,
                                              int W, const float* __restrict__ hi,
                                              u64* __restrict__ lists, u64* __restrict__ cut,
                                              int part) {
    extern __shared__ u64 sorted[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long p = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    if (p >= n) return;
    u64* x = sorted + (long long)warp * cap;
    u32 c = cnt[p];
    int m = (int)min(c, (u32)cap);
    int len = 32;
    while (len < m) len <<= 1;
    for (int i = lane; i < len; i += 32) x[i] = i < m ? buf[p * cap + i] : SENTINEL;
    __syncwarp();
    warp_bitonic(x, len, lane);
    // Fewer than W (rare): the list is filled up with other points at key +inf, so that every
    // slot holds a real point for the exact keys (their TF32 keys are unknown; +inf keeps the
    // W-th key from bounding anything, and the cut below gives the floor).
    int want = (int)min((long long)W, n - 1);
    if (m < want && !part) {
        fill_list(x, m, len, want, p, n, lane);
        m = want;
    }
    for (int i = lane; i < W; i += 32) lists[p * W + i] = i < m ? x[i] : SENTINEL;
    if (lane == 0) {
        float h = hi[p];
        cut[p] = c > (u32)cap ? composite(NEG_INF, 0u) : c >= (u32)W ? SENTINEL : composite(h, NO_ID);
    }
}

// Rows p0 .. p0 + rows of merged part lists (`lists`, W ≤ 128 composites per row, sorted,
// SENTINEL after the real entries) filled up as `sym_collect_finish` fills a list short of W:
// one warp per row, 128 u64 of shared memory per warp.
extern "C" __global__ void sym_fill(u64* __restrict__ lists, long long rows, long long p0,
                                    long long n, int W) {
    __shared__ u64 rowbuf[8 * 128];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long r = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    if (r >= rows) return;
    u64* row = lists + r * W;
    int want = (int)min((long long)W, n - 1);
    if (want == 0 || row[want - 1] != SENTINEL) return;  // full (the common case)
    u64* x = rowbuf + warp * 128;
    int m = 0;
    for (int i = lane; i < W; i += 32) {
        u64 v = row[i];
        x[i] = v;
        m += v != SENTINEL;
    }
    for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(0xffffffffu, m, o);
    int len = 32;
    while (len < m) len <<= 1;
    for (int i = m + lane; i < len; i += 32) x[i] = SENTINEL;
    __syncwarp();
    fill_list(x, m, len, want, p0 + r, n, lane);
    for (int i = lane; i < W; i += 32) row[i] = i < want ? x[i] : SENTINEL;
}

#define COLLECT(NAME, K, H16)                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS, 2) NAME##_thr(                          \
        const float* __restrict__ Pt, const float* __restrict__ pn, long long n, int d, int q,     \
        long long S, int r, float* __restrict__ hi, float us, long long b0) {                      \
        sample_thresholds<K, H16>(Pt, pn, n, d, q, S, r, hi, us, b0);                              \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS, 2) NAME(                                \
        const float* __restrict__ Pt, const float* __restrict__ pn, long long n, int d,            \
        int nsplit, const float* __restrict__ hi, u32* __restrict__ cnt, int cap,                  \
        u64* __restrict__ buf, float us, long long b0) {                                           \
        collect_pairs<K, H16>(Pt, pn, n, d, nsplit, hi, cnt, cap, buf, us, b0);                    \
    }
// (TF32-rounded points, H16 = false, lost to f16 in the collect form: NOTES.md, stop 17.)
COLLECT(sym_collect_f16_sql2, KERNEL_SQL2, true)
COLLECT(sym_collect_f16_negdot, KERNEL_NEGDOT, true)
