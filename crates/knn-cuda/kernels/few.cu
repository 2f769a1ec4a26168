// Few queries against the base (`fused/few.rs`): one warp per base row, the queries' keys by
// warp reductions. Part of the main program, after kernels/fused.cu (whose list primitives it
// uses).

// Few queries (at most NQ per block: 1, or 4) against one split of the base, W <= 32*S: reading the
// base once, where a 128-query tile would spend its products on empty rows.
// Each warp takes rows of the split one at a time (lanes read the row's coordinates, coalesced),
// forms each query's key by a warp reduction (another summation order than the tiles', within
// the same bounds: src/floor.rs) and folds every 32 rows' keys into that query's sorted list;
// the block's 8 lists per query are merged in shared memory at the end. Writes the split's top
// W, SENTINEL-padded, to out[(q * gridDim.y + split) * W + i], like fused_topk with Ws == W:
// nothing truncated, no shared threshold, cut untouched. The split is the rows
// [y * split_len, +split_len) of this chunk (y = blockIdx.y); base ids are id_base + chunk row;
// exclude (may be null) is indexed by query row. Grid (ceil(nq / NQ), splits), 256 threads;
// dynamic shared memory 8 * NQ * 32 * S u64 (the warps' lists), then NQ * d floats.
// A lone query has kernels of its own (NQ = 1): a block of 4 spends 4 sums and 4 reductions
// on every row whatever the count.
// The warp's total of each lane's v (sums, or maxima for L∞), in every lane.
template <int KERNEL>
__device__ __forceinline__ float warp_total(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = KERNEL == KERNEL_LINF ? fmaxf(v, o) : v + o;
    }
    return v;
}

// Each query's key accumulation of rows 0..rows (< 32) of R (d values each, row-major) into
// lane j's mine[] for row j: lanes read the row's coordinates lane, lane + 32, ... and the warp
// adds them up, a row at a time.
template <int KERNEL, int NQ>
__device__ __forceinline__ void row_sums(const float* __restrict__ R, int rows, int d,
                                         const float* qs, int lane, float mine[NQ]) {
#pragma unroll 4
    for (int j = 0; j < rows; j++) {
        const float* row = R + (long long)j * d;
        float acc[NQ];
#pragma unroll
        for (int qi = 0; qi < NQ; qi++) acc[qi] = 0.f;
        for (int c = lane; c < d; c += 32) {
            float bv = row[c];
#pragma unroll
            for (int qi = 0; qi < NQ; qi++) acc[qi] = op<KERNEL>(acc[qi], qs[qi * d + c], bv);
        }
#pragma unroll
        for (int qi = 0; qi < NQ; qi++) {
            float t = warp_total<KERNEL>(acc[qi]);
            if (lane == j) mine[qi] = t;
        }
    }
}

