// Grid method (d <= 3): points binned into a uniform grid of cells by a counting sort on the
// device (count, scan, scatter); cells holding many points (clustered data) get a sub-grid over
// their points' bounding box. One thread per query then visits cells in rings of growing
// Chebyshev distance, skipping cells (and sub-cells) whose distance bound exceeds its k-th best
// key, until that key is below the bound of every unvisited cell. Keys are computed directly
// (no GEMM form). The kernel either returns candidates with a floor for the pipeline's re-rank,
// or finishes the rows itself (exact f64 keys, distances, and whether the floor proves the row).
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

#define GRID_INF __int_as_float(0x7f800000)
// A cell is skipped, or the search stops, only when its bound exceeds the k-th key by a factor
// 1 + 2^-18: room for the rounding of keys and bounds, so that the floor (shrunk by 2^-20 for
// that rounding) still lies above the k-th exact key and the row is proven.
#define GRID_GROW (1.0f + 1.0f / 262144.0f)
// Binning rounds (x - lo) * inv: a point may sit a few ulps of |lo| + extent + |q| outside its
// cell's box; bounds subtract this many times that scale.
#define GRID_MARGIN 4.8e-7f

// Distances of grid_query's finished rows (`mode`).
#define GRID_FINISH_KEY 1 // distance = exact key (squared L2, L1, L-inf)
#define GRID_FINISH_SQRT 2 // distance = sqrt(exact key) (L2)

// ---- Sub-grids of crowded cells ----
// A cell with more than `crowd_min` base points gets its own grid over the bounding box of its
// points (about `per_cell` points per sub-cell), and its points are reordered by sub-cell inside
// the cell's range. crowd_of[cell] numbers the crowded cells (valid for those only); sub-cell j
// of crowded cell o holds the points sub_starts[subs[o].off + j] .. sub_starts[subs[o].off + j + 1].
struct SubGrid {
    GridGeom G;
    u32 off;  // first entry of its sub-cells in sub_starts
    u32 cell; // the cell it refines
};

// Numbers the crowded cells (in no particular order).
extern "C" __global__ void grid_crowd_find(const u32* __restrict__ starts, long long cells, u32 crowd_min,
                                           u32* __restrict__ counter, u32* __restrict__ crowd_of,
                                           SubGrid* __restrict__ subs) {
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cells) return;
    if (starts[c + 1] - starts[c] > crowd_min) {
        u32 o = atomicAdd(counter, 1u);
        crowd_of[c] = o;
        subs[o].cell = (u32)c;
    }
}

