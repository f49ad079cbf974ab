// Included by the warp-tiled CUDA C rungs, k08_warptile.cu and k09_pipelined.cu: their
// parameters and the tiling they share (its sizes, the shared-memory swizzle, the checks
// on the parameters), written once. Rung 9 is rung 8's tiling with another k loop.
//
// The tiling. A block of NT threads computes a BM × BN tile of C. Its warps split the
// tile into WM × WN warp tiles; inside one, the 32 lanes form a (WSUBM/TM) × (WSUBN/TN)
// grid that steps over WMITER × WNITER sub-tiles of WSUBM × WSUBN, so each thread owns
// (WMITER·TM) × (WNITER·TN) outputs (8 × 8 = 64 at the defaults) held in registers. Per
// step kk of a BK-deep k-tile a thread loads WMITER·TM values of A and WNITER·TN of B
// from shared memory (128-bit loads) and does all their products: 64 FMAs for 16 loads.
//
// Shared memory: A is stored *transposed* (As[k][m]) so that the TM values of A a thread
// needs for one kk are consecutive and come in 128-bit loads, like B's. Storing A
// transposed makes the 32 lanes of a loading warp write to a few columns of As at once
// (bank conflicts); an XOR swizzle of the column, constant per group of rows, spreads
// those stores over the banks, and the reads undo it with the same XOR (a multiple of the
// vector width, so a vector stays contiguous).
//
// Global memory: each k-tile of A (BM × BK) and of B (BK × BN) is read in 16-byte
// vectors by consecutive threads (coalesced), through the read-only path (const
// __restrict__ → LDG.E.128.CONSTANT). The vector path is taken when the operand allows it
// (unit stride, 16-byte aligned rows) and the vector lies inside the matrix; otherwise the
// elements are loaded one by one, zero outside. So any M, N, K, strides and batches work,
// while full interior tiles run the fast path.
#pragma once
#include "_gemm.cuh"

// Python defines every parameter in front of the source; these defaults (rung 8's) keep
// the file readable on its own. A rung with other defaults defines them before including.
#ifndef BM
#define BM 128     // rows of C per block
#endif
#ifndef BN
#define BN 128     // columns of C per block
#endif
#ifndef BK
#define BK 16      // depth of a k-tile in shared memory
#endif
#ifndef WM
#define WM 64      // rows of C per warp
#endif
#ifndef WN
#define WN 32      // columns of C per warp
#endif
#ifndef WNITER
#define WNITER 2   // warp sub-tiles across WN
#endif
#ifndef TM
#define TM 8       // rows of C per thread per sub-tile
#endif
#ifndef TN
#define TN 4       // columns of C per thread per sub-tile
#endif

#define NT ((BM / WM) * (BN / WN) * 32)               // threads per block
#define WMITER ((WM * WN) / (32 * TM * TN * WNITER))  // warp sub-tiles down WM
#define WSUBM (WM / WMITER)
#define WSUBN (WN / WNITER)
#define RT (WMITER * TM)  // a thread's rows of C
#define CT (WNITER * TN)  // a thread's columns of C

constexpr int W = VEC_WIDTH;                           // elements per 16-byte vector
constexpr int A_VPR = BK / W, B_VPR = BN / W;          // vectors per row of a tile
constexpr int A_VECS = BM * A_VPR, B_VECS = BK * B_VPR;
constexpr int A_ROUNDS = (A_VECS + NT - 1) / NT;       // vectors each thread loads per tile
constexpr int B_ROUNDS = (B_VECS + NT - 1) / NT;
// Rows of A one warp stores per round: the period of the swizzle that spreads them.
constexpr int RPW = (32 * W / BK > W) ? 32 * W / BK : W;

// ptxas may use up to 65,536 / (NT · MIN_BLOCKS) registers per thread: two resident
// blocks per SM for float (128 registers, the 64 accumulators fit with room to spare),
// one for double, whose 64 accumulators alone take 128 registers.
#define MIN_BLOCKS (sizeof(T) == 4 ? 2 : 1)

static_assert(BM % WM == 0 && BN % WN == 0, "warps must tile the block tile");
static_assert(WMITER * 32 * TM * TN * WNITER == WM * WN, "lanes must cover a warp tile");
static_assert((WSUBM / TM) * (WSUBN / TN) == 32, "32 lanes per warp sub-tile");
static_assert(TM % W == 0 && TN % W == 0 && BK % W == 0 && BN % W == 0, "whole vectors");
static_assert((BM & (BM - 1)) == 0, "the swizzle needs BM a power of two");

// Column of As where element (row r, k-column c) of the A tile is stored.
__device__ __forceinline__ int swizzle(int r, int c)
{
    return r ^ (((c / W) * RPW) & (BM - 1));
}
