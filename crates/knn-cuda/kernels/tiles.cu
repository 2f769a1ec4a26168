// Key tiles of the fused method: a 128 x 128 (queries x base points) tile of keys per step,
// computed with 8 x 8 register tiles per thread (256 threads, FP32) or on the tensor cores
// (TF32, optionally f16 inputs), left in shared memory for the list code of fused.cu, so the
// n_q x n_b key matrix never reaches device memory.
//
// Layouts: Q is nq x d and B is nb x d, row-major, d innermost. Keys:
//   SqL2   ‖q‖² + ‖b‖² − 2 q·b    (GEMM form, f32, fmaf)
//   NegDot −q·b
//   L1     Σ|qᵢ − bᵢ|             (direct)
//   Linf   max|qᵢ − bᵢ|           (direct)
//   Expr   a generated per-coordinate program (kernels/expr.cu, compiled per expression)

#define BQ 128        // queries per block tile
#define BB 128        // base points per block tile
#define KC 16         // coordinates staged per step
#define SPAD 132      // staging row stride (floats): conflict-light stores, 16-byte aligned rows
#define TSTRIDE 129   // key tile row stride (floats)
#define THREADS 256

template <int KERNEL>
__device__ __forceinline__ float op(float acc, float a, float b) {
    if (KERNEL == KERNEL_SQL2 || KERNEL == KERNEL_NEGDOT) return fmaf(a, b, acc);
    if (KERNEL == KERNEL_L1) return acc + fabsf(a - b);
    return fmaxf(acc, fabsf(a - b));
}

// Loads this thread's 8 staged values of rows [r0, r0+128) x coordinates [k0, k0+16) (zero
// outside the matrix): element e = tid + 256*i is row e/16, coordinate e%16.
__device__ __forceinline__ void load_stage(const float* __restrict__ X, long long rows, long long r0,
                                           int d, long long ld, int k0, float v[8]) {
    int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int e = tid + THREADS * i;
        int r = e >> 4, k = e & 15;
        long long row = r0 + r;
        int col = k0 + k;
        v[i] = (row < rows && col < d) ? X[row * ld + col] : 0.f;
    }
}

__device__ __forceinline__ void store_stage(float* S, const float v[8]) {
    int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int e = tid + THREADS * i;
        S[(e & 15) * SPAD + (e >> 4)] = v[i];
    }
}

// acc[i][j] = kernel accumulation of query row (ty*4 + i%4 + 64*(i/4)) against base row
// (tx*4 + j%4 + 64*(j/4)) of the tile. `work` holds 2*KC*SPAD floats.
template <int KERNEL>
__device__ __forceinline__ void tile_compute(const float* __restrict__ Q, long long nq, long long q0,
                                             const float* __restrict__ B, long long nb, long long b0,
                                             int d, long long ldb, float* work,
                                             float acc[8][8]) {
#ifdef KNN_EXPR_ONLY
    if constexpr (KERNEL == KERNEL_EXPR) {
        // The generated per-coordinate program, over channel groups (kernels/expr.cu).
        tile_compute_expr(Q, nq, q0, B, nb, b0, d, ldb, work, acc);
        return;
    }
#endif
    float* As = work;
    float* Bs = work + KC * SPAD;
    int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
    float va[8], vb[8];
    load_stage(Q, nq, q0, d, d, 0, va);
    load_stage(B, nb, b0, d, ldb, 0, vb);
    for (int k0 = 0; k0 < d; k0 += KC) {
        __syncthreads();
        store_stage(As, va);
        store_stage(Bs, vb);
        __syncthreads();
        if (k0 + KC < d) {
            load_stage(Q, nq, q0, d, d, k0 + KC, va);
            load_stage(B, nb, b0, d, ldb, k0 + KC, vb);
        }
#pragma unroll
        for (int kk = 0; kk < KC; kk++) {
            float4 a0 = *(const float4*)&As[kk * SPAD + ty * 4];
            float4 a1 = *(const float4*)&As[kk * SPAD + 64 + ty * 4];
            float4 c0 = *(const float4*)&Bs[kk * SPAD + tx * 4];
            float4 c1 = *(const float4*)&Bs[kk * SPAD + 64 + tx * 4];
            float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            float b[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] = op<KERNEL>(acc[i][j], a[i], b[j]);
        }
    }
}

__device__ __forceinline__ int tile_row(int ty, int i) { return ty * 4 + (i & 3) + 64 * (i >> 2); }