// One warp per crowded cell: the bounding box of its points, then a sub-grid geometry of about
// `per_cell` points per sub-cell (at most 2 * ceil(count / per_cell) sub-cells); sizes[o] is
// its number of sub_starts entries (sub-cells + 1).
template <int D>
__device__ void grid_crowd_geom(const float4* __restrict__ pts, const u32* __restrict__ starts, u32 ncrowd,
                                float per_cell, SubGrid* __restrict__ subs, u32* __restrict__ sizes) {
    long long o = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (o >= ncrowd) return;
    u32 cell = subs[o].cell;
    u32 s = starts[cell], e = starts[cell + 1];
    float lo[3] = {GRID_INF, GRID_INF, GRID_INF}, hi[3] = {-GRID_INF, -GRID_INF, -GRID_INF};
    for (u32 p = s + lane; p < e; p += 32) {
        float4 v = pts[p];
        float pv[3] = {v.x, v.y, v.z};
#pragma unroll
        for (int a = 0; a < D; a++) {
            lo[a] = fminf(lo[a], pv[a]);
            hi[a] = fmaxf(hi[a], pv[a]);
        }
    }
#pragma unroll
    for (int a = 0; a < D; a++) {
        for (int off = 16; off; off >>= 1) {
            lo[a] = fminf(lo[a], __shfl_xor_sync(0xffffffffu, lo[a], off));
            hi[a] = fmaxf(hi[a], __shfl_xor_sync(0xffffffffu, hi[a], off));
        }
    }
    if (lane != 0) return;
    double want = ceil((double)(e - s) / (double)per_cell);
    double ext[3] = {0.0, 0.0, 0.0}, vol = 1.0;
    int live = 0;
    for (int a = 0; a < D; a++) {
        ext[a] = (double)hi[a] - (double)lo[a];
        if (ext[a] > 0.0) {
            live++;
            vol *= ext[a];
        }
    }
    double side = live ? pow(vol / want, 1.0 / live) : 1.0;
    int g[3] = {1, 1, 1};
    for (int a = 0; a < D; a++)
        if (ext[a] > 0.0) g[a] = (int)fmin(fmax(ceil(ext[a] / side), 1.0), 1e6);
    while ((double)g[0] * (double)g[1] * (double)g[2] > 2.0 * want) {
        int a = g[0] >= g[1] && g[0] >= g[2] ? 0 : (g[1] >= g[2] ? 1 : 2);
        g[a] = max(g[a] / 2, 1);
    }
    GridGeom G;
    for (int a = 0; a < 3; a++) {
        G.g[a] = g[a];
        G.lo[a] = a < D ? lo[a] : 0.f;
        if (a < D && ext[a] > 0.0) {
            G.size[a] = (float)(ext[a] / g[a]);
            G.inv[a] = (float)(g[a] / ext[a]);
        } else {
            G.size[a] = 1.f;
            G.inv[a] = 0.f;
        }
    }
    subs[o].G = G;
    sizes[o] = (u32)(g[0] * g[1] * g[2]) + 1u;
}

extern "C" __global__ void grid_crowd_geom_1(const float4* p, const u32* st, u32 nc, float pc, SubGrid* s, u32* z) { grid_crowd_geom<1>(p, st, nc, pc, s, z); }
extern "C" __global__ void grid_crowd_geom_2(const float4* p, const u32* st, u32 nc, float pc, SubGrid* s, u32* z) { grid_crowd_geom<2>(p, st, nc, pc, s, z); }
extern "C" __global__ void grid_crowd_geom_3(const float4* p, const u32* st, u32 nc, float pc, SubGrid* s, u32* z) { grid_crowd_geom<3>(p, st, nc, pc, s, z); }

// Sets each sub-grid's first entry from the scanned sizes.
extern "C" __global__ void grid_crowd_offsets(const u32* __restrict__ offs, u32 ncrowd, SubGrid* __restrict__ subs) {
    long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (o < ncrowd) subs[o].off = offs[o];
}

// Sub-cell (global entry index) of every sorted point of a crowded cell, counted; NO_ID for
// points of other cells. The cell is recomputed exactly as grid_count computed it.
template <int D>
__device__ void grid_sub_count(const float4* __restrict__ pts, long long n, GridGeom G,
                               const u32* __restrict__ starts, u32 crowd_min, const u32* __restrict__ crowd_of,
                               const SubGrid* __restrict__ subs, u32* __restrict__ sub_cell,
                               u32* __restrict__ sub_counts) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float4 v = pts[i];
    float p[3] = {v.x, v.y, v.z};
    u32 c = (u32)cell_of<D>(G, p);
    if (starts[c + 1] - starts[c] <= crowd_min) {
        sub_cell[i] = NO_ID;
        return;
    }
    const SubGrid& S = subs[crowd_of[c]];
    u32 j = S.off + (u32)cell_of<D>(S.G, p);
    sub_cell[i] = j;
    atomicAdd(&sub_counts[j], 1u);
}

extern "C" __global__ void grid_sub_count_1(const float4* p, long long n, GridGeom G, const u32* st, u32 cm, const u32* co, const SubGrid* s, u32* sc, u32* cnt) { grid_sub_count<1>(p, n, G, st, cm, co, s, sc, cnt); }
extern "C" __global__ void grid_sub_count_2(const float4* p, long long n, GridGeom G, const u32* st, u32 cm, const u32* co, const SubGrid* s, u32* sc, u32* cnt) { grid_sub_count<2>(p, n, G, st, cm, co, s, sc, cnt); }
extern "C" __global__ void grid_sub_count_3(const float4* p, long long n, GridGeom G, const u32* st, u32 cm, const u32* co, const SubGrid* s, u32* sc, u32* cnt) { grid_sub_count<3>(p, n, G, st, cm, co, s, sc, cnt); }

