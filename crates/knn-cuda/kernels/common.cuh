// Shared definitions of every knn kernel. Compiled by NVRTC (no CUDA headers needed).
//
// A candidate is a 64-bit composite (orderable key bits << 32 | base id): sorting composites
// sorts by (key, id), the order every engine promises. 0xFFFF...FF is the "empty" sentinel
// (no finite or infinite key encodes to it).

typedef unsigned long long u64;
typedef unsigned int u32;

#define KERNEL_SQL2 0
#define KERNEL_NEGDOT 1
#define KERNEL_L1 2
#define KERNEL_LINF 3
#define KERNEL_EXPR 4  // an expression metric: kernels/expr.cu, one module per program

#define SENTINEL 0xFFFFFFFFFFFFFFFFull
#define NO_ID 0xFFFFFFFFu

// Monotone map float -> u32 (total order of non-NaN floats; -0 is mapped like +0).
__device__ __forceinline__ u32 ord_key(float k) {
    u32 u = __float_as_uint(k);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u64 composite(float k, u32 id) {
    return ((u64)ord_key(k) << 32) | (u64)id;
}

// Rows readied for the fused kernels, one warp per row: y = x - centre (one f32 rounding of the
// exact difference; y = x without a centre) written to `to` (which may be x itself: centred in
// place; null: not written), out[r] = sum_j y[r*d+j]^2 in f32 (error <= gamma_d * exact), and,
// when `cut` is not null, cut[r] set to the empty cut (all ones, the fused kernels' SENTINEL).
// One launch where a copy, the norms and a fill took three (each launch costs the host ~5 us,
// which a small search waits for). x and to may alias, so neither is __restrict__.
extern "C" __global__ void sq_norms(const float* x, long long rows, int d,
                                    const float* __restrict__ centre, float* to,
                                    float* __restrict__ out, u64* __restrict__ cut) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* p = x + row * (long long)d;
    float* t = to ? to + row * (long long)d : nullptr;
    float s = 0.f;
    for (int j = lane; j < d; j += 32) {
        float v = centre ? p[j] - centre[j] : p[j];
        if (t) t[j] = v;
        s = fmaf(v, v, s);
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
        out[row] = s;
        if (cut) cut[row] = ~0ull;
    }
}

// Hellinger's engine rows made on the device from the given rows, bit for bit as the host's
// `CentredRoots`: (sqrt(x) - c_j) in f64, correctly rounded, then rounded once to f32. Also each
// row's norm, rounded up (an f64 sum of squares in any order, times 1 + 1e-6, rounded up to
// f32): the floors' bound on the row's norm. One warp per row.
extern "C" __global__ void hellinger_roots(const float* __restrict__ given, long long rows, int d,
                                           const double* __restrict__ centre,
                                           float* __restrict__ out, float* __restrict__ norm_up) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* g = given + row * (long long)d;
    float* o = out + row * (long long)d;
    double s = 0.0;
    for (int j = lane; j < d; j += 32) {
        float v = __double2float_rn(__dsub_rn(__dsqrt_rn((double)g[j]), centre[j]));
        o[j] = v;
        s = __fma_rn((double)v, (double)v, s);
    }
    for (int m = 16; m; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    if (lane == 0) norm_up[row] = __double2float_ru(__dmul_ru(__dsqrt_ru(s), 1.0 + 1e-6));
}

// Fills n 64-bit words with a value (for sentinels and for poisoning outputs).
extern "C" __global__ void fill_u64(u64* __restrict__ p, long long n, u64 v) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] = v;
}

