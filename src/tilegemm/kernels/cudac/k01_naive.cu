// Rung 1 — naive: one thread per element of C, threadIdx.x walking the *rows* of C.
//
// This is the mapping of Numba's documentation example (i, j = cuda.grid(2), i → row),
// kept as it is on purpose: x is the fastest-varying thread index, so the 32 threads of a
// warp hold 32 consecutive *rows*. Their loads of A and stores to C are a whole row apart
// (up to 32 memory transactions per warp access) while all of them read the same element
// of B. Rung 2 changes only this mapping.
//
// Fixed compared with the originals: any M, N, K (every access is bounds-checked),
// batches in grid z, and grid-stride loops so no grid dimension exceeds its hardware limit
// (65,535 blocks in y and z).
#include "_gemm.cuh"

#ifndef BLOCK
#define BLOCK 16  // threads per block side (BLOCK × BLOCK)
#endif

// Blocks enough for 1,024 resident threads: at most 64 registers a thread (see _gemm.cuh).
extern "C" __global__ void __launch_bounds__(BLOCK * BLOCK, 1024 / (BLOCK * BLOCK))
tilegemm_naive(GEMM_ARGS)
{
    for (idx_t z = blockIdx.z; z < batch; z += gridDim.z) {
        const T* a = A + z * sAb;  // sAb == 0: one A for every product
        const T* b = B + z * sBb;
        T* c = C + z * sCb;
        for (idx_t i = (idx_t)blockIdx.x * BLOCK + threadIdx.x; i < M;
             i += (idx_t)gridDim.x * BLOCK) {          // x → row (uncoalesced)
            for (idx_t j = (idx_t)blockIdx.y * BLOCK + threadIdx.y; j < N;
                 j += (idx_t)gridDim.y * BLOCK) {      // y → column
                T acc = T(0);
                for (int k = 0; k < K; ++k)
                    acc += a[i * sAm + k * sAk] * b[k * sBk + j * sBn];
                store_c(&c[i * sCm + j * sCn], acc, alpha, beta);
            }
        }
    }
}