// One block per crowded cell: turns the global exclusive scan of sub-cell counts into positions
// inside the cell's range (and the scatter cursors).
extern "C" __global__ void grid_sub_fix(const u32* __restrict__ starts, const SubGrid* __restrict__ subs,
                                        u32* __restrict__ sub_starts, u32* __restrict__ cursor) {
    const SubGrid& S = subs[blockIdx.x];
    u32 m = (u32)(S.G.g[0] * S.G.g[1] * S.G.g[2]) + 1u;
    __shared__ u32 first;
    if (threadIdx.x == 0) first = sub_starts[S.off];
    __syncthreads();
    u32 add = starts[S.cell] - first; // modular: the sums are exact in u32
    for (u32 j = threadIdx.x; j < m; j += blockDim.x) {
        u32 v = sub_starts[S.off + j] + add;
        sub_starts[S.off + j] = v;
        cursor[S.off + j] = v;
    }
}

// Points of crowded cells moved to their sub-cell order, the others copied in place.
extern "C" __global__ void grid_sub_scatter(const float4* __restrict__ pts, long long n, const u32* __restrict__ sub_cell,
                                            u32* __restrict__ cursor, float4* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 j = sub_cell[i];
    u32 dst = j == NO_ID ? (u32)i : atomicAdd(&cursor[j], 1u);
    out[dst] = pts[i];
}

// ---- Search ----

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

// Lower bound along axis a on |x - q| for the points of cell i, the query's (clamped) cell being ci.
__device__ __forceinline__ float cell_gap(const GridGeom& G, int a, int i, int ci, float q, float margin) {
    if (i < ci) return face_gap(G, a, i + 1, -1, q, margin);
    if (i > ci) return face_gap(G, a, i - 1, 1, q, margin);
    return 0.f;
}

// A key bound from per-axis gaps, accumulated axis by axis.
template <int KERNEL>
__device__ __forceinline__ float bound_add(float acc, float gap) {
    if (KERNEL == KERNEL_SQL2) return acc + gap * gap;
    if (KERNEL == KERNEL_L1) return acc + gap;
    return fmaxf(acc, gap);
}

// Bound on the key of every point of a cell of G outside the cube [c - r, c + r]: the nearest
// face of the cube with cells beyond it (+inf when the cube covers the grid).
template <int D, int KERNEL>
__device__ __forceinline__ float outside_bound(const GridGeom& G, const int* c, int r, const float* q, const float* m) {
    float gap = GRID_INF;
#pragma unroll
    for (int a = 0; a < D; a++) {
        if (c[a] - r > 0) gap = fminf(gap, face_gap(G, a, c[a] - r, -1, q[a], m[a]));
        if (c[a] + r < G.g[a] - 1) gap = fminf(gap, face_gap(G, a, c[a] + r, 1, q[a], m[a]));
    }
    return KERNEL == KERNEL_SQL2 ? gap * gap : gap;
}

__device__ __forceinline__ bool grid_before(float ka, u32 ia, float kb, u32 ib) {
    return ka < kb || (ka == kb && ia < ib);
}

// One query's search state: its W best (key, id) pairs (positions in `pts` kept for the exact
// keys), sorted by (key, id), in registers for KMAX <= 32.
template <int D, int KERNEL, int KMAX>
struct GridSearch {
    float q[3];
    u32 skip; // excluded base id (self-joins), else NO_ID
    int w;
    float key[KMAX];
    u32 id[KMAX];
    u32 pos[KMAX];
    float worst;    // key[w - 1]
    u32 worst_id;   // id[w - 1]
    float rejected; // smallest key seen and not kept
    float skipped;  // smallest bound of the cells and regions skipped