// Exact f64 keys of candidate lists, bit for bit as the host's `Kernel::exact`: per pair, eight
// accumulators over blocks of eight coordinates, summed in order, then the remainder; explicit
// _rn operations so nothing is contracted into an FMA. kind: 0 squared L2, 1 negated inner
// product, 2 L1, 3 L-infinity. Eight lanes per (row, slot), lane l holding accumulator l (so
// the eight read 32 contiguous bytes of the row at a time, where one thread walking a row read
// 32 rows per warp at once); lane 0 sums them and the remainder. Ids at or past nb give NaN.
extern "C" __global__ void exact_keys(const float* __restrict__ q, const float* __restrict__ b,
                                      long long nb, const u64* __restrict__ comps, long long n,
                                      int w, int d, int kind, double* __restrict__ out) {
    long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    int l = threadIdx.x & 7;
    // Every lane stays to the shuffles, live or not.
    bool live = t < n * (long long)w;
    long long row = live ? t / w : 0;
    u32 id = live ? (u32)(comps[t] & 0xffffffffu) : 0u;
    bool valid = live && id < nb;
    const float* x = q + row * (long long)d;
    const float* y = b + (long long)(valid ? id : 0u) * d;
    int full = d / 8 * 8;
    double acc = 0.0;
    if (valid) {
        for (int j = l; j < full; j += 8) {
            double a = x[j], c = y[j];
            double v;
            if (kind == 1) v = __dmul_rn(a, c);
            else { double e = __dsub_rn(a, c); v = kind == 0 ? __dmul_rn(e, e) : fabs(e); }
            acc = kind == 3 ? fmax(acc, v) : __dadd_rn(acc, v);
        }
    }
    double s = 0.0;
    int group = (threadIdx.x & 31) & ~7;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        double v = __shfl_sync(0xffffffffu, acc, group | m);
        s = kind == 3 ? fmax(s, v) : __dadd_rn(s, v);
    }
    if (l != 0 || !live) return;
    if (!valid) { out[t] = __longlong_as_double(0x7ff8000000000000ll); return; }
    for (int j = full; j < d; ++j) {
        double a = x[j], c = y[j];
        double v;
        if (kind == 1) v = __dmul_rn(a, c);
        else { double e = __dsub_rn(a, c); v = kind == 0 ? __dmul_rn(e, e) : fabs(e); }
        s = kind == 3 ? fmax(s, v) : __dadd_rn(s, v);
    }
    out[t] = kind == 1 ? -s : s;
}

// Hellinger's exact f64 keys of candidate lists, bit for bit as the host's `Metric::exact_key`:
// Σ (√x − √y)² with correctly rounded square roots, differences, squares and sums, left to
// right. One block per row (its query's roots in shared memory, 512 at a time), one thread per
// slot (blockIdx.y picks 128 of them); ids at or past nb give NaN.
extern "C" __global__ void exact_keys_hellinger(const float* __restrict__ q,
                                                const float* __restrict__ b, long long nb,
                                                const u64* __restrict__ comps, long long n, int w,
                                                int d, double* __restrict__ out) {
    __shared__ double rq[512];
    long long row = blockIdx.x;
    int slot = blockIdx.y * blockDim.x + threadIdx.x;
    bool live = slot < w;
    u32 id = live ? (u32)(comps[row * w + slot] & 0xffffffffu) : 0u;
    bool valid = live && id < nb;
    const float* x = q + row * (long long)d;
    const float* y = b + (long long)id * d;
    double s = 0.0;
    for (int j0 = 0; j0 < d; j0 += 512) {
        int m = min(512, d - j0);
        __syncthreads();
        for (int j = threadIdx.x; j < m; j += blockDim.x) rq[j] = __dsqrt_rn((double)x[j0 + j]);
        __syncthreads();
        if (valid) {
            int j = 0;
            if ((d & 3) == 0) {
                // 16-byte loads: a thread walks its own row, so scalar loads keep 32 lines per
                // warp live in L1 for 32 iterations each and thrash it (measured 5-7 ms per
                // 16 384 rows at W = 128, d = 256).
                const float4* y4 = (const float4*)(y + j0);
                for (; j + 4 <= m; j += 4) {
                    float4 v = y4[j >> 2];
                    double e0 = __dsub_rn(rq[j], __dsqrt_rn((double)v.x));
                    double e1 = __dsub_rn(rq[j + 1], __dsqrt_rn((double)v.y));
                    double e2 = __dsub_rn(rq[j + 2], __dsqrt_rn((double)v.z));
                    double e3 = __dsub_rn(rq[j + 3], __dsqrt_rn((double)v.w));
                    s = __dadd_rn(s, __dmul_rn(e0, e0));
                    s = __dadd_rn(s, __dmul_rn(e1, e1));
                    s = __dadd_rn(s, __dmul_rn(e2, e2));
                    s = __dadd_rn(s, __dmul_rn(e3, e3));
                }
            }
            for (; j < m; ++j) {
                double e = __dsub_rn(rq[j], __dsqrt_rn((double)y[j0 + j]));
                s = __dadd_rn(s, __dmul_rn(e, e));
            }
        }
    }
    if (live) out[row * w + slot] = valid ? s : __longlong_as_double(0x7ff8000000000000ll);
}