template <int KERNEL>
__device__ __forceinline__ float finish_key(float acc, float qn, float bn) {
    if (KERNEL == KERNEL_SQL2) return fmaf(-2.f, acc, qn + bn);
    if (KERNEL == KERNEL_NEGDOT) return -acc;
    return acc;
}

// ---- TF32 tensor-core path (SqL2 / NegDot, non-precise requests) ----
// mma.sync m16n8k8 with inputs rounded to nearest TF32 (cvt.rna: |x̃ − x| ≤ 2⁻¹¹|x|), f32
// accumulation; the floors use Kernel::error_bound with u_in = 2⁻¹¹ and a 4× f32 unit for the
// tensor cores' accumulation (it truncates). Warps: wq = warp&1 owns query rows [64wq, +64),
// wb = warp>>1 owns base columns [32wb, +32): 4 × 4 tiles of 16 × 8 per warp.
#define SPAD_TF 136   // staging stride: fragment loads (bank 8t+g) and stores are conflict-free
#define TS_TF 136     // key tile stride: float2 stores of the accumulators are conflict-free

__device__ __forceinline__ float tf32_round(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

template <bool PRE>
__device__ __forceinline__ float tf32_pre(float x) {
    return PRE ? x : tf32_round(x);
}

__device__ __forceinline__ void mma_tf32(float c[4], const u32 a[4], const u32 b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same fragments read as pairs of halves (f16x2 words, k16 per instruction): A's registers
// (row g, words t and t+4; row g+8, likewise) and B's (column g, words t and t+4) sit where
// m16n8k8's TF32 ones do, with a word of two halves for each float, so the staging and fragment
// code serve both. Products of halves are exact; accumulation in f32 as TF32's.
__device__ __forceinline__ void mma_f16(float c[4], const u32 a[4], const u32 b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Staged value i of a thread: row w*16 + (i>>2)*8 + (lane>>2), coordinate (i&3)*4 + (lane&3), so
// that a warp's 32 stores hit 32 banks (bank = 8k + row mod 32).
__device__ __forceinline__ void load_stage_tf(const float* __restrict__ X, long long rows,
                                              long long r0, int d, long long ld, int k0,
                                              float v[8]) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int k = (i & 3) * 4 + (lane & 3), r = w * 16 + (i >> 2) * 8 + (lane >> 2);
        long long row = r0 + r;
        int col = k0 + k;
        v[i] = (row < rows && col < d) ? X[row * ld + col] : 0.f;
    }
}

__device__ __forceinline__ void store_stage_tf(float* S, const float v[8]) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int k = (i & 3) * 4 + (lane & 3), r = w * 16 + (i >> 2) * 8 + (lane >> 2);
        S[k * SPAD_TF + r] = tf32_round(v[i]);
    }
}

// acc[i][j][c] = q̃·b̃ of query row 64wq + 16i + g + 8(c>>1) and base column 32wb + 8j + 2t + (c&1)
// (g = lane>>2, t = lane&3). `work` holds 2*KC*SPAD_TF floats.
__device__ __forceinline__ void tile_compute_tf(const float* __restrict__ Q, long long nq,
                                                long long q0, const float* __restrict__ B,
                                                long long nb, long long b0, int d, long long ldb,
                                                float* work, float acc[4][4][4]) {
    float* As = work;
    float* Bs = work + KC * SPAD_TF;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, t = lane & 3;
    int qr = (warp & 1) * 64 + g, bc = (warp >> 1) * 32 + g;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
    float va[8], vb[8];
    load_stage_tf(Q, nq, q0, d, d, 0, va);
    load_stage_tf(B, nb, b0, d, ldb, 0, vb);
    for (int k0 = 0; k0 < d; k0 += KC) {
        __syncthreads();
        store_stage_tf(As, va);
        store_stage_tf(Bs, vb);
        __syncthreads();
        if (k0 + KC < d) {
            load_stage_tf(Q, nq, q0, d, d, k0 + KC, va);
            load_stage_tf(B, nb, b0, d, ldb, k0 + KC, vb);
        }
#pragma unroll
        for (int kk = 0; kk < KC; kk += 8) {
            const float* alo = As + (kk + t) * SPAD_TF + qr;
            const float* ahi = As + (kk + t + 4) * SPAD_TF + qr;
            const float* blo = Bs + (kk + t) * SPAD_TF + bc;
            const float* bhi = Bs + (kk + t + 4) * SPAD_TF + bc;
            u32 bf[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                bf[j][0] = __float_as_uint(blo[8 * j]);
                bf[j][1] = __float_as_uint(bhi[8 * j]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 af[4] = {__float_as_uint(alo[16 * i]), __float_as_uint(alo[16 * i + 8]),
                             __float_as_uint(ahi[16 * i]), __float_as_uint(ahi[16 * i + 8])};
#pragma unroll
                for (int j = 0; j < 4; j++) mma_tf32(acc[i][j], af, bf[j]);
            }
        }
    }
}

// Same product (same rounding, same mma sequence, so bit-identical keys) with the staging done
// by cp.async, three stages deep, rows [row][k] of stride SROW_AS floats (fragment loads
// conflict-free: bank 20g + t), TF32 rounding applied to the fragments. Needs d % 4 == 0 and
// 16-byte aligned Q and B. `work` holds 3 stages of 2 * BQ * SROW_AS floats (61440 bytes).
#ifndef TF_ASYNC
#define TF_ASYNC 1
#endif
#define SROW_AS 20
#define STAGE_AS (2 * BQ * SROW_AS)

__device__ __forceinline__ void cp_async16(float* dst, const float* src, int src_bytes) {
    u32 s;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(s)
                 : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(src_bytes));
}

