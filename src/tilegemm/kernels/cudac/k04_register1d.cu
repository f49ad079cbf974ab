// Rung 4 — register1d: the optimisation note's matrixMulSharedILPkernel, generalised to R
// outputs per thread.
//
// Rung 3 makes two shared-memory loads (As[ty][k] and Bs[k][tx]) per multiply-add, so
// shared-memory bandwidth, not arithmetic, bounds it. Here a block still stages TILE × TILE
// tiles of A and B, but has only TILE × TILE/R threads: thread (tx, ty) computes the R
// outputs in rows ty + r·ROWS (ROWS = TILE/R) of column tx. In the inner loop it loads
// Bs[k][tx] once into a register and uses it for R multiply-adds: R + 1 shared loads for R
// multiply-adds instead of 2R, and R independent accumulators give the scheduler
// instruction-level parallelism to hide latency. The optimisation note's sweep at 1024³ with 32 × 32
// tiles (R = 1, 2, 4, 8, 16, 32: 3.67, 4.80, 6.02, 6.77, 6.67, 5.32 TFLOP/s) shows the
// trade-off: more reuse per thread, until registers and fewer threads cut occupancy.
//
// Fixed compared with the optimisation note: it hard-codes R = 2 and a "+16" row offset (right only
// for 32 × 32 tiles) and assumes square sizes that are multiples of the tile; here any R
// dividing TILE, any M, N, K, zero-filled edges, no early exit before a barrier.
// acc[R] is indexed only by unrolled loops with constant bounds, so it lives in registers.
#include "_gemm.cuh"

#ifndef TILE
#define TILE 32  // tile side
#endif
#ifndef R
#define R 4      // outputs per thread, down a column
#endif
#define ROWS (TILE / R)  // threads along y, and the row step between a thread's outputs

// One resident block is enough: R accumulators need registers (see _gemm.cuh).
extern "C" __global__ void __launch_bounds__(TILE * ROWS, 1)
tilegemm_register1d(GEMM_ARGS)
{
    __shared__ T As[TILE][TILE];
    __shared__ T Bs[TILE][TILE];
    const int tx = threadIdx.x;  // column inside the tile
    const int ty = threadIdx.y;  // first row inside the tile; the others are ty + r * ROWS
    const int tiles_m = (M + TILE - 1) / TILE;
    const int tiles_n = (N + TILE - 1) / TILE;

    for (idx_t z = blockIdx.z; z < batch; z += gridDim.z)
    for (int by = blockIdx.y; by < tiles_m; by += gridDim.y)
    for (int bx = blockIdx.x; bx < tiles_n; bx += gridDim.x) {
        const idx_t row0 = (idx_t)by * TILE + ty;
        const idx_t col = (idx_t)bx * TILE + tx;
        const T* a = A + z * sAb;
        const T* b = B + z * sBb;
        T acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r)
            acc[r] = T(0);
        for (int k0 = 0; k0 < K; k0 += TILE) {
            // Each thread copies R elements of each tile, ROWS rows apart (coalesced in x).
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int tr = ty + r * ROWS;
                const idx_t row = row0 + r * ROWS;
                As[tr][tx] = (row < M && k0 + tx < K) ? a[row * sAm + (idx_t)(k0 + tx) * sAk]
                                                      : T(0);
                Bs[tr][tx] = (k0 + tr < K && col < N) ? b[(idx_t)(k0 + tr) * sBk + col * sBn]
                                                      : T(0);
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < TILE; ++k) {
                const T bk = Bs[k][tx];  // one shared load, reused for R outputs
#pragma unroll
                for (int r = 0; r < R; ++r)
                    acc[r] += As[ty + r * ROWS][k] * bk;
            }
            __syncthreads();
        }
        if (col < N) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const idx_t row = row0 + r * ROWS;
                if (row < M)
                    store_c(&C[z * sCb + row * sCm + col * sCn], acc[r], alpha, beta);
            }
        }
    }
}
