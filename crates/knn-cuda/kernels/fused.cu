// Fused method, lists: each key tile of tiles.cu folded into its queries' running top-W lists
// (warp-held sorted lists for W <= 128, thread-per-row heaps, shared thresholds), the kernels'
// entry points, the merge of split lists, and the key-tile kernels of wide lists.

// Inserts composite cv (cv < current W-th entry) into a warp's sorted list held as e[s] at list
// index s*32 + lane; entries at index >= W stay SENTINEL.
template <int S>
__device__ __forceinline__ void warp_insert(u64 e[S], u64 cv, int W, int lane) {
    int pos = 0;
#pragma unroll
    for (int s = 0; s < S; s++) pos += __popc(__ballot_sync(0xffffffffu, e[s] < cv));
    u64 prev[S];
#pragma unroll
    for (int s = 0; s < S; s++) {
        u64 up = __shfl_up_sync(0xffffffffu, e[s], 1);
        u64 wrap = (s > 0) ? __shfl_sync(0xffffffffu, e[s > 0 ? s - 1 : 0], 31) : SENTINEL;
        prev[s] = (lane == 0) ? wrap : up;
    }
#pragma unroll
    for (int s = 0; s < S; s++) {
        int idx = s * 32 + lane;
        u64 nv = idx < pos ? e[s] : (idx == pos ? cv : prev[s]);
        e[s] = idx < W ? nv : SENTINEL;
    }
}

// Sorts one value per lane ascending across the warp (bitonic network, 15 exchange steps).
__device__ __forceinline__ u64 warp_sort(u64 v, int lane) {
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            u64 o = __shfl_xor_sync(0xffffffffu, v, j);
            bool keep_min = ((lane & j) == 0) == ((lane & k) == 0);
            v = keep_min ? min(v, o) : max(v, o);
        }
    return v;
}

// Sorts a bitonic sequence held one value per lane ascending (5 exchange steps).
__device__ __forceinline__ u64 warp_clean(u64 v, int lane) {
#pragma unroll
    for (int j = 16; j > 0; j >>= 1) {
        u64 o = __shfl_xor_sync(0xffffffffu, v, j);
        v = (lane & j) == 0 ? min(v, o) : max(v, o);
    }
    return v;
}

// Sorts N independent warp-wide runs at once (warp_sort on each; interleaved for latency).
template <int N>
__device__ __forceinline__ void warp_sort_n(u64 v[N], int lane) {
#pragma unroll
    for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
        for (int j = k >> 1; j > 0; j >>= 1) {
            bool keep_min = ((lane & j) == 0) == ((lane & k) == 0);
#pragma unroll
            for (int n = 0; n < N; n++) {
                u64 o = __shfl_xor_sync(0xffffffffu, v[n], j);
                v[n] = keep_min ? min(v[n], o) : max(v[n], o);
            }
        }
}

// The 32 smallest of two ascending warp-wide runs, ascending: min(a, reversed b) is bitonic.
__device__ __forceinline__ u64 warp_lower(u64 a, u64 b, int lane) {
    return warp_clean(min(a, __shfl_sync(0xffffffffu, b, 31 - lane)), lane);
}

// Merges 32 candidates ascending across the lanes (SENTINEL for none) into the sorted list e
// (index s*32 + lane), keeping the W smallest: slot by slot, the lower half of (slot ∪ b) stays
// and the upper half moves on (min / max of a sorted and a reversed sorted run are bitonic).
template <int S>
__device__ __forceinline__ void warp_merge_sorted(u64 e[S], u64 b, int W, int lane) {
#pragma unroll
    for (int s = 0; s < S; s++) {
        u64 br = __shfl_sync(0xffffffffu, b, 31 - lane);
        u64 lo = min(e[s], br), hi = max(e[s], br);
        e[s] = warp_clean(lo, lane);
        b = warp_clean(hi, lane);
    }
#pragma unroll
    for (int s = 0; s < S; s++)
        if (s * 32 + lane >= W) e[s] = SENTINEL;
}

// warp_merge_sorted of 32 candidates in any order.
template <int S>
__device__ __forceinline__ void warp_merge(u64 e[S], u64 v, int W, int lane) {
    warp_merge_sorted<S>(e, warp_sort(v, lane), W, lane);
}

// Row tiles are first filtered against float thresholds, all rows of a warp at once (0: every
// row goes through the composite comparison, as before 2026-11-23; for A/B).
#ifndef ROW_FILTER
#define ROW_FILTER 1
#endif
// 1: no insertions at all (wrong results; measures the product and the filter alone).
#ifndef SELECT_OFF
#define SELECT_OFF 0
#endif
// Chunks with at least this many candidates below the threshold are merged as a batch.
#ifndef BATCH_MIN
#define BATCH_MIN 6
#endif
// A split's first tile (empty list, W <= 32) goes through a merge tree (0: the batch path).
#ifndef TREE_FIRST
#define TREE_FIRST 1
#endif
// Row tiles with at most this many candidates below the threshold insert them by rank.
#ifndef RANK_MAX
#define RANK_MAX 64
#endif

