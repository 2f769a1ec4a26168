// Symmetric self-join for kNN graphs (seeds 001, 002): the key of each unordered pair of the n
// points P is computed once, in a tile of the fused kernels' product, and folded into both
// points' lists: by row into the block's lists in shared memory, by column into the partner
// rows' lists in global memory. Compiled as a module of its own (common.cuh, fused.cu, this
// file, -DKNN_MODULE_ONLY), loaded on the first symmetric graph.
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
