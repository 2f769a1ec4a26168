// Grid method (d <= 3): points binned into a uniform grid of cells by a counting sort on the
// device (count, scan, scatter), then one thread per query visits cells in rings of growing
// Chebyshev distance until its k-th best key is no larger than the distance to any unvisited
// cell. Keys are computed directly (no GEMM form); the host turns the per-query "unvisited"
// bound and the best rejected key into a floor.
//
// Layouts: X is n x D row-major. Sorted points are float4 (x, y, z, id bits), cell-ordered;
// starts[c] .. starts[c+1] are the points of cell c (cells x-major: c = (cz*gy + cy)*gx + cx).

#define SCAN_THREADS 1024
#define SCAN_PER_THREAD 4
#define SCAN_BLOCK (SCAN_THREADS * SCAN_PER_THREAD)

struct GridGeom {
    float lo[3];   // lower corner of the grid
    float inv[3];  // cells per unit length along each axis
    float size[3]; // cell side along each axis (1 / inv, rounded)
    int g[3];      // cells per axis (1 for axes beyond D)
};

template <int D>
__device__ __forceinline__ int axis_cell(const GridGeom& G, int a, float x) {
    float t = (x - G.lo[a]) * G.inv[a];
    int c = (int)floorf(t);
    return min(max(c, 0), G.g[a] - 1);
}

template <int D>
__device__ __forceinline__ long long cell_of(const GridGeom& G, const float* p) {
    long long c = 0;
#pragma unroll
    for (int a = D - 1; a >= 0; a--) c = c * G.g[a] + axis_cell<D>(G, a, p[a]);
    return c;
}

template <int D>
__device__ void grid_count(const float* __restrict__ X, long long n, GridGeom G,
                           u32* __restrict__ counts, u32* __restrict__ cell_of_point) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p[3];
#pragma unroll
    for (int a = 0; a < D; a++) p[a] = X[i * D + a];
    u32 c = (u32)cell_of<D>(G, p);
    cell_of_point[i] = c;
    atomicAdd(&counts[c], 1u);
}

extern "C" __global__ void grid_count_1(const float* X, long long n, GridGeom G, u32* counts, u32* cp) { grid_count<1>(X, n, G, counts, cp); }
extern "C" __global__ void grid_count_2(const float* X, long long n, GridGeom G, u32* counts, u32* cp) { grid_count<2>(X, n, G, counts, cp); }
extern "C" __global__ void grid_count_3(const float* X, long long n, GridGeom G, u32* counts, u32* cp) { grid_count<3>(X, n, G, counts, cp); }

// Exclusive scan, in place, of `n` u32 counts: per-block scans (SCAN_BLOCK elements), then a
// scan of the block sums by one block, then the block offsets added back.
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* sh, u32* total) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int o = 1; o < SCAN_THREADS; o <<= 1) {
        u32 add = t >= o ? sh[t - o] : 0u;
        __syncthreads();
        sh[t] += add;
        __syncthreads();
    }
    u32 incl = sh[t];
    *total = sh[SCAN_THREADS - 1];
    __syncthreads();
    return incl - v;
}

extern "C" __global__ void grid_scan_blocks(u32* data, long long n, u32* block_sums) {
    __shared__ u32 sh[SCAN_THREADS];
    long long base = (long long)blockIdx.x * SCAN_BLOCK + (long long)threadIdx.x * SCAN_PER_THREAD;
    u32 v[SCAN_PER_THREAD];
    u32 s = 0;
#pragma unroll
    for (int j = 0; j < SCAN_PER_THREAD; j++) {
        v[j] = base + j < n ? data[base + j] : 0u;
        s += v[j];
    }
    u32 total;
    u32 off = block_exclusive_scan(s, sh, &total);
#pragma unroll
    for (int j = 0; j < SCAN_PER_THREAD; j++) {
        if (base + j < n) data[base + j] = off;
        off += v[j];
    }
    if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

// One block scans up to SCAN_BLOCK block sums (so up to 2^24 cells).
extern "C" __global__ void grid_scan_sums(u32* sums, int nblocks) {
    __shared__ u32 sh[SCAN_THREADS];
    int base = threadIdx.x * SCAN_PER_THREAD;
    u32 v[SCAN_PER_THREAD];
    u32 s = 0;
#pragma unroll
    for (int j = 0; j < SCAN_PER_THREAD; j++) {
        v[j] = base + j < nblocks ? sums[base + j] : 0u;
        s += v[j];
    }
    u32 total;
    u32 off = block_exclusive_scan(s, sh, &total);
#pragma unroll
    for (int j = 0; j < SCAN_PER_THREAD; j++) {
        if (base + j < nblocks) sums[base + j] = off;
        off += v[j];
    }
}

extern "C" __global__ void grid_scan_add(u32* data, long long n, const u32* block_offsets, u32* cursor) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 v = data[i] + block_offsets[i / SCAN_BLOCK];
    data[i] = v;
    cursor[i] = v;
}