// Inserts the candidates cv[j] of the lanes set in m[j] (all below the list's W-th entry, none
// already in it) into the sorted list e (index s*32 + lane), keeping the W smallest, through the
// row's copy in shared memory (`row`, 32*S slots, slots >= W hold SENTINEL and stay so). Every
// element's new index is its rank in the union: a list entry's index plus the candidates below
// it, a candidate's count of list entries below it plus the candidates below it. Each candidate
// costs one broadcast and S ballots, independent of the others (no serial shifting chain).
template <int S>
__device__ __forceinline__ void rank_insert(u64 e[S], const u64 cv[BB / 32],
                                            const unsigned m[BB / 32], int W, int lane, u64* row) {
    int ce[S], cr[BB / 32], lp[BB / 32];
#pragma unroll
    for (int s = 0; s < S; s++) ce[s] = 0;
#pragma unroll
    for (int j = 0; j < BB / 32; j++) {
        cr[j] = 0;
        lp[j] = 0;
    }
#pragma unroll
    for (int j = 0; j < BB / 32; j++) {
        unsigned mask = m[j];
        while (mask) {
            int src = __ffs(mask) - 1;
            mask &= mask - 1;
            u64 b = __shfl_sync(0xffffffffu, cv[j], src);
            int below = 0;
#pragma unroll
            for (int s = 0; s < S; s++) {
                below += __popc(__ballot_sync(0xffffffffu, e[s] < b));
                ce[s] += b < e[s] ? 1 : 0;
            }
            if (lane == src) lp[j] = below;
#pragma unroll
            for (int jj = 0; jj < BB / 32; jj++) cr[jj] += b < cv[jj] ? 1 : 0;
        }
    }
    __syncwarp();  // every lane has its entries in registers before the row is rewritten
#pragma unroll
    for (int s = 0; s < S; s++) {
        int idx = s * 32 + lane + ce[s];
        if (idx < W) row[idx] = e[s];
    }
#pragma unroll
    for (int j = 0; j < BB / 32; j++) {
        int idx = lp[j] + cr[j];
        if (((m[j] >> lane) & 1u) && idx < W) row[idx] = cv[j];
    }
    __syncwarp();
#pragma unroll
    for (int s = 0; s < S; s++) e[s] = row[s * 32 + lane];
}

template <int S>
__device__ __forceinline__ u64 warp_kth(const u64 e[S], int W) {
    int t = W - 1;
    u64 v = e[0];
#pragma unroll
    for (int s = 1; s < S; s++)
        if ((t >> 5) == s) v = e[s];
    return __shfl_sync(0xffffffffu, v, t & 31);
}

// Folds the candidates cv (lane's entries j*32 + lane, SENTINEL for none) below min(the list's
// Ws-th entry, g) into the sorted list e (index s*32 + lane) whose shared-memory copy is `row`
// (32*S slots; slots >= Ws hold SENTINEL and stay so), keeping the Ws smallest. Afterwards `row`
// holds e. Returns false, changing nothing, when no candidate is below.
template <int S>
__device__ __forceinline__ bool fold_row(u64 e[S], const u64 cv[BB / 32], u64 g, int Ws, int lane,
                                         u64* row) {
    u64 thr = min(warp_kth<S>(e, Ws), g);
    unsigned m[BB / 32];
    int total = 0;
#pragma unroll
    for (int j = 0; j < BB / 32; j++) {
        m[j] = __ballot_sync(0xffffffffu, cv[j] < thr);
        total += __popc(m[j]);
    }
    if (total == 0) return false;
    if (S == 1 && TREE_FIRST && total > RANK_MAX && warp_kth<S>(e, 1) == SENTINEL) {
        // An empty list (a split's first tile) and many candidates: the smallest 32 of the
        // tile by four independent sorts and a merge tree, then truncated to Ws.
        u64 c[BB / 32];
#pragma unroll
        for (int j = 0; j < BB / 32; j++) c[j] = cv[j] < thr ? cv[j] : SENTINEL;
        warp_sort_n<BB / 32>(c, lane);
        u64 lo = warp_lower(warp_lower(c[0], c[1], lane), warp_lower(c[2], c[3], lane), lane);
        e[0] = lane < Ws ? lo : SENTINEL;
        row[lane] = e[0];
    } else if (total <= RANK_MAX) {
        rank_insert<S>(e, cv, m, Ws, lane, row);
    } else {
        // Many candidates (the first tiles): chunk by chunk, batches by sorting networks,
        // stragglers one by one, the threshold tightening as the list fills.
#pragma unroll
        for (int j = 0; j < BB / 32; j++) {
            unsigned mask = __ballot_sync(0xffffffffu, cv[j] < thr);
            if (__popc(mask) >= BATCH_MIN) {
                warp_merge<S>(e, cv[j] < thr ? cv[j] : SENTINEL, Ws, lane);
                thr = min(warp_kth<S>(e, Ws), g);
                continue;
            }
            while (mask) {
                int src = __ffs(mask) - 1;
                u64 v = __shfl_sync(0xffffffffu, cv[j], src);
                warp_insert<S>(e, v, Ws, lane);
                thr = min(warp_kth<S>(e, Ws), g);
                mask &= ~(1u << src);
                mask &= __ballot_sync(0xffffffffu, cv[j] < thr);
            }
        }
#pragma unroll
        for (int s = 0; s < S; s++) row[s * 32 + lane] = e[s];
    }
    return true;
}