// Stage of coordinates [k0, k0+KC) of Q rows [q0, +BQ) and B rows [b0, +BB): 16-byte chunks,
// chunk c = row * 4 + part (zero-filled outside the matrices).
__device__ __forceinline__ void issue_stage_as(const float* __restrict__ Q, long long nq,
                                               long long q0, const float* __restrict__ B,
                                               long long nb, long long b0, int d, long long ldb,
                                               int k0, float* st) {
    int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int c = tid + THREADS * (i & 1);
        int row = c >> 2, part = c & 3;
        int col = k0 + part * 4;
        const float* X = i < 2 ? Q : B;
        long long r = (i < 2 ? q0 : b0) + row;
        bool ok = r < (i < 2 ? nq : nb) && col < d;
        cp_async16(st + (i < 2 ? 0 : BQ * SROW_AS) + row * SROW_AS + part * 4,
                   ok ? X + r * (i < 2 ? (long long)d : ldb) + col : X, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// PRE: Q and B already hold TF32 values (rounded once, by `round_tf32`), so the fragments are
// taken as they are (the same bits as rounding them here). H16: Q and B hold rows of f16x2
// words (`round_f16`; d counts words, two coordinates each) and the product is `mma_f16`'s.
template <bool PRE = false, bool H16 = false>
__device__ __forceinline__ void tile_compute_tf_async(const float* __restrict__ Q, long long nq,
                                                      long long q0, const float* __restrict__ B,
                                                      long long nb, long long b0, int d,
                                                      long long ldb, float* work,
                                                      float acc[4][4][4]) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, t = lane & 3;
    int qr = (warp & 1) * 64 + g, bc = (warp >> 1) * 32 + g;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.f;
    int nk = (d + KC - 1) / KC;
    issue_stage_as(Q, nq, q0, B, nb, b0, d, ldb, 0, work);
    if (nk > 1)
        issue_stage_as(Q, nq, q0, B, nb, b0, d, ldb, KC, work + STAGE_AS);
    else
        asm volatile("cp.async.commit_group;\n" ::);
    for (int s = 0; s < nk; s++) {
        asm volatile("cp.async.wait_group 1;\n" ::);
        __syncthreads();  // stage s landed for all; stage s-1's buffer is free
        if (s + 2 < nk)
            issue_stage_as(Q, nq, q0, B, nb, b0, d, ldb, (s + 2) * KC, work + ((s + 2) % 3) * STAGE_AS);
        else
            asm volatile("cp.async.commit_group;\n" ::);
        const float* As = work + (s % 3) * STAGE_AS;
        const float* Bs = As + BQ * SROW_AS;
#pragma unroll
        for (int kk = 0; kk < KC; kk += 8) {
            u32 bf[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float* p = Bs + (bc + 8 * j) * SROW_AS + kk + t;
                bf[j][0] = __float_as_uint(tf32_pre<PRE>(p[0]));
                bf[j][1] = __float_as_uint(tf32_pre<PRE>(p[4]));
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float* p = As + (qr + 16 * i) * SROW_AS + kk + t;
                u32 af[4] = {__float_as_uint(tf32_pre<PRE>(p[0])),
                             __float_as_uint(tf32_pre<PRE>(p[8 * SROW_AS])),
                             __float_as_uint(tf32_pre<PRE>(p[4])),
                             __float_as_uint(tf32_pre<PRE>(p[8 * SROW_AS + 4]))};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if constexpr (H16)
                        mma_f16(acc[i][j], af, bf[j]);
                    else
                        mma_tf32(acc[i][j], af, bf[j]);
                }
            }
        }
    }
}