template <int D>
__device__ void grid_scatter(const float* __restrict__ X, long long n, const u32* __restrict__ cp,
                             u32* __restrict__ cursor, float4* __restrict__ sorted) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 pos = atomicAdd(&cursor[cp[i]], 1u);
    float4 v;
    v.x = X[i * D];
    v.y = D > 1 ? X[i * D + 1] : 0.f;
    v.z = D > 2 ? X[i * D + 2] : 0.f;
    v.w = __uint_as_float((u32)i);
    sorted[pos] = v;
}

extern "C" __global__ void grid_scatter_1(const float* X, long long n, const u32* cp, u32* cursor, float4* s) { grid_scatter<1>(X, n, cp, cursor, s); }
extern "C" __global__ void grid_scatter_2(const float* X, long long n, const u32* cp, u32* cursor, float4* s) { grid_scatter<2>(X, n, cp, cursor, s); }
extern "C" __global__ void grid_scatter_3(const float* X, long long n, const u32* cp, u32* cursor, float4* s) { grid_scatter<3>(X, n, cp, cursor, s); }

template <int D, int KERNEL>
__device__ __forceinline__ float grid_key(const float* q, float4 p) {
    float dx = q[0] - p.x;
    float dy = D > 1 ? q[1] - p.y : 0.f;
    float dz = D > 2 ? q[2] - p.z : 0.f;
    if (KERNEL == KERNEL_SQL2) return __fadd_rn(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), __fmul_rn(dz, dz));
    if (KERNEL == KERNEL_L1) return __fadd_rn(__fadd_rn(fabsf(dx), fabsf(dy)), fabsf(dz));
    return fmaxf(fmaxf(fabsf(dx), fabsf(dy)), fabsf(dz));
}

// Exact key in f64 with the operation order of the host's exact re-rank (no contraction).
template <int D, int KERNEL>
__device__ __forceinline__ double grid_exact(const float* q, float4 p) {
    double s = 0.0;
    float pv[3] = {p.x, p.y, p.z};
#pragma unroll
    for (int a = 0; a < D; a++) {
        double t = __dsub_rn((double)q[a], (double)pv[a]);
        if (KERNEL == KERNEL_SQL2) s = __dadd_rn(s, __dmul_rn(t, t));
        else if (KERNEL == KERNEL_L1) s = __dadd_rn(s, fabs(t));
        else s = fmax(s, fabs(t));
    }
    return s;
}

// Lower bound on |x - q| along axis a for every point of a cell beyond index `c` on that side
// (side < 0: cells below c, side > 0: cells above c), in f32 with a margin for the binning's
// rounding: a point binned into cell i lies within one ulp-scaled margin of its cell's box.
__device__ __forceinline__ float face_gap(const GridGeom& G, int a, int c, int side, float q, float margin) {
    if (side < 0) {
        float face = G.lo[a] + (float)c * G.size[a]; // lower face of cell c
        return fmaxf(q - face - margin, 0.f);
    }
    float face = G.lo[a] + (float)(c + 1) * G.size[a]; // upper face of cell c
    return fmaxf(face - q - margin, 0.f);
}

// Ring search for one query (Qs: the queries as float4 (x, y, z, index), in cell order). Output
// row `index`: KMAX (key, id) pairs sorted by (key, id) (only the
// first `w` used), the exact f64 keys of those, and per query the bound on the keys of
// everything not returned (min of the unvisited region's bound and the best rejected key).
template <int D, int KERNEL, int KMAX>
__device__ void grid_query(const float4* __restrict__ Qs, long long nq, const u32* __restrict__ exclude,
                           GridGeom G, const u32* __restrict__ starts, const float4* __restrict__ pts,
                           int w, int complete, u32* __restrict__ out_ids,
                           float* __restrict__ out_keys, double* __restrict__ out_exact,
                           float* __restrict__ out_floor) {
    // Queries come sorted by cell (consecutive threads share cells); w holds the query's index.
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nq) return;
    float4 qv = Qs[t];
    long long qi = __float_as_uint(qv.w);
    float q[3] = {qv.x, qv.y, qv.z};
    u32 skip = exclude ? exclude[qi] : NO_ID;
    float key[KMAX];
    u32 id[KMAX];
    u32 pos[KMAX]; // positions in `pts`, for the exact keys at the end
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        key[j] = __int_as_float(0x7f800000);
        id[j] = NO_ID;
        pos[j] = 0;
    }
    float rejected = __int_as_float(0x7f800000); // best key seen but not kept
    float worst = __int_as_float(0x7f800000);    // key[w - 1], kept in a register
    u32 worst_id = NO_ID;                        // id[w - 1]
    int c[3] = {0, 0, 0};
    float margin[3] = {0.f, 0.f, 0.f};