// The float value of a composite's key (+inf for SENTINEL).
__device__ __forceinline__ float composite_key(u64 c) {
    u32 hi = (u32)(c >> 32);
    if (hi == 0xFFFFFFFFu) return __int_as_float(0x7f800000);
    return __uint_as_float((hi & 0x80000000u) ? (hi & 0x7FFFFFFFu) : ~hi);
}

// Folds the key tile `work` (row r: query q0 + r < nq; column c < ncols: base id
// id0 + step * c; row stride TS) into the block's row lists (`lists`, 32*S slots per row, the
// Ws smallest kept). Warp w takes rows r = w + 8i, first filtered against float thresholds (the
// list's Ws-th, or the shared threshold gpre of lane i when lower) in one pass over the tile with
// independent loads; rows with no key at or below skip the insertion step. A key equal to the
// threshold (or NaN) passes the filter and is decided by the exact composite comparison. A row
// never takes its own id: exclude[q] when exclude is set, else q itself when self_join. A list
// that improves folds its new Ws-th into gthr[q] (may be null; not read under truncation).
template <int S, int TS>
__device__ __forceinline__ void fold_tile_rows(const float* work, u64* lists, long long q0,
                                               long long nq, int ncols, u32 id0, u32 step,
                                               const u32* __restrict__ exclude, bool self_join,
                                               int Ws, u64 gpre, u64* gthr, bool trunc) {
    const int LW = 32 * S;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned rows = 0xFFFFu;
    if (ROW_FILTER) {
        float thrf = __int_as_float(0x7f800000);  // +inf: an empty list takes anything
        if (lane < BQ / 8) thrf = composite_key(min(lists[(warp + 8 * lane) * LW + Ws - 1], gpre));
        unsigned mine = 0;
#pragma unroll
        for (int i = 0; i < BQ / 8; i++) {
            float t = __shfl_sync(0xffffffffu, thrf, i);
            const float* row = work + (warp + 8 * i) * TS;
            bool pass;
            if constexpr (TS % 4 == 0) {
                float4 v = *(const float4*)&row[4 * lane];
                pass = !(v.x > t) || !(v.y > t) || !(v.z > t) || !(v.w > t);
            } else {
                pass = !(row[lane] > t) || !(row[32 + lane] > t) || !(row[64 + lane] > t) ||
                       !(row[96 + lane] > t);
            }
            mine |= pass ? 1u << i : 0u;
        }
#if __CUDA_ARCH__ >= 800
        rows = __reduce_or_sync(0xffffffffu, mine);
#else
        rows = 0;
#pragma unroll
        for (int i = 0; i < BQ / 8; i++)
            rows |= __ballot_sync(0xffffffffu, (mine >> i) & 1u) ? 1u << i : 0u;
#endif
    }
    if (SELECT_OFF) rows = 0;
    {
        long long left = nq - q0 - warp;  // rows r = warp + 8i < nq - q0
        if (left <= 0)
            rows = 0;
        else if (left < 8 * (BQ / 8))
            rows &= (1u << (int)((left + 7) / 8)) - 1u;
    }
    while (rows) {
        int ri = __ffs(rows) - 1;
        rows &= rows - 1;
        int r = warp + 8 * ri;
        long long q = q0 + r;
        u64 g = __shfl_sync(0xffffffffu, gpre, ri);
        u32 skip = exclude ? exclude[q] : (self_join ? (u32)q : NO_ID);
        u64 e[S];
#pragma unroll
        for (int s = 0; s < S; s++) e[s] = lists[r * LW + s * 32 + lane];
        u64 cv[BB / 32];
#pragma unroll
        for (int j = 0; j < BB / 32; j++) {
            int c = j * 32 + lane;
            u32 id = id0 + step * (u32)c;
            cv[j] = (c < ncols && id != skip) ? composite(work[r * TS + c], id) : SENTINEL;
        }
        if (!fold_row<S>(e, cv, g, Ws, lane, lists + r * LW)) continue;
        u64 own = warp_kth<S>(e, Ws);
        if (gthr && !trunc && lane == 0 && own < g) atomicMin(&gthr[q], own);
    }
}