// Rust's total order of f64 / f32 values (`total_cmp`) as unsigned integer order, and back.
__device__ __forceinline__ u64 order_f64(double x) {
    u64 b = (u64)__double_as_longlong(x);
    return b ^ ((b >> 63) ? ~0ull : 0x8000000000000000ull);
}
__device__ __forceinline__ double unorder_f64(u64 o) {
    return __longlong_as_double((long long)(o ^ ((o >> 63) ? 0x8000000000000000ull : ~0ull)));
}
__device__ __forceinline__ u64 order_f32(float x) {
    u32 b = __float_as_uint(x);
    return (u64)(b ^ ((b >> 31) ? 0xffffffffu : 0x80000000u));
}

// Sorts p (a power of two) pairs (key[i], id[i]) in shared memory ascending by (key, id):
// bitonic network, every thread of the block taking compare-exchanges in turn.
__device__ void bitonic_pairs(u64* key, u32* id, int p) {
    for (int size = 2; size <= p; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int t = threadIdx.x; t < p / 2; t += blockDim.x) {
                int lo = 2 * t - (t & (stride - 1));
                int hi = lo + stride;
                bool up = (lo & size) == 0;
                u64 ka = key[lo], kb = key[hi];
                u32 ia = id[lo], ib = id[hi];
                bool greater = ka > kb || (ka == kb && ia > ib);
                if (greater == up) {
                    key[lo] = kb; key[hi] = ka;
                    id[lo] = ib; id[hi] = ia;
                }
            }
        }
    }
    __syncthreads();
}

// Final rows on the device, as the host pipeline's re-rank makes them: per row (one block), the
// k smallest of its w candidates by (exact key, id), as distances (mode 0: the key; 1:
// sqrt(max(key, 0)); 2: -key, a similarity; 3: sqrt(max(key / 2, 0)), Hellinger; f64, rounded to
// f32 once) ordered by (distance, id) (by (-distance, id) for a similarity), Rust's total order.
// Ids are written as u32, or with ids64 as i64 (the index type of PyTorch and NumPy).
// Also the row's k-th exact key and its w-th composite (for the host's floor). A candidate id
// at or past nb, or equal to the row's excluded id, sets *bad. p = the power of two ≥ w, pk ≥ k;
// shared memory: 12·(p + pk) bytes.
extern "C" __global__ void finish_lists(const u64* __restrict__ comps,
                                        const double* __restrict__ exact, int w, int p, int k,
                                        int pk, int mode, long long nb,
                                        const u32* __restrict__ excl, void* __restrict__ ids_out,
                                        float* __restrict__ dists_out, double* __restrict__ kth_out,
                                        u64* __restrict__ last_out, u32* __restrict__ bad,
                                        int ids64) {
    extern __shared__ u64 fin_smem[];
    u64* key = fin_smem;
    u64* key2 = key + p;
    u32* id = (u32*)(key2 + pk);
    u32* id2 = id + p;
    long long row = blockIdx.x;
    u32 skip = excl ? excl[row] : 0xffffffffu;
    for (int j = threadIdx.x; j < p; j += blockDim.x) {
        if (j < w) {
            u64 c = comps[row * w + j];
            u32 i = (u32)(c & 0xffffffffu);
            if (i >= nb || i == skip) atomicOr(bad, 1u);
            key[j] = order_f64(exact[row * w + j]);
            id[j] = i;
        } else {
            key[j] = ~0ull;
            id[j] = 0xffffffffu;
        }
    }
    bitonic_pairs(key, id, p);
    if (threadIdx.x == 0) {
        kth_out[row] = unorder_f64(key[k - 1]);
        last_out[row] = comps[row * w + w - 1];
    }
    for (int j = threadIdx.x; j < pk; j += blockDim.x) {
        if (j < k) {
            double x = unorder_f64(key[j]);
            float dist;
            if (mode == 1) dist = __double2float_rn(__dsqrt_rn(fmax(x, 0.0)));
            else if (mode == 2) dist = __double2float_rn(-x);
            else if (mode == 3) dist = __double2float_rn(__dsqrt_rn(fmax(__dmul_rn(0.5, x), 0.0)));
            else dist = __double2float_rn(x);
            key2[j] = order_f32(mode == 2 ? -dist : dist);
            id2[j] = id[j];
        } else {
            key2[j] = ~0ull;
            id2[j] = 0xffffffffu;
        }
    }
    bitonic_pairs(key2, id2, pk);
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        u32 o = (u32)key2[j];
        u32 b = o ^ ((o >> 31) ? 0x80000000u : 0xffffffffu);
        float s = __uint_as_float(b);
        if (ids64) {
            ((long long*)ids_out)[row * k + j] = (long long)id2[j];
        } else {
            ((u32*)ids_out)[row * k + j] = id2[j];
        }
        dists_out[row * k + j] = mode == 2 ? -s : s;
    }
}