#pragma unroll
    for (int a = 0; a < D; a++) {
        c[a] = axis_cell<D>(G, a, q[a]);
        // Binning rounds (x - lo) * inv: a point may sit a few ulps of |lo| + extent outside
        // its cell's box.
        float ext = fabsf(G.lo[a]) + (float)G.g[a] * G.size[a] + fabsf(q[a]);
        margin[a] = ext * 4.8e-7f;
    }
    int rmax = 0;
#pragma unroll
    for (int a = 0; a < D; a++) rmax = max(rmax, max(c[a], G.g[a] - 1 - c[a]));
    float region = 0.f;
    for (int r = 0; r <= rmax; r++) {
        int lo[3], hi[3];
#pragma unroll
        for (int a = 0; a < 3; a++) {
            lo[a] = a < D ? max(c[a] - r, 0) : 0;
            hi[a] = a < D ? min(c[a] + r, G.g[a] - 1) : 0;
        }
        for (int z = lo[2]; z <= hi[2]; z++) {
            bool zedge = D > 2 && (z == c[2] - r || z == c[2] + r);
            for (int y = lo[1]; y <= hi[1]; y++) {
                bool yedge = D > 1 && (y == c[1] - r || y == c[1] + r);
                // On the shell: an edge in y or z visits the whole x row, else only its ends.
                int xstep = (r == 0 || zedge || yedge) ? 1 : 2 * r;
                for (int x = c[0] - r; x <= c[0] + r; x += xstep) {
                    if (x < 0 || x >= G.g[0]) continue;
                    long long cell = ((long long)z * G.g[1] + y) * G.g[0] + x;
                    u32 s = starts[cell], e = starts[cell + 1];
                    for (u32 p = s; p < e; p++) {
                        float4 v = pts[p];
                        u32 pid = __float_as_uint(v.w);
                        if (pid == skip) continue;
                        float k = grid_key<D, KERNEL>(q, v);
                        if (k < worst || (k == worst && pid < worst_id)) {
                            // The evicted entry becomes a rejected candidate.
                            if (worst_id != NO_ID) rejected = fminf(rejected, worst);
                            if (KMAX <= 32) {
                                // Insertion from slot w-1 down, indices known at compile time
                                // (the lists stay in registers).
                                bool placed = false;
#pragma unroll
                                for (int t = KMAX - 1; t >= 0; t--) {
                                    if (t < w && !placed) {
                                        bool shift = t > 0 && (key[t - 1] > k || (key[t - 1] == k && id[t - 1] > pid));
                                        if (shift) {
                                            key[t] = key[t - 1];
                                            id[t] = id[t - 1];
                                            pos[t] = pos[t - 1];
                                        } else {
                                            key[t] = k;
                                            id[t] = pid;
                                            pos[t] = p;
                                            placed = true;
                                        }
                                    }
                                }
#pragma unroll
                                for (int t = 0; t < KMAX; t++)
                                    if (t == w - 1) {
                                        worst = key[t];
                                        worst_id = id[t];
                                    }
                            } else {
                                // Wide lists (retries of rare rows): plain insertion in local memory.
                                int t = w - 1;
                                while (t > 0 && (key[t - 1] > k || (key[t - 1] == k && id[t - 1] > pid))) {
                                    key[t] = key[t - 1];
                                    id[t] = id[t - 1];
                                    pos[t] = pos[t - 1];
                                    t--;
                                }
                                key[t] = k;
                                id[t] = pid;
                                pos[t] = p;
                                worst = key[w - 1];
                                worst_id = id[w - 1];
                            }
                        } else {
                            rejected = fminf(rejected, k);
                        }
                    }
                }
            }
        }
        // Bound on the key of any point in a cell outside the cube [c - r, c + r]: the nearest
        // face of the cube that has cells beyond it.
        float gap = __int_as_float(0x7f800000);
#pragma unroll
        for (int a = 0; a < D; a++) {
            if (c[a] - r > 0) gap = fminf(gap, face_gap(G, a, c[a] - r, -1, q[a], margin[a]));
            if (c[a] + r < G.g[a] - 1) gap = fminf(gap, face_gap(G, a, c[a] + r, 1, q[a], margin[a]));
        }
        region = KERNEL == KERNEL_SQL2 ? gap * gap : gap;
        if (worst_id != NO_ID && worst <= region) break;
    }
    long long o = qi * (long long)w;
    if (KMAX <= 32) {
#pragma unroll
        for (int j = 0; j < KMAX; j++) {
            if (j < w) {
                out_ids[o + j] = id[j];
                out_keys[o + j] = key[j];
                out_exact[o + j] = id[j] != NO_ID ? grid_exact<D, KERNEL>(q, pts[pos[j]]) : 0.0;
            }
        }
    } else {
        for (int j = 0; j < w; j++) {
            out_ids[o + j] = id[j];
            out_keys[o + j] = key[j];
            out_exact[o + j] = id[j] != NO_ID ? grid_exact<D, KERNEL>(q, pts[pos[j]]) : 0.0;
        }
    }
    // Floor: every point left out is either unvisited (exact key >= region, up to the
    // margins) or visited and rejected (exact key >= its computed key within 6u); shrunk by
    // 2^-20 and rounded down so it stays a lower bound.
    double f = fmin((double)rejected, (double)region) * (1.0 - 1.0 / 1048576.0);
    out_floor[qi] = complete ? __int_as_float(0x7f800000) : __double2float_rd(f);
}