// Lists of 32·S entries with S <= THREAD_ROWS are folded one thread per row (`fold_tile_thread`),
// larger ones one warp per row in turn (`fold_tile_rows`); 0: all by warps, as before 2026-11-23.
#ifndef THREAD_ROWS
#define THREAD_ROWS 4
#endif
// Lists of 32·S entries with S >= ROW_HEAP are max-heaps in the thread-per-row fold (an
// insertion sifts down from the root), smaller ones unsorted (the worst entry found again by a
// scan after each insertion). Case 1 (lists of 32): scan 0.316 ms, heap 0.326-0.331 ms.
#ifndef ROW_HEAP
#define ROW_HEAP 2
#endif

// A row's list in the thread-per-row fold: its entries sit in shared memory at lists[j * BQ + r]
// (j < fill <= Ws), in no order while filling, then as a max-heap (HEAP) or unsorted with
// `wslot` the slot of the largest; `worst` is the largest entry once full (SENTINEL before).
struct RowList {
    u64 worst;
    int wslot;
    int fill;
};

// The largest of the Ws entries of row r's list (independent loads, no chain through memory).
__device__ __forceinline__ void rescan_worst(const u64* lists, int r, int Ws, RowList& L) {
    u64 w = lists[r];
    int ws = 0;
#pragma unroll 4
    for (int j = 1; j < Ws; j++) {
        u64 v = lists[j * BQ + r];
        if (v > w) {
            w = v;
            ws = j;
        }
    }
    L.worst = w;
    L.wslot = ws;
}

// Places v at node j of row r's max-heap of n entries (children of j: 2j + 1, 2j + 2), moving
// larger children up (the entries are distinct composites).
__device__ __forceinline__ void heap_sift_down(u64* lists, int r, int n, int j, u64 v) {
    for (;;) {
        int c = 2 * j + 1;
        if (c >= n) break;
        u64 a = lists[c * BQ + r];
        if (c + 1 < n) {
            u64 b = lists[(c + 1) * BQ + r];
            if (b > a) {
                a = b;
                c++;
            }
        }
        if (a <= v) break;
        lists[j * BQ + r] = a;
        j = c;
    }
    lists[j * BQ + r] = v;
}

// Takes cv (below the list's worst entry, or the list not full) into row r's list of Ws.
template <bool HEAP>
__device__ __forceinline__ void row_take(u64* lists, int r, int Ws, u64 cv, RowList& L) {
    if (L.fill < Ws) {
        lists[L.fill * BQ + r] = cv;
        if (++L.fill < Ws) return;
        if (HEAP) {
            for (int j = Ws / 2 - 1; j >= 0; j--) heap_sift_down(lists, r, Ws, j, lists[j * BQ + r]);
            L.worst = lists[r];
        } else {
            rescan_worst(lists, r, Ws, L);
        }
    } else if (HEAP) {
        heap_sift_down(lists, r, Ws, 0, cv);
        L.worst = lists[r];
    } else {
        lists[L.wslot * BQ + r] = cv;
        rescan_worst(lists, r, Ws, L);
    }
}

// Folds row r (query q) of the key tile into its list, one thread per row: the row's key of column
// c sits at work[r * RS + c * CS] (RS = TSTRIDE, CS = 1 for the row-major FP32 tile; RS = 1,
// CS = TSC for the column-major TF32 one: either way a warp's 32 rows hit 32 banks). Keys are
// read 8 at a time and the columns of those not above the float threshold (the list's worst
// entry when full, or g when lower; NaN passes) are collected in the row's buffer
// (buf[i * BQ + r], CBUF columns); a full buffer, and the last one, are then decided by the exact
// composite comparison, each taken key replacing the worst entry, which is found again.
// Collecting first keeps the lanes in step: inserting as keys are met would serialise the warp
// over every column any of its 32 rows takes. Column c's id is id0 + step * c; `skip` is never
// taken. A list that improves folds its Ws-th into gthr[q] (may be null; not under truncation).
#define CBUF 16
template <int RS, int CS, bool HEAP>
__device__ __forceinline__ void fold_tile_thread(const float* work, u64* lists, unsigned char* buf,
                                                 int r, long long q, int ncols, u32 id0, u32 step,
                                                 u32 skip, int Ws, u64 g, u64* gthr, bool trunc,
                                                 RowList& L) {
    u64 lim = min(L.worst, g);
    float thrf = composite_key(lim);
    bool changed = false;
    for (int c0 = 0; c0 < ncols;) {
        int m = 0;
        for (; c0 < ncols && m <= CBUF - 8; c0 += 8) {
            float k[8];
#pragma unroll
            for (int i = 0; i < 8; i++) k[i] = work[r * RS + (c0 + i) * CS];  // c0 + i < BB
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (!(k[i] > thrf) && c0 + i < ncols) buf[m++ * BQ + r] = (unsigned char)(c0 + i);
        }
        for (int i = 0; i < m; i++) {
            int c = buf[i * BQ + r];
            u32 id = id0 + step * (u32)c;
            u64 cv = composite(work[r * RS + c * CS], id);
            if (cv < lim && id != skip) {
                changed = true;
                row_take<HEAP>(lists, r, Ws, cv, L);
                lim = min(L.worst, g);
                thrf = composite_key(lim);
            }
        }
    }
    if (changed && gthr && !trunc && L.worst < g) atomicMin(&gthr[q], L.worst);
}

