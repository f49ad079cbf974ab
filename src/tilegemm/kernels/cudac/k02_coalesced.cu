// Rung 2 — coalesced: the optimisation note's global-memory kernel (matMul_GlobalKernel),
// threadIdx.x walking the *columns* of C.
//
// The only change from rung 1: Col = blockIdx.x * blockDim.x + threadIdx.x. The 32
// threads of a warp now hold 32 consecutive columns of one row of C, so per step of k
// they read one element of A (the same address: a broadcast, one transaction) and 32
// consecutive elements of B (four 32-byte segments for float), and write 32 consecutive
// elements of C. The note counts 5 load transactions per warp and k-step; rung 1 needs
// up to 33. Same arithmetic, far fewer memory transactions.
//
// Fixed compared with the optimisation note: any M, N, K and rectangular matrices (it assumes
// square width × width and a grid that covers it exactly), bounds on every access,
// accumulation in T (it sums into an int and stores an undeclared "Pervalue"),
// batches in grid z, grid-stride loops.
#include "_gemm.cuh"

#ifndef BLOCK
#define BLOCK 16  // threads per block side (BLOCK × BLOCK)
#endif

// Blocks enough for 1,024 resident threads: at most 64 registers a thread (see _gemm.cuh).
extern "C" __global__ void __launch_bounds__(BLOCK * BLOCK, 1024 / (BLOCK * BLOCK))
tilegemm_coalesced(GEMM_ARGS)
{
    for (idx_t z = blockIdx.z; z < batch; z += gridDim.z) {
        const T* a = A + z * sAb;
        const T* b = B + z * sBb;
        T* c = C + z * sCb;
        for (idx_t row = (idx_t)blockIdx.y * BLOCK + threadIdx.y; row < M;
             row += (idx_t)gridDim.y * BLOCK) {
            for (idx_t col = (idx_t)blockIdx.x * BLOCK + threadIdx.x; col < N;
                 col += (idx_t)gridDim.x * BLOCK) {   // x → column (coalesced)
                T acc = T(0);
                for (int k = 0; k < K; ++k)
                    acc += a[row * sAm + k * sAk] * b[k * sBk + col * sBn];
                store_c(&c[row * sCm + col * sCn], acc, alpha, beta);
            }
        }
    }
}
