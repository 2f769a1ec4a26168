// The three implementations of seed 000 (Garcia et al.), kept simple and faithful:
// a distance matrix of one chunk, dist[b * nq + q] (one column per query), computed by
//  - dist_global: 16 x 16 shared-memory tiles, one distance per thread;
//  - dist_texture: the same with base points read through a texture object;
//  - cuBLAS (host side) followed by add_norms;
// then modified_insertion_sort keeps each query's W smallest (one thread per query).

#define T16 16

template <int KERNEL>
__device__ __forceinline__ float direct_op(float acc, float a, float b) {
    float t = a - b;
    if (KERNEL == KERNEL_SQL2) return fmaf(t, t, acc);
    if (KERNEL == KERNEL_NEGDOT) return fmaf(-a, b, acc);
    if (KERNEL == KERNEL_L1) return acc + fabsf(t);
    return fmaxf(acc, fabsf(t));
}

__device__ __forceinline__ float tex_fetch(unsigned long long tex, int i) {
    float x, y, z, w;
    asm volatile("tex.1d.v4.f32.s32 {%0, %1, %2, %3}, [%4, {%5}];"
                 : "=f"(x), "=f"(y), "=f"(z), "=f"(w)
                 : "l"(tex), "r"(i));
    return x;
}

// Block (16, 16): threadIdx.x indexes queries, threadIdx.y base points.
template <int KERNEL, bool TEX>
__device__ void dist_tiles(const float* __restrict__ Q, long long nq, const float* __restrict__ B,
                           unsigned long long tex, long long nb, int d, float* __restrict__ dist) {
    __shared__ float Qs[T16][T16 + 1];
    __shared__ float Bs[T16][T16 + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    long long q0 = (long long)blockIdx.x * T16, b0 = (long long)blockIdx.y * T16;
    float acc = 0.f;
    for (int k0 = 0; k0 < d; k0 += T16) {
        // Qs[query][coord], Bs[base][coord]; row r of the tile, coordinate tx.
        long long qr = q0 + ty, br = b0 + ty;
        int c = k0 + tx;
        Qs[ty][tx] = (qr < nq && c < d) ? Q[qr * d + c] : 0.f;
        float bvv = 0.f;
        if (br < nb && c < d) bvv = TEX ? tex_fetch(tex, (int)(br * d + c)) : B[br * d + c];
        Bs[ty][tx] = bvv;
        __syncthreads();
        int kmax = min(T16, d - k0);
        for (int kk = 0; kk < kmax; kk++) acc = direct_op<KERNEL>(acc, Qs[tx][kk], Bs[ty][kk]);
        __syncthreads();
    }
    long long q = q0 + tx, b = b0 + ty;
    if (q < nq && b < nb) dist[b * nq + q] = acc;
}

#define DIST(NAME, K, TEX)                                                                          \
    extern "C" __global__ void NAME(const float* __restrict__ Q, long long nq,                     \
                                    const float* __restrict__ B, unsigned long long tex,           \
                                    long long nb, int d, float* __restrict__ dist) {               \
        dist_tiles<K, TEX>(Q, nq, B, tex, nb, d, dist);                                            \
    }
DIST(dist_global_sql2, KERNEL_SQL2, false)
DIST(dist_global_negdot, KERNEL_NEGDOT, false)
DIST(dist_global_l1, KERNEL_L1, false)
DIST(dist_global_linf, KERNEL_LINF, false)
DIST(dist_texture_sql2, KERNEL_SQL2, true)
DIST(dist_texture_negdot, KERNEL_NEGDOT, true)
DIST(dist_texture_l1, KERNEL_L1, true)
DIST(dist_texture_linf, KERNEL_LINF, true)

// After cuBLAS wrote dist = alpha * B Qᵀ (alpha = -2 for SqL2): add ‖b‖² + ‖q‖².
extern "C" __global__ void add_norms(float* __restrict__ dist, long long nq, long long nb,
                                     const float* __restrict__ qn, const float* __restrict__ bn) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (; i < nq * nb; i += stride) {
        long long b = i / nq, q = i - b * nq;
        dist[i] = dist[i] + (qn[q] + bn[b]);
    }
}

// The seed's modified insertion sort, continued across base chunks: query q keeps its W
// smallest (key, id) in lk[j * nq + q], li[j * nq + q] (sorted, count[q] valid). Ids rise along
// the scan, so strict comparisons keep the smaller id first among equal keys.
extern "C" __global__ void modified_insertion_sort(const float* __restrict__ dist, long long nq,
                                                   long long nb, u32 id_base,
                                                   const u32* __restrict__ exclude, int W,
                                                   float* __restrict__ lk, u32* __restrict__ li,
                                                   int* __restrict__ count) {
    long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= nq) return;
    u32 skip = exclude ? exclude[q] : NO_ID;
    int cnt = count[q];
    for (long long l = 0; l < nb; l++) {
        u32 id = id_base + (u32)l;
        if (id == skip) continue;
        float key = dist[l * nq + q];
        int j;
        if (cnt < W) {
            j = cnt;
            cnt++;
        } else if (key < lk[(long long)(W - 1) * nq + q]) {
            j = W - 1;
        } else {
            continue;
        }
        while (j > 0 && lk[(long long)(j - 1) * nq + q] > key) {
            lk[(long long)j * nq + q] = lk[(long long)(j - 1) * nq + q];
            li[(long long)j * nq + q] = li[(long long)(j - 1) * nq + q];
            j--;
        }
        lk[(long long)j * nq + q] = key;
        li[(long long)j * nq + q] = id;
    }
    count[q] = cnt;
}