// One block: BQ queries x one split of the base. A split is the rows [y*split_len, +split_len)
// of this chunk (y = blockIdx.y), or, when `strided`, the rows y, y + nsplit, y + 2·nsplit, ...
// (nsplit = gridDim.y), so that neighbours stored next to each other spread over the splits.
// Each split keeps its top Ws (Ws <= W, Ws <= 32*S) and writes them, SENTINEL-padded to W, to
// out[(q * gridDim.y + split) * W + i].
// - Ws == W: entries above the shared per-query threshold gthr[q] (may be null; the smallest
//   W-th key any split has reached) are dropped, so a split's list may hold fewer than W real
//   entries, but the union always holds the true top W.
// - Ws < W (truncated splits): gthr is only read (a bound primed from earlier base chunks), and
//   every key a split left out is at least its final Ws-th entry, which the block folds into
//   cut[q] (atomicMin). The union's top W then holds every key below min(its W-th, cut[q]):
//   the floor the host proves against.
// Base ids are id_base + chunk row. exclude (may be null) is indexed by local query row.
// Dynamic shared memory: BQ*32*S u64 lists, then BQ*TSTRIDE floats (BQ*TS_TF when TF).
template <int KERNEL, int S, bool TF>
__device__ void fused_topk(const float* __restrict__ Q, const float* __restrict__ qn, long long nq,
                           const float* __restrict__ B, const float* __restrict__ bn, long long nb,
                           u32 id_base, int d, const u32* __restrict__ exclude, int W, int Ws,
                           long long split_len, int strided, u64* __restrict__ out,
                           u64* __restrict__ gthr, u64* __restrict__ cut) {
    constexpr int TS = TF ? TS_TF : TSTRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    u64* lists = (u64*)smem;
    float* work = (float*)(lists + BQ * 32 * S);
    const int LW = 32 * S;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    long long q0 = (long long)blockIdx.x * BQ;
    const bool trunc = Ws < W;
    long long s0, step, len;  // split rows: s0 + step * c for c in [0, len)
    if (strided) {
        s0 = blockIdx.y;
        step = gridDim.y;
        len = nb > s0 ? (nb - s0 + step - 1) / step : 0;
    } else {
        s0 = (long long)blockIdx.y * split_len;
        step = 1;
        len = max(0LL, min(split_len, nb - s0));
    }
    const float* Bs = B + s0 * d;
    const float* bns = bn + s0;
    for (int i = tid; i < BQ * LW; i += THREADS) lists[i] = SENTINEL;

    if constexpr (S <= THREAD_ROWS) {
        // One thread per row (threads tid < BQ), its list as `RowList` says.
        constexpr int RS = TF ? 1 : TSTRIDE, CS = TF ? TSC : 1;
        // The rows' candidate buffers follow the key tile (the host allots them).
        unsigned char* buf = (unsigned char*)(work + BQ * (TF ? TSC : TSTRIDE));
        const int r = tid;
        const long long q = q0 + r;
        const bool mine = r < BQ && q < nq;
        const u32 skip = mine && exclude ? exclude[q] : NO_ID;
        RowList L = {SENTINEL, 0, 0};
        for (long long b0 = 0; b0 < len; b0 += BB) {
            // See below: the shared threshold, loaded before the product hides its latency.
            u64 g = SENTINEL;
            if (gthr && mine) g = *(volatile u64*)&gthr[q];
            keys_to_smem<KERNEL, TF, TF>(Q, qn, nq, q0, Bs, bns, len, b0, d, (int)step, work);
            __syncthreads();
            int ncols = (int)min((long long)BB, len - b0);
            if (mine)
                fold_tile_thread<RS, CS, (S >= ROW_HEAP)>(work, lists, buf, r, q, ncols,
                                         id_base + (u32)(s0 + step * b0), (u32)step, skip, Ws, g,
                                         gthr, trunc, L);
            __syncthreads();  // the key tile becomes staging again
        }
        // Each row's list, sorted by one warp, SENTINEL-padded to W.
        for (int r2 = warp; r2 < BQ; r2 += THREADS / 32) {
            long long q2 = q0 + r2;
            if (q2 >= nq) break;
            u64 e[S];
            if constexpr (S == 1) {
                e[0] = warp_sort(lane < Ws ? lists[lane * BQ + r2] : SENTINEL, lane);
            } else {
#pragma unroll
                for (int s = 0; s < S; s++) e[s] = SENTINEL;
#pragma unroll
                for (int s = 0; s < S; s++) {
                    int j = s * 32 + lane;
                    if (s * 32 < Ws) warp_merge<S>(e, j < Ws ? lists[j * BQ + r2] : SENTINEL, Ws, lane);
                }
            }
            u64* o = out + (q2 * gridDim.y + blockIdx.y) * (long long)W;
#pragma unroll
            for (int s = 0; s < S; s++)
                if (s * 32 + lane < W) o[s * 32 + lane] = e[s];
            for (int i = 32 * S + lane; i < W; i += 32) o[i] = SENTINEL;
            u64 last = warp_kth<S>(e, Ws);
            if (trunc && cut && lane == 0 && last != SENTINEL) atomicMin(&cut[q2], last);
        }
        return;
    }

    for (long long b0 = 0; b0 < len; b0 += BB) {
        // gthr[q]: the smallest W-th key any split of this query has reached (truncated
        // splits: only the primed bound of earlier base chunks). The union's W-th key is at
        // most that, so larger candidates can never be selected. Loaded for the warp's 16 rows
        // (lane i: row warp + 8i) before the tile's product hides the latency; a stale value
        // is still a valid bound.
        u64 gpre = SENTINEL;
        if (gthr && lane < BQ / 8 && q0 + warp + 8 * lane < nq)
            gpre = *(volatile u64*)&gthr[q0 + warp + 8 * lane];
        keys_to_smem<KERNEL, TF>(Q, qn, nq, q0, Bs, bns, len, b0, d, (int)step, work);
        __syncthreads();
        int ncols = (int)min((long long)BB, len - b0);
        fold_tile_rows<S, TS>(work, lists, q0, nq, ncols, id_base + (u32)(s0 + step * b0),
                              (u32)step, exclude, false, Ws, gpre, gthr, trunc);
        __syncthreads();  // the key tile becomes staging again
    }
    for (int r = warp; r < BQ; r += THREADS / 32) {
        long long q = q0 + r;
        if (q >= nq) break;
        u64* o = out + (q * gridDim.y + blockIdx.y) * (long long)W;
        for (int i = lane; i < W; i += 32) o[i] = i < LW ? lists[r * LW + i] : SENTINEL;
        if (trunc && cut && lane == 0 && lists[r * LW + Ws - 1] != SENTINEL)
            atomicMin(&cut[q], lists[r * LW + Ws - 1]);
    }
}

