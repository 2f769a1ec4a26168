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
extern "C" __global__ void sq_norms(const float* __restrict__ x, long long rows, int d,
                                    float* __restrict__ out) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* p = x + row * (long long)d;
    float s = 0.f;
    for (int j = lane; j < d; j += 32) s = fmaf(p[j], p[j], s);
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) out[row] = s;
}

// Fills n 64-bit words with a value (for sentinels and for poisoning outputs).
extern "C" __global__ void fill_u64(u64* __restrict__ p, long long n, u64 v) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) p[i] = v;
}
