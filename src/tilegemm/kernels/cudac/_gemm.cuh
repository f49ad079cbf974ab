// Included by every tilegemm CUDA C kernel (kNN_<rung>.cu): the element type, the one
// kernel signature, and the epilogue.
//
// Python compiles each kernel at run time with NVRTC, once per element type and set of
// tile sizes, and puts both in a few lines in front of the source: "typedef float T;"
// (or double, int, long long) and one #define per parameter ("#define TILE 16"). Tile sizes known at compile time are what let the
// compiler unroll the inner loops completely and keep a thread's tile of C in registers;
// cuda-samples gets the same effect from its template parameter BLOCK_SIZE.
#pragma once

// 64-bit offsets: row * stride must not overflow for matrices of 2**31 elements or more.
typedef long long idx_t;

// Every kernel computes, for each b < batch,
//     C[b] = alpha * A[b] @ B[b] + beta * C[b]      A[b]: M×K, B[b]: K×N, C[b]: M×N
// with every stride in elements (not bytes) and free to be anything, so transposed or
// strided views run without a copy. A batch stride of 0 means "one matrix shared by all
// the products" (a broadcast operand is never copied per batch).
// __restrict__ promises the compiler that A, B and C do not overlap (the backend hands a
// fresh C when an output aliases an input); with const it lets loads of A and B go
// through the read-only path (LDG.CONSTANT in SASS).
#define GEMM_ARGS                                                                  \
    const T* __restrict__ A, const T* __restrict__ B, T* __restrict__ C,          \
    int batch, int M, int N, int K,                                                \
    idx_t sAb, idx_t sAm, idx_t sAk, idx_t sBb, idx_t sBk, idx_t sBn,              \
    idx_t sCb, idx_t sCm, idx_t sCn, T alpha, T beta

// Every kernel declares __launch_bounds__(threads per block, blocks per SM). The first
// number lets ptxas fit the registers to the block (a 1,024-thread block must make do with
// 64 per thread, or the launch fails). The second says how many blocks must fit on an SM
// at once, which caps the registers at 65,536 / (threads · blocks); without it ptxas picks
// a cap of its own, squeezing even the naive kernel into 32 registers and local-memory
// spills. Rungs 1-3 ask for 1,024 resident threads (64 registers: no spills, half of an
// SM's threads), rung 4 and the register-tiled rungs for as many as their tiles allow.

// C is read only when beta != 0: an uninitialised (or NaN) C must not leak into
// alpha * A @ B, as in BLAS.
__device__ __forceinline__ void store_c(T* c, T acc, T alpha, T beta)
{
    *c = (beta == T(0)) ? alpha * acc : alpha * acc + beta * *c;
}

// 16 bytes of T (4 floats, 2 doubles): one 128-bit load or store (LDG.128 / LDS.128 /
// STS.128) instead of several 32- or 64-bit ones, when the address is 16-byte aligned.
#define VEC_WIDTH (16 / (int)sizeof(T))
struct __align__(16) Pack {
    T v[VEC_WIDTH];
};

// Whether an operand can be read W elements at a time: unit stride along the row, every
// row (and batch) starting on a 16-byte boundary, and the base pointer aligned. Checked
// once per launch; misaligned vector accesses are hardware faults, so every kernel that
// uses Pack keeps a scalar path for the rest.
__device__ __forceinline__ bool vector_ok(const void* p, idx_t s_batch, idx_t s_row,
                                          idx_t s_col, int cols)
{
    return s_col == 1 && cols % VEC_WIDTH == 0 && s_row % VEC_WIDTH == 0 &&
           s_batch % VEC_WIDTH == 0 && (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}