// row_sums for d a multiple of 4 and R, qs 16-byte aligned: lanes read 16-byte pieces (lane,
// lane + 32, ...) of ROWS rows at once, so that a warp has that many rows' loads in flight (8
// for one query; 4 for four, whose sums take the registers). Another summation order than
// row_sums' (any order is within the same bound: src/floor.rs).
template <int KERNEL, int NQ>
__device__ __forceinline__ void row_sums_x4(const float* __restrict__ R, int rows, int d,
                                            const float* qs, int lane, float mine[NQ]) {
    constexpr int FEW_ROWS = NQ == 1 ? 8 : 4;
    const int d4 = d >> 2;
    const float4* R4 = reinterpret_cast<const float4*>(R);
    const float4* q4 = reinterpret_cast<const float4*>(qs);
    for (int j0 = 0; j0 < rows; j0 += FEW_ROWS) {
        float acc[FEW_ROWS][NQ];
#pragma unroll
        for (int u = 0; u < FEW_ROWS; u++)
#pragma unroll
            for (int qi = 0; qi < NQ; qi++) acc[u][qi] = 0.f;
        for (int c = lane; c < d4; c += 32) {
            float4 bv[FEW_ROWS];
#pragma unroll
            for (int u = 0; u < FEW_ROWS; u++)
                bv[u] = j0 + u < rows ? __ldg(R4 + (long long)(j0 + u) * d4 + c)
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int qi = 0; qi < NQ; qi++) {
                float4 qv = q4[qi * d4 + c];
#pragma unroll
                for (int u = 0; u < FEW_ROWS; u++) {
                    float a = acc[u][qi];
                    a = op<KERNEL>(a, qv.x, bv[u].x);
                    a = op<KERNEL>(a, qv.y, bv[u].y);
                    a = op<KERNEL>(a, qv.z, bv[u].z);
                    acc[u][qi] = op<KERNEL>(a, qv.w, bv[u].w);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < FEW_ROWS; u++)
#pragma unroll
            for (int qi = 0; qi < NQ; qi++) {
                float t = warp_total<KERNEL>(acc[u][qi]);
                if (lane == j0 + u) mine[qi] = t;
            }
    }
}

template <int KERNEL, int S, int NQ>
__device__ void few_topk(const float* __restrict__ Q, const float* __restrict__ qn, long long nq,
                         const float* __restrict__ B, const float* __restrict__ bn, long long nb,
                         u32 id_base, int d, const u32* __restrict__ exclude, int W,
                         long long split_len, u64* __restrict__ out) {
    constexpr int WARPS = THREADS / 32, LW = 32 * S;
    extern __shared__ __align__(16) unsigned char smem[];
    u64* lists = (u64*)smem;  // [warp][query][LW]
    float* qs = (float*)(lists + WARPS * NQ * LW);
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    long long q0 = (long long)blockIdx.x * NQ;
    int nqb = (int)min((long long)NQ, nq - q0);
    for (int i = tid; i < NQ * d; i += THREADS) {
        int qi = i / d;
        qs[i] = qi < nqb ? Q[(q0 + qi) * d + (i - qi * d)] : 0.f;
    }
    float qnv[NQ];
    u32 skip[NQ];
#pragma unroll
    for (int qi = 0; qi < NQ; qi++) {
        qnv[qi] = qi < nqb ? qn[q0 + qi] : 0.f;
        skip[qi] = qi < nqb && exclude ? exclude[q0 + qi] : NO_ID;
    }
    __syncthreads();
    long long s0 = (long long)blockIdx.y * split_len;
    long long len = max(0LL, min(split_len, nb - s0));
    long long per = (len + WARPS - 1) / WARPS;
    long long w0 = s0 + warp * per, w1 = min(s0 + len, w0 + per);
    u64 e[NQ][S];
#pragma unroll
    for (int qi = 0; qi < NQ; qi++)
#pragma unroll
        for (int s = 0; s < S; s++) e[qi][s] = SENTINEL;
    // Rows read as 16-byte pieces, several of them in flight per warp, when rows and queries are
    // aligned to 16 bytes (d a multiple of 4): a row at a time, a warp kept too few bytes in
    // flight to read the base at more than ~60 % of the bandwidth (one query vs 10⁶ × 128 on
    // an H200: 181 µs against 107 µs to read it).
    const bool wide = (d & 3) == 0 && ((unsigned long long)B & 15) == 0;
    for (long long r0 = w0; r0 < w1; r0 += 32) {
        int rows = (int)min(32LL, w1 - r0);
        float mine[NQ];  // lane j: the keys' accumulations of row r0 + j
#pragma unroll
        for (int qi = 0; qi < NQ; qi++) mine[qi] = 0.f;
        if (wide)
            row_sums_x4<KERNEL, NQ>(B + r0 * d, rows, d, qs, lane, mine);
        else
            row_sums<KERNEL, NQ>(B + r0 * d, rows, d, qs, lane, mine);
        bool valid = lane < rows;
        float bnv = valid ? bn[r0 + lane] : 0.f;
        u32 id = id_base + (u32)(r0 + lane);
#pragma unroll
        for (int qi = 0; qi < NQ; qi++) {
            if (qi >= nqb) break;
            u64 cv = valid && id != skip[qi]
                         ? composite(finish_key<KERNEL>(mine[qi], qnv[qi], bnv), id)
                         : SENTINEL;
            u64 thr = warp_kth<S>(e[qi], W);
            if (__ballot_sync(0xffffffffu, cv < thr))
                warp_merge<S>(e[qi], cv < thr ? cv : SENTINEL, W, lane);
        }
    }
#pragma unroll
    for (int qi = 0; qi < NQ; qi++)
#pragma unroll
        for (int s = 0; s < S; s++) lists[(warp * NQ + qi) * LW + s * 32 + lane] = e[qi][s];
    __syncthreads();
    // Warp qi merges the block's lists of query qi (each sorted; a chunk's part below the
    // current W-th entry is ascending, followed by SENTINELs).
    if (warp < nqb) {
        int qi = warp;
        u64 m[S];
#pragma unroll
        for (int s = 0; s < S; s++) m[s] = lists[qi * LW + s * 32 + lane];
        for (int ww = 1; ww < WARPS; ww++) {
#pragma unroll
            for (int s = 0; s < S; s++) {
                u64 v = lists[(ww * NQ + qi) * LW + s * 32 + lane];
                u64 thr = warp_kth<S>(m, W);
                if (__ballot_sync(0xffffffffu, v < thr))
                    warp_merge_sorted<S>(m, v < thr ? v : SENTINEL, W, lane);
            }
        }
        u64* o = out + ((q0 + qi) * gridDim.y + blockIdx.y) * (long long)W;
#pragma unroll
        for (int s = 0; s < S; s++)
            if (s * 32 + lane < W) o[s * 32 + lane] = m[s];
    }
}

// A lone query's kernels run 4 blocks per SM (their registers capped to allow it), others 2.
#define FEW(NAME, K, S, NQ)                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, NQ == 1 ? 4 : 2) NAME(                   \
        const float* __restrict__ Q, const float* __restrict__ qn, long long nq,                   \
        const float* __restrict__ B, const float* __restrict__ bn, long long nb, u32 id_base,      \
        int d, const u32* __restrict__ exclude, int W, long long split_len,                        \
        u64* __restrict__ out) {                                                                   \
        few_topk<K, S, NQ>(Q, qn, nq, B, bn, nb, id_base, d, exclude, W, split_len, out);          \
    }