    // Skips a cell (or plane, row, region) whose bound exceeds the k-th key with room to spare.
    __device__ __forceinline__ bool prune(float bound) {
        if (bound > worst * GRID_GROW) {
            skipped = fminf(skipped, bound);
            return true;
        }
        return false;
    }

    __device__ __forceinline__ void visit(const float4* __restrict__ pts, u32 p) {
        float4 v = pts[p];
        u32 pid = __float_as_uint(v.w);
        if (pid == skip) return;
        float k = grid_key<D, KERNEL>(q, v);
        if (!(k < worst || (k == worst && pid < worst_id))) {
            rejected = fminf(rejected, k);
            return;
        }
        // The evicted entry becomes a rejected candidate.
        if (worst_id != NO_ID) rejected = fminf(rejected, worst);
        if (KMAX <= 32) {
            // Insertion from slot w-1 down, indices known at compile time (the lists stay in
            // registers).
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
    }

    __device__ __forceinline__ void scan(const float4* __restrict__ pts, u32 s, u32 e) {
        for (u32 p = s; p < e; p++) visit(pts, p);
    }

    // The cells of shell r (Chebyshev distance r from cell c) of grid G; planes, rows and cells
    // whose bound exceeds the k-th key are skipped; cell(x, y, z) scans one cell.
    template <class Cell>
    __device__ __forceinline__ void shell(const GridGeom& G, const int* c, int r, const float* m, Cell cell) {
        int lo[3], hi[3];
#pragma unroll
        for (int a = 0; a < 3; a++) {
            lo[a] = a < D ? max(c[a] - r, 0) : 0;
            hi[a] = a < D ? min(c[a] + r, G.g[a] - 1) : 0;
        }
        for (int z = lo[2]; z <= hi[2]; z++) {
            float kz = D > 2 ? bound_add<KERNEL>(0.f, cell_gap(G, 2, z, c[2], q[2], m[2])) : 0.f;
            if (prune(kz)) continue;
            bool zedge = D > 2 && (z == c[2] - r || z == c[2] + r);
            for (int y = lo[1]; y <= hi[1]; y++) {
                float ky = D > 1 ? bound_add<KERNEL>(kz, cell_gap(G, 1, y, c[1], q[1], m[1])) : kz;
                if (prune(ky)) continue;
                bool yedge = D > 1 && (y == c[1] - r || y == c[1] + r);
                // On the shell: an edge in y or z visits the whole x row, else only its ends.
                int xstep = (r == 0 || zedge || yedge) ? 1 : 2 * r;
                for (int x = c[0] - r; x <= c[0] + r; x += xstep) {
                    if (x < 0 || x >= G.g[0]) continue;
                    if (prune(bound_add<KERNEL>(ky, cell_gap(G, 0, x, c[0], q[0], m[0])))) continue;
                    cell(x, y, z);
                }
            }
        }
    }

    // The query's cell and per-axis margins in grid G; returns the last shell index.
    __device__ __forceinline__ int locate(const GridGeom& G, int* c, float* m) {
        int rmax = 0;
#pragma unroll
        for (int a = 0; a < D; a++) {
            c[a] = axis_cell<D>(G, a, q[a]);
            m[a] = (fabsf(G.lo[a]) + (float)G.g[a] * G.size[a] + fabsf(q[a])) * GRID_MARGIN;
            rmax = max(rmax, max(c[a], G.g[a] - 1 - c[a]));
        }
#pragma unroll
        for (int a = D; a < 3; a++) {
            c[a] = 0;
            m[a] = 0.f;
        }
        return rmax;
    }

    // The box of sub-cells of H to search from sub-cell c: per axis, from c outwards until a
    // sub-cell's one-axis bound exceeds the k-th key (all farther ones then do too: the bounds
    // grow with the distance in cells; the first excluded one enters the floor as skipped).
    // Writes the first index and the count per axis.
    __device__ __forceinline__ void sub_box(const GridGeom& H, const int* c, const float* m, int* lo, int* n) {
#pragma unroll
        for (int a = 0; a < D; a++) {
            int l = c[a], h = c[a];
            while (l > 0 && !prune(bound_add<KERNEL>(0.f, cell_gap(H, a, l - 1, c[a], q[a], m[a])))) l--;
            while (h < H.g[a] - 1 && !prune(bound_add<KERNEL>(0.f, cell_gap(H, a, h + 1, c[a], q[a], m[a])))) h++;
            lo[a] = l;
            n[a] = h - l + 1;
        }
    }

};

// A crowded cell: its sub-cells, the query's own first, then those of the box around it past
// which (per axis) every bound exceeds the k-th key, each skipped when its own bound does. Not
// inlined: the search state comes in and goes out by value (crowded cells are rare and hold many
// points); inlined into the ring loops, NVRTC's compile time of the kernels grows tenfold.
template <int D, int KERNEL, int KMAX>
__device__ __noinline__ GridSearch<D, KERNEL, KMAX> grid_crowded(GridSearch<D, KERNEL, KMAX> S, const SubGrid* __restrict__ sg,
                                                                 const u32* __restrict__ sub_starts,
                                                                 const float4* __restrict__ pts) {
    const GridGeom H = sg->G;
    const u32 off = sg->off;
    int sc[3], blo[3] = {0, 0, 0}, bn[3] = {1, 1, 1};
    float sm[3];
    S.locate(H, sc, sm);
    int total = 2;
    for (int t = 0; t < total; t++) {
        int sx = sc[0], sy = sc[1], sz = sc[2];
        if (t > 0) {
            if (t == 1) {
                S.sub_box(H, sc, sm, blo, bn);
                total = 1 + bn[0] * bn[1] * bn[2];
            }
            int u = t - 1;
            sx = blo[0] + u % bn[0];
            sy = blo[1] + (u / bn[0]) % bn[1];
            sz = blo[2] + u / (bn[0] * bn[1]);
            if (sx == sc[0] && sy == sc[1] && sz == sc[2]) continue; // visited first
            float b = 0.f;
            if (D > 2) b = bound_add<KERNEL>(b, cell_gap(H, 2, sz, sc[2], S.q[2], sm[2]));
            if (D > 1) b = bound_add<KERNEL>(b, cell_gap(H, 1, sy, sc[1], S.q[1], sm[1]));
            b = bound_add<KERNEL>(b, cell_gap(H, 0, sx, sc[0], S.q[0], sm[0]));
            if (S.prune(b)) continue;
        }
        u32 j = off + (u32)(((long long)sz * H.g[1] + sy) * H.g[0] + sx);
        S.scan(pts, sub_starts[j], sub_starts[j + 1]);
    }
    return S;
}

// Ring search for one query (Qs: the queries as float4 (x, y, z, index), in cell order).
// Candidates (FINISH false; KMAX 128, for retries): row `index` gets the w smallest (key, id) pairs sorted by (key, id), their
// exact f64 keys, and a floor (a lower bound on the exact key of every point left out).
// FINISH: row `index` gets the final ids and distances sorted by (distance, id), and
// out_proven[index] = 1 when the floor proves them (the pipeline's check, done here). Rows
// holding an empty slot (a bug) set *bad.
template <int D, int KERNEL, int KMAX, bool FINISH>
__device__ void grid_query(const float4* __restrict__ Qs, long long nq, const u32* __restrict__ exclude,
                           GridGeom G, const u32* __restrict__ starts, const float4* __restrict__ pts,
                           u32 crowd_min, const u32* __restrict__ crowd_of, const SubGrid* __restrict__ subs,
                           const u32* __restrict__ sub_starts, int w, int complete, int mode,
                           u32* __restrict__ out_ids, float* __restrict__ out_keys, double* __restrict__ out_exact,
                           float* __restrict__ out_floor, unsigned char* __restrict__ out_proven, int* bad) {
    // Queries come sorted by cell (consecutive threads share cells); w holds the query's index.
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nq) return;
    float4 qv = Qs[t];
    long long qi = __float_as_uint(qv.w);
    GridSearch<D, KERNEL, KMAX> S;
    S.q[0] = qv.x;
    S.q[1] = qv.y;
    S.q[2] = qv.z;
    S.skip = exclude ? exclude[qi] : NO_ID;
    S.w = w;
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        S.key[j] = GRID_INF;
        S.id[j] = NO_ID;
        S.pos[j] = 0;
    }
    S.worst = GRID_INF;
    S.worst_id = NO_ID;
    S.rejected = GRID_INF;
    S.skipped = GRID_INF;
    int c[3];
    float m[3];
    int rmax = S.locate(G, c, m);
    for (int r = 0; r <= rmax; r++) {
        S.shell(G, c, r, m, [&](int x, int y, int z) {
            long long cell = ((long long)z * G.g[1] + y) * G.g[0] + x;
            u32 s = starts[cell], e = starts[cell + 1];
            if (e - s <= crowd_min) {
                S.scan(pts, s, e);
                return;
            }
            S = grid_crowded(S, subs + crowd_of[cell], sub_starts, pts);
        });
        // Everything outside the cube [c - r, c + r] is at least this far: stop when that is
        // past the k-th key (the region then enters the floor as a skipped bound).
        if (S.prune(outside_bound<D, KERNEL>(G, c, r, S.q, m))) break;
    }
    // Floor: every point left out is visited and rejected (exact key >= computed key within
    // 6u < 2^-21, relative) or lies in a skipped cell or region (exact key >= its bound, the
    // bound's own rounding within 2^-20); shrunk so, then rounded down, it stays a lower bound.
    double f = fmin((double)S.rejected * (1.0 - 1.0 / 2097152.0), (double)S.skipped * (1.0 - 1.0 / 1048576.0));
    float floor32 = complete ? GRID_INF : __double2float_rd(f);
    long long o = qi * (long long)w;
    bool empty = false;
    double emax = 0.0; // largest exact key of the row (finish modes)
    // Row outputs; in finish modes the keys become exact-key distances. Register lists are
    // indexed with compile-time indices only (unrolled), so they stay in registers.
    if (KMAX <= 32) {
#pragma unroll
        for (int j = 0; j < KMAX; j++) {
            if (j < w) {
                double e = S.id[j] != NO_ID ? grid_exact<D, KERNEL>(S.q, pts[S.pos[j]]) : 0.0;
                empty |= S.id[j] == NO_ID;
                out_ids[o + j] = S.id[j];
                if (!FINISH) {
                    out_keys[o + j] = S.key[j];
                    out_exact[o + j] = e;
                } else {
                    emax = fmax(emax, e);
                    S.key[j] = mode == GRID_FINISH_SQRT ? __double2float_rn(__dsqrt_rn(fmax(e, 0.0))) : __double2float_rn(e);
                    out_keys[o + j] = S.key[j];
                }
            }
        }
    } else {
        for (int j = 0; j < w; j++) {
            double e = S.id[j] != NO_ID ? grid_exact<D, KERNEL>(S.q, pts[S.pos[j]]) : 0.0;
            empty |= S.id[j] == NO_ID;
            out_ids[o + j] = S.id[j];
            if (!FINISH) {
                out_keys[o + j] = S.key[j];
                out_exact[o + j] = e;
            } else {
                emax = fmax(emax, e);
                S.key[j] = mode == GRID_FINISH_SQRT ? __double2float_rn(__dsqrt_rn(fmax(e, 0.0))) : __double2float_rn(e);
                out_keys[o + j] = S.key[j];
            }
        }
    }
    if (!FINISH) {
        out_floor[qi] = floor32;
    } else {
        // The pipeline's re-rank, done here: the row is proven when its largest exact key is
        // below the floor; it must read in (distance, id) order, which rounding to f32 rarely
        // breaks (entries past w hold (+inf, NO_ID) and stay last): then an insertion sort of
        // the written row.
        bool sorted = true;
        if (KMAX <= 32) {
#pragma unroll
            for (int j = 0; j + 1 < KMAX; j++)
                sorted &= !grid_before(S.key[j + 1], S.id[j + 1], S.key[j], S.id[j]);
        } else {
            for (int j = 0; j + 1 < w; j++)
                sorted &= !grid_before(S.key[j + 1], S.id[j + 1], S.key[j], S.id[j]);
        }
        if (!sorted) {
            for (int j = 1; j < w; j++) {
                float kk = out_keys[o + j];
                u32 ii = out_ids[o + j];
                int t2 = j;
                while (t2 > 0 && grid_before(kk, ii, out_keys[o + t2 - 1], out_ids[o + t2 - 1])) {
                    out_keys[o + t2] = out_keys[o + t2 - 1];
                    out_ids[o + t2] = out_ids[o + t2 - 1];
                    t2--;
                }
                out_keys[o + t2] = kk;
                out_ids[o + t2] = ii;
            }
        }
        out_proven[qi] = !empty && (complete || emax < (double)floor32) ? 1 : 0;
    }
    if (empty) atomicOr(bad, 1);
}