// Computes the BQ x BB key tile of queries [q0, q0+BQ) x base rows [b0, b0+BB) (rows at or past
// nb / nq hold garbage) into work[row * stride + col], stride TS_TF when TF else TSTRIDE.
// Starts and ends with the staging area free (the caller syncs before reading the tile).
// With CM (TF only), the tile is stored column-major instead, work[col * TSC + row]: the scalar
// stores are conflict-free, and so are the thread-per-row reads of `fold_tile_thread`.
// H16 (TF, CM and PRE): Q and B are `round_f16`'s rows (d words of two halves, d % 4 == 0,
// 16-byte aligned), scaled by 1/us: the products are multiplied by us twice (exact powers of
// two) before the norms meet them.
#define TSC 132
template <int KERNEL, bool TF, bool CM = false, bool PRE = false, bool H16 = false>
__device__ __forceinline__ void keys_to_smem(const float* __restrict__ Q,
                                             const float* __restrict__ qn, long long nq,
                                             long long q0, const float* __restrict__ B,
                                             const float* __restrict__ bn, long long nb,
                                             long long b0, int d, int bstep, float* work,
                                             float us = 1.f) {
    int tid = threadIdx.x;
    long long ldb = (long long)bstep * d;  // base row b of the tile is B[b * ldb], bn[b * bstep]
    if constexpr (TF) {
        float acc[4][4][4];
        if constexpr (H16) {
            tile_compute_tf_async<true, true>(Q, nq, q0, B, nb, b0, d, ldb, work, acc);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[i][j][c] = (acc[i][j][c] * us) * us;
        } else if (TF_ASYNC && (d & 3) == 0 &&
                   ((((unsigned long long)Q) | ((unsigned long long)B)) & 15) == 0)
            tile_compute_tf_async<PRE>(Q, nq, q0, B, nb, b0, d, ldb, work, acc);
        else
            tile_compute_tf(Q, nq, q0, B, nb, b0, d, ldb, work, acc);
        int lane = tid & 31, warp = tid >> 5;
        int g = lane >> 2, t = lane & 3;
        float qv[8], bv[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            long long q = q0 + (warp & 1) * 64 + (i >> 1) * 16 + g + 8 * (i & 1);
            long long b = b0 + (warp >> 1) * 32 + (i >> 1) * 8 + 2 * t + (i & 1);
            qv[i] = (KERNEL == KERNEL_SQL2 && q < nq) ? qn[q] : 0.f;
            bv[i] = (KERNEL == KERNEL_SQL2 && b < nb) ? bn[b * bstep] : 0.f;
        }
        __syncthreads();  // staging area becomes the key tile
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = (warp & 1) * 64 + i * 16 + g + 8 * h;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int col = (warp >> 1) * 32 + j * 8 + 2 * t;
                    float2 v;
                    v.x = finish_key<KERNEL>(acc[i][j][2 * h], qv[2 * i + h], bv[2 * j]);
                    v.y = finish_key<KERNEL>(acc[i][j][2 * h + 1], qv[2 * i + h], bv[2 * j + 1]);
                    if constexpr (CM) {
                        work[col * TSC + row] = v.x;
                        work[(col + 1) * TSC + row] = v.y;
                    } else {
                        *(float2*)&work[row * TS_TF + col] = v;
                    }
                }
            }
    } else {
        int ty = tid >> 4, tx = tid & 15;
        float acc[8][8];
        tile_compute<KERNEL>(Q, nq, q0, B, nb, b0, d, ldb, work, acc);
        float qv[8], bv[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            long long q = q0 + tile_row(ty, i), b = b0 + tile_row(tx, i);
            qv[i] = (KERNEL == KERNEL_SQL2 && q < nq) ? qn[q] : 0.f;
            bv[i] = (KERNEL == KERNEL_SQL2 && b < nb) ? bn[b * bstep] : 0.f;
        }
        __syncthreads();  // staging area becomes the key tile
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                work[tile_row(ty, i) * TSTRIDE + tile_row(tx, j)] =
                    finish_key<KERNEL>(acc[i][j], qv[i], bv[j]);
    }
}

