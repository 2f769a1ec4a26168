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

// Squared norms, one warp per row: out[r] = sum_j x[r*d+j]^2 in f32 (error <= gamma_d * exact).
// With a centre (not null), each row is first centred in place, x[r*d+j] -= centre[j] (one f32
// rounding of the exact difference), and the norms are those of the centred rows.
extern "C" __global__ void sq_norms(float* __restrict__ x, long long rows, int d,
                                    const float* __restrict__ centre, float* __restrict__ out) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float* p = x + row * (long long)d;
    float s = 0.f;
    if (centre) {
        for (int j = lane; j < d; j += 32) {
            float v = p[j] - centre[j];
            p[j] = v;
            s = fmaf(v, v, s);
        }
    } else {
        for (int j = lane; j < d; j += 32) s = fmaf(p[j], p[j], s);
    }
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[row] = s;
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
// product, 2 L1, 3 L-infinity. One thread per (row, slot); ids at or past nb give NaN.
extern "C" __global__ void exact_keys(const float* __restrict__ q, const float* __restrict__ b,
                                      long long nb, const u64* __restrict__ comps, long long n,
                                      int w, int d, int kind, double* __restrict__ out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * (long long)w) return;
    long long row = t / w;
    u32 id = (u32)(comps[t] & 0xffffffffu);
    if (id >= nb) { out[t] = __longlong_as_double(0x7ff8000000000000ll); return; }
    const float* x = q + row * (long long)d;
    const float* y = b + (long long)id * d;
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int full = d / 8 * 8;
    for (int j = 0; j < full; j += 8) {
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            double a = x[j + l], c = y[j + l];
            double v;
            if (kind == 1) v = __dmul_rn(a, c);
            else { double e = __dsub_rn(a, c); v = kind == 0 ? __dmul_rn(e, e) : fabs(e); }
            acc[l] = kind == 3 ? fmax(acc[l], v) : __dadd_rn(acc[l], v);
        }
    }
    double s = 0.0;
#pragma unroll
    for (int l = 0; l < 8; ++l) s = kind == 3 ? fmax(s, acc[l]) : __dadd_rn(s, acc[l]);
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
            for (int j = 0; j < m; ++j) {
                double e = __dsub_rn(rq[j], __dsqrt_rn((double)y[j0 + j]));
                s = __dadd_rn(s, __dmul_rn(e, e));
            }
        }
    }
    if (live) out[row * w + slot] = valid ? s : __longlong_as_double(0x7ff8000000000000ll);
}