#ifndef KNN_MODULE_ONLY
FEW(few_sql2_w32, KERNEL_SQL2, 1, 4)
FEW(few_sql2_w64, KERNEL_SQL2, 2, 4)
FEW(few_sql2_w128, KERNEL_SQL2, 4, 4)
FEW(few_negdot_w32, KERNEL_NEGDOT, 1, 4)
FEW(few_negdot_w64, KERNEL_NEGDOT, 2, 4)
FEW(few_negdot_w128, KERNEL_NEGDOT, 4, 4)
FEW(few_l1_w32, KERNEL_L1, 1, 4)
FEW(few_l1_w64, KERNEL_L1, 2, 4)
FEW(few_l1_w128, KERNEL_L1, 4, 4)
FEW(few_linf_w32, KERNEL_LINF, 1, 4)
FEW(few_linf_w64, KERNEL_LINF, 2, 4)
FEW(few_linf_w128, KERNEL_LINF, 4, 4)
FEW(few1_sql2_w32, KERNEL_SQL2, 1, 1)
FEW(few1_sql2_w64, KERNEL_SQL2, 2, 1)
FEW(few1_sql2_w128, KERNEL_SQL2, 4, 1)
FEW(few1_negdot_w32, KERNEL_NEGDOT, 1, 1)
FEW(few1_negdot_w64, KERNEL_NEGDOT, 2, 1)
FEW(few1_negdot_w128, KERNEL_NEGDOT, 4, 1)
FEW(few1_l1_w32, KERNEL_L1, 1, 1)
FEW(few1_l1_w64, KERNEL_L1, 2, 1)
FEW(few1_l1_w128, KERNEL_L1, 4, 1)
FEW(few1_linf_w32, KERNEL_LINF, 1, 1)
FEW(few1_linf_w64, KERNEL_LINF, 2, 1)
FEW(few1_linf_w128, KERNEL_LINF, 4, 1)
#endif
