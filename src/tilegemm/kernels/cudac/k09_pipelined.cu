// Rung 9 — pipelined: rung 8's warp tiling with two shared-memory stages (double
// buffering) and a grouped block order; the CUDA C yardstick for the Numba rung.
//
// What changes from rung 8:
//
// 1. Two stages. Shared memory holds two A and two B tiles. While the block computes on
//    k-tile kt-1 from one buffer, each thread has already issued the global loads of tile
//    kt into registers (sa, sb); after its FMAs it stores them into the other buffer, and
//    one __syncthreads() per k-tile separates the phases (rung 8 needs two). The ~500-cycle
//    latency of the global loads now overlaps a whole k-tile of FMAs instead of stalling
//    every warp at a barrier. This is the classic two-stage SIMT pipeline of CUTLASS's
//    SGEMM, whose 128 × 128 × 8 tiles are the defaults: BK = 8 keeps the doubled tiles at
//    16 KB (float) and the staging registers at one 16-byte vector of A and one of B.
// 2. Grouped block order (GROUP_M). Blocks run roughly in launch order, so the tiles of C
//    in flight together decide what L2 holds. Numbering tiles column-major inside groups
//    of GROUP_M tile rows makes them a near-square patch, so each panel of A and B brought
//    into L2 serves several blocks. The grid is one-dimensional over tiles, batches in z.
//
// As in rung 8: A transposed and swizzled in shared memory, 16-byte vectors through the
// read-only path where the operand allows, zero-filled edges for any shape, loops with
// compile-time bounds fully unrolled so acc, ra, rb, sa and sb live in registers.
//
// The parameters (rung 8's defaults but BK) and the tiling are rung 8's: _warptile.cuh.
#ifndef BK
#define BK 8
#endif
#ifndef GROUP_M
#define GROUP_M 8  // tile rows per group of the block order
#endif
#include "_warptile.cuh"

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
tilegemm_pipelined(GEMM_ARGS)
{
    __shared__ __align__(16) T As[2][BK][BM];  // two stages of the transposed A tile
    __shared__ __align__(16) T Bs[2][BK][BN];

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int tr0 = (warp / (BN / WN)) * WM + (lane / (WSUBN / TN)) * TM;
    const int tc0 = (warp % (BN / WN)) * WN + (lane % (WSUBN / TN)) * TN;
    const bool a_vec = vector_ok(A, sAb, sAm, sAk, K);
    const bool b_vec = vector_ok(B, sBb, sBk, sBn, N);
    const bool c_vec = vector_ok(C, sCb, sCm, sCn, N);
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const idx_t tiles = (idx_t)tiles_m * tiles_n;
    const idx_t group = (idx_t)GROUP_M * tiles_n;  // tiles in one group of GROUP_M tile rows
    const int k_tiles = (K + BK - 1) / BK;

    for (idx_t z = blockIdx.z; z < batch; z += gridDim.z)
    for (idx_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        // Grouped order: column-major inside groups of GROUP_M tile rows.
        const int first = (int)(t / group) * GROUP_M;
        const int gsize = min(tiles_m - first, GROUP_M);
        const int row0 = (first + (int)((t % group) % gsize)) * BM;
        const int col0 = (int)((t % group) / gsize) * BN;
        const T* a = A + z * sAb;
        const T* b = B + z * sBb;

        T acc[RT][CT];
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
            for (int j = 0; j < CT; ++j)
                acc[i][j] = T(0);
        Pack sa[A_ROUNDS], sb[B_ROUNDS];  // the next k-tile, staged in registers

        for (int kt = 0; kt <= k_tiles; ++kt) {
            // (1) Issue the global loads of k-tile kt (if any) into registers...
            if (kt < k_tiles) {
                const int k0 = kt * BK;
#pragma unroll
                for (int rnd = 0; rnd < A_ROUNDS; ++rnd) {
                    const int v = tid + rnd * NT;
                    const int r = v / A_VPR, c = (v % A_VPR) * W;
                    const int gr = row0 + r, gc = k0 + c;
                    const bool in = A_VECS % NT == 0 || v < A_VECS;
                    if (in && a_vec && gr < M && gc < K) {
                        sa[rnd] = *reinterpret_cast<const Pack*>(a + (idx_t)gr * sAm + gc);
                    } else {
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            sa[rnd].v[q] = (in && gr < M && gc + q < K)
                                ? a[(idx_t)gr * sAm + (idx_t)(gc + q) * sAk] : T(0);
                    }
                }
#pragma unroll
                for (int rnd = 0; rnd < B_ROUNDS; ++rnd) {
                    const int v = tid + rnd * NT;
                    const int r = v / B_VPR, c = (v % B_VPR) * W;
                    const int gr = k0 + r, gc = col0 + c;
                    const bool in = B_VECS % NT == 0 || v < B_VECS;
                    if (in && b_vec && gr < K && gc < N) {
                        sb[rnd] = *reinterpret_cast<const Pack*>(b + (idx_t)gr * sBk + gc);
                    } else {
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            sb[rnd].v[q] = (in && gr < K && gc + q < N)
                                ? b[(idx_t)gr * sBk + (idx_t)(gc + q) * sBn] : T(0);
                    }
                }
            }
            // (2) ...compute on k-tile kt-1, stored before the last barrier, while those
            // loads are in flight (nothing below waits for them until step 3)...
            if (kt > 0) {
                const int cur = (kt - 1) & 1;
#pragma unroll
                for (int kk = 0; kk < BK; ++kk) {
                    T ra[RT], rb[CT];
                    const int sk = ((kk / W) * RPW) & (BM - 1);
#pragma unroll
                    for (int i = 0; i < RT; i += W) {
                        const Pack p = *reinterpret_cast<const Pack*>(
                            &As[cur][kk][(tr0 + (i / TM) * WSUBM + i % TM) ^ sk]);
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            ra[i + q] = p.v[q];
                    }
#pragma unroll
                    for (int j = 0; j < CT; j += W) {
                        const Pack p = *reinterpret_cast<const Pack*>(
                            &Bs[cur][kk][tc0 + (j / TN) * WSUBN + j % TN]);
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            rb[j + q] = p.v[q];
                    }
#pragma unroll
                    for (int i = 0; i < RT; ++i)
#pragma unroll
                        for (int j = 0; j < CT; ++j)
                            acc[i][j] += ra[i] * rb[j];
                }
            }
            // (3) ...then store k-tile kt into the other stage. Nobody reads it now: its
            // last readers (k-tile kt-2) finished before the last barrier.
            if (kt < k_tiles) {
                const int nxt = kt & 1;
#pragma unroll
                for (int rnd = 0; rnd < A_ROUNDS; ++rnd) {
                    const int v = tid + rnd * NT;
                    if (A_VECS % NT == 0 || v < A_VECS) {
                        const int r = v / A_VPR, c = (v % A_VPR) * W;
                        const int sc = swizzle(r, c);
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            As[nxt][c + q][sc] = sa[rnd].v[q];
                    }
                }
#pragma unroll
                for (int rnd = 0; rnd < B_ROUNDS; ++rnd) {
                    const int v = tid + rnd * NT;
                    if (B_VECS % NT == 0 || v < B_VECS) {
                        const int r = v / B_VPR, c = (v % B_VPR) * W;
                        *reinterpret_cast<Pack*>(&Bs[nxt][r][c]) = sb[rnd];
                    }
                }
            }
            __syncthreads();  // the one barrier per k-tile
        }

        T* c = C + z * sCb;
#pragma unroll
        for (int i = 0; i < RT; ++i) {
            const int gr = row0 + tr0 + (i / TM) * WSUBM + i % TM;
            if (gr >= M)
                continue;
#pragma unroll
            for (int j = 0; j < CT; j += W) {
                const int gc = col0 + tc0 + (j / TN) * WSUBN + j % TN;
                T* out = c + (idx_t)gr * sCm;
                if (c_vec && gc < N) {
                    Pack p;
                    if (beta == T(0)) {
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            p.v[q] = alpha * acc[i][j + q];
                    } else {
                        p = *reinterpret_cast<const Pack*>(out + gc);
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            p.v[q] = alpha * acc[i][j + q] + beta * p.v[q];
                    }
                    *reinterpret_cast<Pack*>(out + gc) = p;
                } else {
#pragma unroll
                    for (int q = 0; q < W; ++q)
                        if (gc + q < N)
                            store_c(out + (idx_t)(gc + q) * sCn, acc[i][j + q], alpha, beta);
                }
            }
        }
    }
}