#define GRIDQ(NAME, D, K, KMAX, FINISH)                                                             \
    extern "C" __global__ void NAME(const float4* Q, long long nq, const u32* exclude, GridGeom G,  \
                                    const u32* starts, const float4* pts, u32 crowd_min,           \
                                    const u32* crowd_of, const SubGrid* subs,                      \
                                    const u32* sub_starts, int w, int complete, int mode,          \
                                    u32* out_ids, float* out_keys, double* out_exact,              \
                                    float* out_floor, unsigned char* out_proven, int* bad) {       \
        grid_query<D, K, KMAX, FINISH>(Q, nq, exclude, G, starts, pts, crowd_min, crowd_of, subs,  \
                                       sub_starts, w, complete, mode, out_ids, out_keys,           \
                                       out_exact, out_floor, out_proven, bad);                     \
    }

// Finished rows for every width up to 128 (lists in registers up to 32); candidates with exact
// keys for the pipeline's retries (and data the pipeline transformed), in local memory. Only
// D = 3: data of 1 or 2 dimensions runs them with zero coordinates and one cell along the
// unused axes (keys, exact keys and bounds come out bit for bit the same), which keeps the
// number of kernels, and NVRTC's compile time, down.
GRIDQ(grid_query_sql2_k1, 3, KERNEL_SQL2, 1, true)
GRIDQ(grid_query_l1_k1, 3, KERNEL_L1, 1, true)
GRIDQ(grid_query_linf_k1, 3, KERNEL_LINF, 1, true)
GRIDQ(grid_query_sql2_k8, 3, KERNEL_SQL2, 8, true)
GRIDQ(grid_query_l1_k8, 3, KERNEL_L1, 8, true)
GRIDQ(grid_query_linf_k8, 3, KERNEL_LINF, 8, true)
GRIDQ(grid_query_sql2_k16, 3, KERNEL_SQL2, 16, true)
GRIDQ(grid_query_l1_k16, 3, KERNEL_L1, 16, true)
GRIDQ(grid_query_linf_k16, 3, KERNEL_LINF, 16, true)
GRIDQ(grid_query_sql2_k32, 3, KERNEL_SQL2, 32, true)
GRIDQ(grid_query_l1_k32, 3, KERNEL_L1, 32, true)
GRIDQ(grid_query_linf_k32, 3, KERNEL_LINF, 32, true)
GRIDQ(grid_query_sql2_k128, 3, KERNEL_SQL2, 128, true)
GRIDQ(grid_query_l1_k128, 3, KERNEL_L1, 128, true)
GRIDQ(grid_query_linf_k128, 3, KERNEL_LINF, 128, true)
GRIDQ(grid_cand_sql2, 3, KERNEL_SQL2, 128, false)
GRIDQ(grid_cand_l1, 3, KERNEL_L1, 128, false)
GRIDQ(grid_cand_linf, 3, KERNEL_LINF, 128, false)