// The verdict on rows finished on the device whose query norms the kernels measured: row i (of
// n) is final when complete, or when its k-th exact key times key_scale lies below its floor,
// computed as the host's `floor::floors` computes it from the same inputs (the W-th key of
// last[i] and the cut cut[i], the query's norm bounded from its f32 squared norm qsq[i] as
// `norm_bounds`, the error bound as `ErrorBounds::of` with the constants gamma and input, plus
// the inputs' absolute rounding as `InputAbs::of` with the constants abs_a, abs_c, abs_g2 and
// abs_k (abs_k 0: none), rounded down to f32): the same f64 operations, each rounded as there
// (no contraction). A row whose k-th key is not finite in f32 (a distance that overflows) is
// left unproven, for the host to report.
// kind: 0 squared L2 (GEMM form), 1 negated inner product, 2 L1, 3 L∞. Writes proven[i]
// (1 or 0); counts the rows left unproven in summary[1]; keeps the largest query norm bound's
// bits in summary[2]; sets summary[3] when a query's norm is not finite (a value that is not).
extern "C" __global__ void prove_rows(const double* __restrict__ kth,
                                      const u64* __restrict__ last, const u64* __restrict__ cut,
                                      const float* __restrict__ qsq, int n, int kind, int d,
                                      float bn_max, double gamma, double input,
                                      double abs_a, double abs_c, double abs_g2,
                                      double abs_k, double key_scale, int complete,
                                      unsigned char* __restrict__ proven, u32* summary) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    // `norm_bounds`: sqrt(s / (1 − γ_{d+2})) · (1 + 10⁻⁶), γ_m = m·2⁻²⁴ / (1 − m·2⁻²⁴).
    double nu = __dmul_rn((double)(d + 2), 0x1p-24);
    double g = __ddiv_rn(nu, __dadd_rn(1.0, -nu));
    double root = __dsqrt_rn(__ddiv_rn((double)qsq[i], __dadd_rn(1.0, -g)));
    float qn = __double2float_rn(__dmul_rn(root, 1.0 + 1e-6));
    if (isfinite(qn)) {
        atomicMax(summary + 2, __float_as_uint(qn));
    } else {
        atomicOr(summary + 3, 1u);
    }
    // The W-th key (a NaN for an unwritten slot, which `fminf` passes over) and the cut.
    u32 o = (u32)(last[i] >> 32);
    float wth = __uint_as_float(o & 0x80000000u ? o ^ 0x80000000u : ~o);
    u64 c = cut[i];
    float cut_key = __int_as_float(0x7f800000);  // +∞
    if (c != ~0ull) {
        u32 oc = (u32)(c >> 32);
        cut_key = __uint_as_float(oc & 0x80000000u ? oc ^ 0x80000000u : ~oc);
    }
    float worst = fminf(wth, cut_key);
    // `ErrorBounds::of` (L1 and L∞ take no norms).
    double q = kind <= 1 ? (double)qn : 0.0, b = (double)bn_max, bound;
    if (kind == 0) {
        double s = __dadd_rn(q, b);
        bound = __dadd_rn(__dmul_rn(__dmul_rn(__dmul_rn(2.0, input), q), b),
                          __dmul_rn(__dmul_rn(gamma, s), s));
    } else if (kind == 1) {
        bound = __dmul_rn(__dmul_rn(__dadd_rn(input, gamma), q), b);
    } else {
        bound = __dmul_rn(gamma, (double)fabsf(worst));
    }
    float bound32 = __double2float_rn(__dadd_rn(__dmul_rn(bound, 1.0 + 1e-6), 0x1p-126));
    // `InputAbs::of`: (a·(‖q‖ + ‖b‖) + c)·(1 + 2γ)·(1 + 10⁻⁶)·k.
    double abs_term = 0.0;
    if (abs_k != 0.0) {
        double t = __dadd_rn(__dmul_rn(abs_a, __dadd_rn((double)qn, b)), abs_c);
        abs_term = __dmul_rn(abs_k, __dmul_rn(__dmul_rn(t, abs_g2), 1.0 + 1e-6));
    }
    float floor = __double2float_rd(__dadd_rn((double)worst, -__dadd_rn((double)bound32, abs_term)));
    if (isnan(floor)) floor = __int_as_float(0xff800000);  // −∞
    bool ok = (complete || __dmul_rn(kth[i], key_scale) < (double)floor)
              && isfinite(__double2float_rn(kth[i]));
    proven[i] = ok ? 1 : 0;
    if (!ok) atomicAdd(summary + 1, 1u);
}
