// Rung 8 — warptile: block tile → warp tile → thread tile (siboehm's SGEMM kernel 10),
// the CUDA C yardstick for the Numba rung of the same name.
//
// The tiling (block, warp and thread tiles; A transposed and swizzled in shared memory;
// 16-byte global loads through the read-only path, element-wise at the edges) is
// described, and its sizes and the swizzle defined, in _warptile.cuh, which rung 9
// includes too. Loops over kk, the thread tile and the loading rounds have compile-time
// bounds and are fully unrolled: every index into acc, ra and rb is a constant, so they
// are registers, not local memory.
#include "_warptile.cuh"

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
tilegemm_warptile(GEMM_ARGS)
{
    __shared__ __align__(16) T As[BK][BM];  // A tile, transposed and swizzled
    __shared__ __align__(16) T Bs[BK][BN];  // B tile, as in memory

    const int tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    // This thread's first row and column inside the block tile (sub-tile 0, 0).
    const int tr0 = (warp / (BN / WN)) * WM + (lane / (WSUBN / TN)) * TM;
    const int tc0 = (warp % (BN / WN)) * WN + (lane % (WSUBN / TN)) * TN;
    const bool a_vec = vector_ok(A, sAb, sAm, sAk, K);
    const bool b_vec = vector_ok(B, sBb, sBk, sBn, N);
    const bool c_vec = vector_ok(C, sCb, sCm, sCn, N);
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;

    for (idx_t z = blockIdx.z; z < batch; z += gridDim.z)
    for (int bm = blockIdx.y; bm < tiles_m; bm += gridDim.y)
    for (int bn = blockIdx.x; bn < tiles_n; bn += gridDim.x) {
        const int row0 = bm * BM, col0 = bn * BN;
        const T* a = A + z * sAb;
        const T* b = B + z * sBb;
        T acc[RT][CT];
#pragma unroll
        for (int i = 0; i < RT; ++i)
#pragma unroll
            for (int j = 0; j < CT; ++j)
                acc[i][j] = T(0);

        for (int k0 = 0; k0 < K; k0 += BK) {
            // A tile (BM × BK): consecutive threads take consecutive vectors along a row.
#pragma unroll
            for (int rnd = 0; rnd < A_ROUNDS; ++rnd) {
                const int v = tid + rnd * NT;
                if (A_VECS % NT == 0 || v < A_VECS) {
                    const int r = v / A_VPR, c = (v % A_VPR) * W;
                    const int gr = row0 + r, gc = k0 + c;
                    Pack p;
                    if (a_vec && gr < M && gc < K) {  // K % W == 0: the whole vector is in
                        p = *reinterpret_cast<const Pack*>(a + (idx_t)gr * sAm + gc);
                    } else {
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            p.v[q] = (gr < M && gc + q < K) ? a[(idx_t)gr * sAm + (idx_t)(gc + q) * sAk]
                                                            : T(0);
                    }
                    const int sc = swizzle(r, c);
#pragma unroll
                    for (int q = 0; q < W; ++q)
                        As[c + q][sc] = p.v[q];  // transposed: k becomes the row
                }
            }
            // B tile (BK × BN): copied as it is, one 128-bit shared store per vector.
#pragma unroll
            for (int rnd = 0; rnd < B_ROUNDS; ++rnd) {
                const int v = tid + rnd * NT;
                if (B_VECS % NT == 0 || v < B_VECS) {
                    const int r = v / B_VPR, c = (v % B_VPR) * W;
                    const int gr = k0 + r, gc = col0 + c;
                    Pack p;
                    if (b_vec && gr < K && gc < N) {
                        p = *reinterpret_cast<const Pack*>(b + (idx_t)gr * sBk + gc);
                    } else {
#pragma unroll
                        for (int q = 0; q < W; ++q)
                            p.v[q] = (gr < K && gc + q < N) ? b[(idx_t)gr * sBk + (idx_t)(gc + q) * sBn]
                                                            : T(0);
                    }
                    *reinterpret_cast<Pack*>(&Bs[r][c]) = p;
                }
            }
            __syncthreads();  // both tiles are complete

            // Fully unrolled for float. For double, 8 steps at a time: fully unrolled, ptxas
            // prefetches so many values of the next steps that it spills at 255 registers.
#pragma unroll(sizeof(T) == 4 ? BK : 8)
            for (int kk = 0; kk < BK; ++kk) {
                // This thread's column of A and row of B for step kk, into registers.
                T ra[RT], rb[CT];
                const int sk = ((kk / W) * RPW) & (BM - 1);  // the swizzle of row kk
#pragma unroll
                for (int i = 0; i < RT; i += W) {
                    const Pack p = *reinterpret_cast<const Pack*>(
                        &As[kk][(tr0 + (i / TM) * WSUBM + i % TM) ^ sk]);
#pragma unroll
                    for (int q = 0; q < W; ++q)
                        ra[i + q] = p.v[q];
                }
#pragma unroll
                for (int j = 0; j < CT; j += W) {
                    const Pack p = *reinterpret_cast<const Pack*>(
                        &Bs[kk][tc0 + (j / TN) * WSUBN + j % TN]);
#pragma unroll
                    for (int q = 0; q < W; ++q)
                        rb[j + q] = p.v[q];
                }
                // The outer product: RT × CT FMAs from RT + CT registers.
#pragma unroll
                for (int i = 0; i < RT; ++i)
#pragma unroll
                    for (int j = 0; j < CT; ++j)
                        acc[i][j] += ra[i] * rb[j];
            }
            __syncthreads();  // everyone is done before the tiles are overwritten
        }

        // Epilogue: alpha * acc (+ beta * C), 16-byte stores where the row allows.
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
                if (c_vec && gc < N) {  // N % W == 0: the whole vector is in
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