#define GRIDQ(NAME, D, K, KMAX)                                                                     \
    extern "C" __global__ void NAME(const float4* Q, long long nq, const u32* exclude, GridGeom G,  \
                                    const u32* starts, const float4* pts, int w, int complete,     \
                                    u32* out_ids, float* out_keys, double* out_exact,              \
                                    float* out_floor) {                                            \
        grid_query<D, K, KMAX>(Q, nq, exclude, G, starts, pts, w, complete, out_ids, out_keys,     \
                               out_exact, out_floor);                                               \
    }

GRIDQ(grid_query_1_sql2_k1, 1, KERNEL_SQL2, 1)
GRIDQ(grid_query_1_sql2_k8, 1, KERNEL_SQL2, 8)
GRIDQ(grid_query_1_sql2_k32, 1, KERNEL_SQL2, 32)
GRIDQ(grid_query_2_sql2_k1, 2, KERNEL_SQL2, 1)
GRIDQ(grid_query_2_sql2_k8, 2, KERNEL_SQL2, 8)
GRIDQ(grid_query_2_sql2_k32, 2, KERNEL_SQL2, 32)
GRIDQ(grid_query_3_sql2_k1, 3, KERNEL_SQL2, 1)
GRIDQ(grid_query_3_sql2_k8, 3, KERNEL_SQL2, 8)
GRIDQ(grid_query_3_sql2_k32, 3, KERNEL_SQL2, 32)
GRIDQ(grid_query_1_l1_k1, 1, KERNEL_L1, 1)
GRIDQ(grid_query_1_l1_k8, 1, KERNEL_L1, 8)
GRIDQ(grid_query_1_l1_k32, 1, KERNEL_L1, 32)
GRIDQ(grid_query_2_l1_k1, 2, KERNEL_L1, 1)
GRIDQ(grid_query_2_l1_k8, 2, KERNEL_L1, 8)
GRIDQ(grid_query_2_l1_k32, 2, KERNEL_L1, 32)
GRIDQ(grid_query_3_l1_k1, 3, KERNEL_L1, 1)
GRIDQ(grid_query_3_l1_k8, 3, KERNEL_L1, 8)
GRIDQ(grid_query_3_l1_k32, 3, KERNEL_L1, 32)
GRIDQ(grid_query_1_linf_k1, 1, KERNEL_LINF, 1)
GRIDQ(grid_query_1_linf_k8, 1, KERNEL_LINF, 8)
GRIDQ(grid_query_1_linf_k32, 1, KERNEL_LINF, 32)
GRIDQ(grid_query_2_linf_k1, 2, KERNEL_LINF, 1)
GRIDQ(grid_query_2_linf_k8, 2, KERNEL_LINF, 8)
GRIDQ(grid_query_2_linf_k32, 2, KERNEL_LINF, 32)
GRIDQ(grid_query_3_linf_k1, 3, KERNEL_LINF, 1)
GRIDQ(grid_query_3_linf_k8, 3, KERNEL_LINF, 8)
GRIDQ(grid_query_3_linf_k32, 3, KERNEL_LINF, 32)
GRIDQ(grid_query_1_sql2_k128, 1, KERNEL_SQL2, 128)
GRIDQ(grid_query_2_sql2_k128, 2, KERNEL_SQL2, 128)
GRIDQ(grid_query_3_sql2_k128, 3, KERNEL_SQL2, 128)
GRIDQ(grid_query_1_l1_k128, 1, KERNEL_L1, 128)
GRIDQ(grid_query_2_l1_k128, 2, KERNEL_L1, 128)
GRIDQ(grid_query_3_l1_k128, 3, KERNEL_L1, 128)
GRIDQ(grid_query_1_linf_k128, 1, KERNEL_LINF, 128)
GRIDQ(grid_query_2_linf_k128, 2, KERNEL_LINF, 128)
GRIDQ(grid_query_3_linf_k128, 3, KERNEL_LINF, 128)
