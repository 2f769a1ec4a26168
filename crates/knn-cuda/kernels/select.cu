// Exact top-W selection of one row per block by 8-bit radix select on 64-bit composites, over
// the union of two composite lists and one row of float keys; any W up to 4096.
//
//   lists_a[row * ma + i]  (i < ma)   composites (e.g. per-split top lists, or a running list)
//   lists_b[row * mb + i]  (i < mb, and i < bcount[row] when bcount is not null)  composites
//   keys[row * ld + i]     (i < nk)   keys of base ids id_base + i; exclude[row] is skipped
// Output: out[row * W + i], the W smallest composites, sorted (SENTINEL pads missing entries).
// Dynamic shared memory: P u64, P = the power of two >= W.

#define SEL_THREADS 256

__device__ __forceinline__ u64 sel_elem(const u64* __restrict__ a, int ma, const u64* __restrict__ b,
                                        int mb, const float* __restrict__ keys, u32 id_base,
                                        u32 skip, long long i) {
    if (i < ma) return a[i];
    i -= ma;
    if (i < mb) return b[i];
    i -= mb;
    u32 id = id_base + (u32)i;
    return id == skip ? SENTINEL : composite(keys[i], id);
}

extern "C" __global__ void __launch_bounds__(SEL_THREADS)
select_topk(const u64* __restrict__ lists_a, int ma, const u64* __restrict__ lists_b, int mb,
            const u32* __restrict__ bcount, const float* __restrict__ keys, long long ld, int nk, u32 id_base,
            const u32* __restrict__ exclude, int W, int P, u64* __restrict__ out) {
    extern __shared__ __align__(16) unsigned char smem[];
    u64* buf = (u64*)smem;
    __shared__ u32 hist[256];
    __shared__ u64 s_prefix;
    __shared__ int s_need, s_shift, s_done;
    __shared__ u32 s_lt, s_eq;
    long long row = blockIdx.x;
    int tid = threadIdx.x;
    const u64* a = lists_a ? lists_a + row * ma : lists_a;
    const u64* b = lists_b ? lists_b + row * mb : lists_b;
    if (bcount) mb = (int)min(bcount[row], (u32)mb);
    const float* k = keys ? keys + row * ld : keys;
    u32 skip = exclude ? exclude[row] : NO_ID;
    long long total = (long long)ma + mb + (keys ? nk : 0);
    if (!keys) nk = 0;

    if (total <= W) {
        for (long long i = tid; i < P; i += SEL_THREADS)
            buf[i] = i < total ? sel_elem(a, ma, b, mb, k, id_base, skip, i) : SENTINEL;
    } else {
        if (tid == 0) { s_prefix = 0; s_need = W; s_shift = 64; s_done = 0; }
        __syncthreads();
        while (true) {
            int shift = s_shift - 8;
            u64 prefix = s_prefix;
            for (int i = tid; i < 256; i += SEL_THREADS) hist[i] = 0;
            __syncthreads();
            for (long long i = tid; i < total; i += SEL_THREADS) {
                u64 v = sel_elem(a, ma, b, mb, k, id_base, skip, i);
                if (shift == 56 || (v >> (shift + 8)) == prefix)
                    atomicAdd(&hist[(u32)(v >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                int need = s_need;
                u32 cum = 0;
                int sel = 255;
                for (int dgt = 0; dgt < 256; dgt++) {
                    if (cum + hist[dgt] >= (u32)need) { sel = dgt; break; }
                    cum += hist[dgt];
                }
                need -= (int)cum;
                s_need = need;
                s_prefix = (prefix << 8) | (u64)sel;
                s_shift = shift;
                s_done = (hist[sel] == (u32)need) || shift == 0;
                s_lt = 0;
                s_eq = 0;
            }
            __syncthreads();
            if (s_done) break;
        }
        int shift = s_shift;
        u64 prefix = s_prefix;
        int need = s_need;
        int lt_total = W - need;
        for (long long i = tid; i < total; i += SEL_THREADS) {
            u64 v = sel_elem(a, ma, b, mb, k, id_base, skip, i);
            u64 hi = v >> shift;
            if (hi < prefix) {
                buf[atomicAdd(&s_lt, 1u)] = v;
            } else if (hi == prefix) {
                u32 t = atomicAdd(&s_eq, 1u);
                if (t < (u32)need) buf[lt_total + t] = v;
            }
        }
        for (int i = W + tid; i < P; i += SEL_THREADS) buf[i] = SENTINEL;
    }
    __syncthreads();
    // Bitonic sort of buf[0, P).
    for (int kk = 2; kk <= P; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < P; i += SEL_THREADS) {
                int ixj = i ^ j;
                if (ixj > i) {
                    u64 x = buf[i], y = buf[ixj];
                    bool up = (i & kk) == 0;
                    if ((x > y) == up) { buf[i] = y; buf[ixj] = x; }
                }
            }
            __syncthreads();
        }
    }
    for (int i = tid; i < W; i += SEL_THREADS) out[row * W + i] = buf[i];
}