// Top W of the union of sorted composite lists (W <= 32*S), one warp per (row, group of runs):
// row `row` has `runs` runs of W entries at a[(row * runs + r) * W + i] and, when b is not null,
// one more at b[row * W + i]. Group g of the row's groups = max(1, ceil(runs / group)) merges
// runs [g * group, min(runs, (g + 1) * group)) (and b, when g = 0) into out[(row * groups + g) *
// W + i], sorted, SENTINEL-padded: group >= runs gives one list per row, and a smaller group
// splits a long chain of runs (one warp reads them one after another) over several warps,
// whose lists a second pass merges. Runs are sorted, so a run is read only up to its first
// 32-entry chunk with nothing below the current W-th entry.
#define MERGE_AHEAD 8

// Run t of merge_runs' chain: run r0 + t of the row's `runs` in a, or b past r1.
__device__ __forceinline__ const u64* merge_run(const u64* __restrict__ a, int runs, int r0, int r1,
                                                const u64* __restrict__ b, long long row, int W,
                                                int t) {
    return r0 + t < r1 ? a + (row * runs + r0 + t) * (long long)W : b + row * (long long)W;
}

template <int S>
__device__ void merge_runs(const u64* __restrict__ a, int runs, int group, const u64* __restrict__ b,
                           long long n, int W, u64* __restrict__ out) {
    int lane = threadIdx.x & 31;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int groups = max(1, (runs + group - 1) / group);
    long long row = warp / groups;
    int g = (int)(warp % groups);
    if (row >= n) return;
    int r0 = g * group, r1 = min(runs, r0 + group);
    u64 e[S];
#pragma unroll
    for (int s = 0; s < S; s++) e[s] = SENTINEL;
    int total = (r1 - r0) + (b && g == 0 ? 1 : 0);
    // The first chunks of MERGE_AHEAD runs are loaded at once: one run after another, each
    // load's latency was the chain's (two passes over 528 runs: 16 µs each on an H200).
    for (int t0 = 0; t0 < total; t0 += MERGE_AHEAD) {
        u64 first[MERGE_AHEAD];
#pragma unroll
        for (int u = 0; u < MERGE_AHEAD; u++)
            first[u] = t0 + u < total && lane < W ? merge_run(a, runs, r0, r1, b, row, W, t0 + u)[lane]
                                                   : SENTINEL;
#pragma unroll
        for (int u = 0; u < MERGE_AHEAD; u++) {
            if (t0 + u >= total) break;
            const u64* run = merge_run(a, runs, r0, r1, b, row, W, t0 + u);
            bool go = true;
#pragma unroll
            for (int s = 0; s < S; s++) {
                if (go && s * 32 < W) {
                    int i = s * 32 + lane;
                    u64 v = s == 0 ? first[u] : i < W ? run[i] : SENTINEL;
                    u64 thr = warp_kth<S>(e, W);
                    unsigned mask = __ballot_sync(0xffffffffu, v < thr);
                    // The chunk is ascending, so is its part below thr followed by SENTINELs.
                    if (mask)
                        warp_merge_sorted<S>(e, v < thr ? v : SENTINEL, W, lane);
                    else
                        go = false;
                }
            }
        }
    }
    u64* o = out + (row * groups + g) * (long long)W;
#pragma unroll
    for (int s = 0; s < S; s++) {
        int i = s * 32 + lane;
        if (i < W) o[i] = e[s];
    }
}

