// Rung 3 — shared: cuda-samples' MatrixMulCUDA<BLOCK_SIZE> (and the optimisation note's
// matmul_ShareMemory, the same algorithm), for any shape.
//
// Block (bx, by) computes the TILE × TILE tile C[by][bx] = sum over t of A[by][t] @ B[t][bx]:
// it walks A's row panel left to right and B's column panel top to bottom, one tile at a
// time (the sample's aBegin/aEnd/aStep and bBegin/bStep). Each thread copies one element
// of each tile into shared memory; after a barrier every thread reads a row of As and a
// column of Bs. Every value loaded from global memory is now used TILE times, so global
// traffic falls by a factor of TILE. In the inner loop a warp reads one As element (a
// broadcast) and 32 consecutive Bs elements (32 different banks): no bank conflicts.
//
// Fixed compared with the sample and the optimisation note: they assume every dimension is a multiple
// of BLOCK_SIZE and read out of bounds otherwise. Here elements outside A or B are loaded
// as zeros (which add nothing to the sum) and only the store is guarded: no thread leaves
// before a __syncthreads(), which would be undefined behaviour for the block. Batches run
// in grid z, and the tile loops stride over the grid, so any grid size is correct; their
// bounds depend only on block indices and shapes, so all threads of a block reach every
// barrier together.
#include "_gemm.cuh"

#ifndef TILE
#define TILE 16  // the sample's BLOCK_SIZE: tile side and threads per block side
#endif

// Blocks enough for 1,024 resident threads: at most 64 registers a thread (see _gemm.cuh).
extern "C" __global__ void __launch_bounds__(TILE * TILE, 1024 / (TILE * TILE))
tilegemm_shared(GEMM_ARGS)
{
    __shared__ T As[TILE][TILE];
    __shared__ T Bs[TILE][TILE];
    const int tx = threadIdx.x;  // column inside the tile: consecutive threads, consecutive
    const int ty = threadIdx.y;  // addresses of B and C (coalesced)
    const int tiles_m = (M + TILE - 1) / TILE;
    const int tiles_n = (N + TILE - 1) / TILE;

    for (idx_t z = blockIdx.z; z < batch; z += gridDim.z)
    for (int by = blockIdx.y; by < tiles_m; by += gridDim.y)
    for (int bx = blockIdx.x; bx < tiles_n; bx += gridDim.x) {
        const idx_t row = (idx_t)by * TILE + ty;
        const idx_t col = (idx_t)bx * TILE + tx;
        // The sample's aBegin and bBegin: the first tile of A's row panel and of B's
        // column panel. Each step moves right by TILE columns of A (aStep) and down by
        // TILE rows of B (bStep).
        const T* a = A + z * sAb + row * sAm;
        const T* b = B + z * sBb + col * sBn;
        T Csub = T(0);
        for (int k0 = 0; k0 < K; k0 += TILE) {
            As[ty][tx] = (row < M && k0 + tx < K) ? a[(idx_t)(k0 + tx) * sAk] : T(0);
            Bs[ty][tx] = (k0 + ty < K && col < N) ? b[(idx_t)(k0 + ty) * sBk] : T(0);
            __syncthreads();  // both tiles are complete
#pragma unroll
            for (int k = 0; k < TILE; ++k)
                Csub += As[ty][k] * Bs[k][tx];
            __syncthreads();  // everyone is done with the tiles before they are overwritten
        }
        if (row < M && col < N)
            store_c(&C[z * sCb + row * sCm + col * sCn], Csub, alpha, beta);
    }
}
