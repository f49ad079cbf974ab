/* Rung 3, shared: the Numba ROC example's matmulfast (roc.shared.array + roc.barrier) with its shape
   assumptions removed. A work-group of TILE x TILE work-items computes a TILE x TILE tile
   of C; it walks the K dimension one TILE x TILE tile of A and of B at a time, each
   work-item loading one element of each into local memory, so every element fetched
   from global memory is used TILE times.

   Fixed from the original: any M, N, K (out-of-range loads fill zeros, the number of K tiles
   is ceil(K / TILE) rather than the grid size), and no work-item returns before a barrier
   (a barrier that not every work-item of the group reaches is undefined behaviour). */

kernel void gemm(GEMM_ARGS)
{
    local T As[TILE][TILE];
    local T Bs[TILE][TILE];
    const int tx = get_local_id(0);  /* column within the tile */
    const int ty = get_local_id(1);  /* row within the tile */
    const int j = get_group_id(0) * TILE + tx;
    const int i = get_group_id(1) * TILE + ty;
    const int z = get_group_id(2);
    global const T *a = A + a_off + z * a_bs;
    global const T *b = B + b_off + z * b_bs;

    T acc = ZERO;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (i < M && k0 + tx < K) ? a[(long)i * K + k0 + tx] : ZERO;
        Bs[ty][tx] = (k0 + ty < K && j < N) ? b[(long)(k0 + ty) * N + j] : ZERO;
        barrier(CLK_LOCAL_MEM_FENCE);  /* tiles loaded */
        for (int kk = 0; kk < TILE; ++kk)
            acc += As[ty][kk] * Bs[kk][tx];
        barrier(CLK_LOCAL_MEM_FENCE);  /* tiles consumed before the next load */
    }
    if (i < M && j < N)
        STORE_C(C + c_off + ((long)z * M + i) * N + j, acc);
}