#define MERGE(NAME, S)                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                    \
        const u64* __restrict__ a, int runs, int group, const u64* __restrict__ b, long long n,    \
        int W, u64* __restrict__ out) {                                                            \
        merge_runs<S>(a, runs, group, b, n, W, out);                                               \
    }
#ifndef KNN_MODULE_ONLY  // expression modules use these from the main module
MERGE(merge_w32, 1)
MERGE(merge_w64, 2)
MERGE(merge_w128, 4)
#endif

// TF32 kernels with lists of 32 leave room for two blocks per SM (shared memory 102 KB each):
// registers are capped at 128 so that they do too (no spills; the FP32 ones would spill).
#define FUSED(NAME, K, S, TF)                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS, (S) == 1 && (TF) ? 2 : 1) NAME(         \
        const float* __restrict__ Q, const float* __restrict__ qn, long long nq,                   \
        const float* __restrict__ B, const float* __restrict__ bn, long long nb, u32 id_base,      \
        int d, const u32* __restrict__ exclude, int W, int Ws, long long split_len, int strided,   \
        u64* __restrict__ out, u64* __restrict__ gthr, u64* __restrict__ cut) {                    \
        fused_topk<K, S, TF>(Q, qn, nq, B, bn, nb, id_base, d, exclude, W, Ws, split_len, strided, \
                             out, gthr, cut);                                                      \
    }
#ifndef KNN_MODULE_ONLY  // expression modules instantiate their own (kernels/expr.cu)
FUSED(fused_sql2_w32, KERNEL_SQL2, 1, false)
FUSED(fused_sql2_w64, KERNEL_SQL2, 2, false)
FUSED(fused_sql2_w128, KERNEL_SQL2, 4, false)
FUSED(fused_negdot_w32, KERNEL_NEGDOT, 1, false)
FUSED(fused_negdot_w64, KERNEL_NEGDOT, 2, false)
FUSED(fused_negdot_w128, KERNEL_NEGDOT, 4, false)
FUSED(fused_l1_w32, KERNEL_L1, 1, false)
FUSED(fused_l1_w64, KERNEL_L1, 2, false)
FUSED(fused_l1_w128, KERNEL_L1, 4, false)
FUSED(fused_linf_w32, KERNEL_LINF, 1, false)
FUSED(fused_linf_w64, KERNEL_LINF, 2, false)
FUSED(fused_linf_w128, KERNEL_LINF, 4, false)
FUSED(fused_tf32_sql2_w32, KERNEL_SQL2, 1, true)
FUSED(fused_tf32_sql2_w64, KERNEL_SQL2, 2, true)
FUSED(fused_tf32_sql2_w128, KERNEL_SQL2, 4, true)
FUSED(fused_tf32_negdot_w32, KERNEL_NEGDOT, 1, true)
FUSED(fused_tf32_negdot_w64, KERNEL_NEGDOT, 2, true)
FUSED(fused_tf32_negdot_w128, KERNEL_NEGDOT, 4, true)
#endif

// Key tile to global memory (the large-width path): keys[q * ld + b] for the nq x nb block.
// Grid: (ceil(nq/BQ), ceil(nb/BB)); shared memory 2*KC*SPAD floats.
template <int KERNEL>
__device__ void tile_keys(const float* __restrict__ Q, const float* __restrict__ qn, long long nq,
                          const float* __restrict__ B, const float* __restrict__ bn, long long nb,
                          int d, long long ld, float* __restrict__ keys) {
    __shared__ __align__(16) float work[2 * KC * SPAD];
    int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    long long q0 = (long long)blockIdx.x * BQ, b0 = (long long)blockIdx.y * BB;
    float acc[8][8];
    tile_compute<KERNEL>(Q, nq, q0, B, nb, b0, d, d, work, acc);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        long long q = q0 + tile_row(ty, i);
        if (q >= nq) continue;
        float qv = KERNEL == KERNEL_SQL2 ? qn[q] : 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            long long b = b0 + tile_row(tx, j);
            if (b < nb) keys[q * ld + b] = finish_key<KERNEL>(acc[i][j], qv, KERNEL == KERNEL_SQL2 ? bn[b] : 0.f);
        }
    }
}

#define TILE(NAME, K)                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                    \
        const float* __restrict__ Q, const float* __restrict__ qn, long long nq,                   \
        const float* __restrict__ B, const float* __restrict__ bn, long long nb, int d,            \
        long long ld, float* __restrict__ keys) {                                                  \
        tile_keys<K>(Q, qn, nq, B, bn, nb, d, ld, keys);                                           \
    }
