// Expression metrics: the fused kernels with the per-coordinate operation replaced by a
// generated program. Compiled per expression, in one NVRTC program made of common.cuh, the
// generated prelude (EXPR_CH and expr_op, see src/expr.rs), tiles.cu, fused.cu and this file, with
// -DKNN_EXPR_ONLY (the expression operation) and -DKNN_MODULE_ONLY (none of the main module's
// kernels), so that only these kernels are instantiated.
//
// Rows hold EXPR_CH channel values per coordinate (d counts values: coordinates × EXPR_CH).
// Each pair's key is expr_op applied coordinate after coordinate from acc = 0, in order: the
// evaluation model of knn_core::ExprPlan (IEEE operations, fmaf contractions allowed).

// acc[i][j] as in tile_compute, the program run on groups of EXPR_CH staged columns. KC is a
// multiple of EXPR_CH (1, 2, 4, 8 or 16), so a group never straddles two stages; columns past d
// (the last stage) are skipped, not fed zeros. EXPR_TAIL is 0 in modules for d a multiple of
// KC: no stage is partial, and the loop is the built-in kernels' loop.
__device__ __forceinline__ void tile_compute_expr(const float* __restrict__ Q, long long nq,
                                                  long long q0, const float* __restrict__ B,
                                                  long long nb, long long b0, int d, long long ldb,
                                                  float* work, float acc[8][8]) {
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
        const bool full = !EXPR_TAIL || k0 + KC <= d;
#pragma unroll
        for (int kk = 0; kk < KC; kk += EXPR_CH) {
            if (full || k0 + kk < d) {
                float a[8][EXPR_CH], b[8][EXPR_CH];
#pragma unroll
                for (int c = 0; c < EXPR_CH; c++) {
                    float4 a0 = *(const float4*)&As[(kk + c) * SPAD + ty * 4];
                    float4 a1 = *(const float4*)&As[(kk + c) * SPAD + 64 + ty * 4];
                    float4 c0 = *(const float4*)&Bs[(kk + c) * SPAD + tx * 4];
                    float4 c1 = *(const float4*)&Bs[(kk + c) * SPAD + 64 + tx * 4];
                    a[0][c] = a0.x; a[1][c] = a0.y; a[2][c] = a0.z; a[3][c] = a0.w;
                    a[4][c] = a1.x; a[5][c] = a1.y; a[6][c] = a1.z; a[7][c] = a1.w;
                    b[0][c] = c0.x; b[1][c] = c0.y; b[2][c] = c0.z; b[3][c] = c0.w;
                    b[4][c] = c1.x; b[5][c] = c1.y; b[6][c] = c1.z; b[7][c] = c1.w;
                }
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[i][j] = expr_op(acc[i][j], a[i], b[j]);
            }
        }
    }
}

FUSED(fused_expr_w32, KERNEL_EXPR, 1, false)
FUSED(fused_expr_w64, KERNEL_EXPR, 2, false)
FUSED(fused_expr_w128, KERNEL_EXPR, 4, false)
TILE(tile_expr, KERNEL_EXPR)
FILTER(filter_expr, KERNEL_EXPR, false)
