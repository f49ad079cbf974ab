/* Rung 5, register2d: a work-group computes a BM x BN block of C with
   (BN/TN) x (BM/TM) work-items, each accumulating a TM x TN outer product in registers.
   Per K step of BK the group stages a BM x BK tile of A (stored transposed, k-major) and
   a BK x BN tile of B in local memory; in the inner loop each work-item reads TM values
   of A and TN of B from local memory and does TM*TN multiply-adds, so local traffic per
   multiply-add falls from 2 (rung 3) to (TM+TN)/(TM*TN).

   A work-item's rows and columns are interleaved with the other work-items' (row
   ty + r*WM, column tx + c*WN): neighbouring work-items touch neighbouring addresses in
   every load and store (coalesced on GPUs, vectorisable across work-items on CPUs). */

#define WN (BN / TN)   /* work-items along N (dimension 0) */
#define WM (BM / TM)   /* work-items along M (dimension 1) */
#define NT (WN * WM)   /* work-items per group */

kernel void gemm(GEMM_ARGS)
{
    local T As[BK][BM];
    local T Bs[BK][BN];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * WN + tx;
    const int col0 = get_group_id(0) * BN;
    const int row0 = get_group_id(1) * BM;
    const int z = get_group_id(2);
    global const T *a = A + a_off + z * a_bs;
    global const T *b = B + b_off + z * b_bs;

    T acc[TM][TN];
    for (int r = 0; r < TM; ++r)
        for (int c = 0; c < TN; ++c)
            acc[r][c] = ZERO;

    for (int k0 = 0; k0 < K; k0 += BK) {
        /* Stage the tiles: consecutive work-items take consecutive k of A's rows and
           consecutive columns of B's rows; zeros outside the matrices. */
        for (int l = tid; l < BM * BK; l += NT) {
            const int r = l / BK, kk = l % BK;
            const int i = row0 + r, k = k0 + kk;
            As[kk][r] = (i < M && k < K) ? a[(long)i * K + k] : ZERO;
        }
        for (int l = tid; l < BK * BN; l += NT) {
            const int kk = l / BN, c = l % BN;
            const int k = k0 + kk, j = col0 + c;
            Bs[kk][c] = (k < K && j < N) ? b[(long)k * N + j] : ZERO;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < BK; ++kk) {
            T av[TM], bv[TN];
            for (int r = 0; r < TM; ++r)
                av[r] = As[kk][ty + r * WM];
            for (int c = 0; c < TN; ++c)
                bv[c] = Bs[kk][tx + c * WN];
            for (int r = 0; r < TM; ++r)
                for (int c = 0; c < TN; ++c)
                    acc[r][c] += av[r] * bv[c];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int r = 0; r < TM; ++r) {
        const int i = row0 + ty + r * WM;
        if (i >= M)
            continue;
        global T *crow = C + c_off + ((long)z * M + i) * N;
        for (int c = 0; c < TN; ++c) {
            const int j = col0 + tx + c * WN;
            if (j < N)
                STORE_C(crow + j, acc[r][c]);
        }
    }
}