#ifndef KNN_MODULE_ONLY  // expression modules instantiate their own (kernels/expr.cu)
TILE(tile_sql2, KERNEL_SQL2)
TILE(tile_negdot, KERNEL_NEGDOT)
TILE(tile_l1, KERNEL_L1)
TILE(tile_linf, KERNEL_LINF)
#endif

// Threshold filter (the large-width path): computes the key tile of queries [q0, +BQ) x base
// rows [b0, +BB) and appends every composite below the query's current W-th one
// (running[q * W + W - 1]; all of them when running is null) to buf[q * cap + slot], slot from
// count[q] (atomic). Slots past cap are counted but not stored: the host sees the overflow.
// Grid: (ceil(nq/BQ), ceil(nb/BB)). Dynamic shared memory: BQ*TSTRIDE floats (BQ*TS_TF if TF).
template <int KERNEL, bool TF>
__device__ void filter_keys(const float* __restrict__ Q, const float* __restrict__ qn, long long nq,
                            const float* __restrict__ B, const float* __restrict__ bn, long long nb,
                            u32 id_base, int d, const u32* __restrict__ exclude,
                            const u64* __restrict__ running, int W, int cap,
                            u64* __restrict__ buf, u32* __restrict__ count) {
    constexpr int TS = TF ? TS_TF : TSTRIDE;
    extern __shared__ __align__(16) unsigned char smem[];
    float* work = (float*)smem;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    long long q0 = (long long)blockIdx.x * BQ, b0 = (long long)blockIdx.y * BB;
    // Thresholds and excluded ids of the warp's 16 rows (lane i: row warp + 8i), loaded before
    // the product so that their latency is hidden.
    u64 tpre = SENTINEL;
    u32 xpre = NO_ID;
    if (lane < BQ / 8 && q0 + warp + 8 * lane < nq) {
        long long q = q0 + warp + 8 * lane;
        if (running) tpre = running[q * W + W - 1];
        if (exclude) xpre = exclude[q];
    }
    keys_to_smem<KERNEL, TF>(Q, qn, nq, q0, B, bn, nb, b0, d, 1, work);
    __syncthreads();
    int ncols = (int)min((long long)BB, nb - b0);
    for (int r = warp, ri = 0; r < BQ; r += THREADS / 32, ri++) {
        long long q = q0 + r;
        u64 thr = __shfl_sync(0xffffffffu, tpre, ri);
        u32 skip = __shfl_sync(0xffffffffu, xpre, ri);
        if (q >= nq) break;
#pragma unroll
        for (int j = 0; j < BB / 32; j++) {
            int c = j * 32 + lane;
            u32 id = id_base + (u32)(b0 + c);
            bool keep = false;
            u64 cv = SENTINEL;
            if (c < ncols && id != skip) {
                cv = composite(work[r * TS + c], id);
                keep = cv < thr;
            }
            unsigned m = __ballot_sync(0xffffffffu, keep);
            if (m) {
                u32 base = 0;
                if (lane == 0) base = atomicAdd(&count[q], (u32)__popc(m));
                base = __shfl_sync(0xffffffffu, base, 0);
                u32 slot = base + __popc(m & ((1u << lane) - 1u));
                if (keep && slot < (u32)cap) buf[q * (long long)cap + slot] = cv;
            }
        }
    }
}

#define FILTER(NAME, K, TF)                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                    \
        const float* __restrict__ Q, const float* __restrict__ qn, long long nq,                   \
        const float* __restrict__ B, const float* __restrict__ bn, long long nb, u32 id_base,      \
        int d, const u32* __restrict__ exclude, const u64* __restrict__ running, int W, int cap,   \
        u64* __restrict__ buf, u32* __restrict__ count) {                                          \
        filter_keys<K, TF>(Q, qn, nq, B, bn, nb, id_base, d, exclude, running, W, cap, buf,        \
                           count);                                                                 \
    }
#ifndef KNN_MODULE_ONLY  // expression modules instantiate their own (kernels/expr.cu)
FILTER(filter_sql2, KERNEL_SQL2, false)
FILTER(filter_negdot, KERNEL_NEGDOT, false)
FILTER(filter_l1, KERNEL_L1, false)
FILTER(filter_linf, KERNEL_LINF, false)
FILTER(filter_tf32_sql2, KERNEL_SQL2, true)
FILTER(filter_tf32_negdot, KERNEL_NEGDOT, true)
#endif

#ifndef KNN_MODULE_ONLY
// Primes the shared thresholds: gthr[i] = W-th composite of row i of n sorted W-lists, plus one
// (kept entries are strictly below it; an unfilled row keeps SENTINEL).
extern "C" __global__ void prime_thresholds(const u64* __restrict__ lists, long long n, int W,
                                            u64* __restrict__ gthr) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 v = lists[i * W + W - 1];
    gthr[i] = v == SENTINEL ? SENTINEL : v + 1;
}
#endif
