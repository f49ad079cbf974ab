/* Rung 4, register1d: the shared rung, but each work-item computes R outputs of one column
   (rows ty, ty + TILE/R, ...), so a work-group of TILE x TILE/R work-items covers the
   TILE x TILE tile. In the inner loop the B element is read from local memory once into
   a register and used R times (the optimisation note's outputs-per-thread sweep): fewer local-memory
   reads per multiply-add and R independent accumulators for instruction-level
   parallelism, at the cost of R registers per work-item. */

#define RS (TILE / R)  /* row stride between one work-item's outputs */

kernel void gemm(GEMM_ARGS)
{
    local T As[TILE][TILE];
    local T Bs[TILE][TILE];
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int j = get_group_id(0) * TILE + tx;
    const int i0 = get_group_id(1) * TILE + ty;
    const int z = get_group_id(2);
    global const T *a = A + a_off + z * a_bs;
    global const T *b = B + b_off + z * b_bs;

    T acc[R];
    for (int r = 0; r < R; ++r)
        acc[r] = ZERO;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        for (int r = 0; r < R; ++r) {
            const int row = ty + r * RS;
            const int i = i0 + r * RS;
            As[row][tx] = (i < M && k0 + tx < K) ? a[(long)i * K + k0 + tx] : ZERO;
            Bs[row][tx] = (k0 + row < K && j < N) ? b[(long)(k0 + row) * N + j] : ZERO;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TILE; ++kk) {
            const T bv = Bs[kk][tx];  /* one local read, R multiply-adds */
            for (int r = 0; r < R; ++r)
                acc[r] += As[ty + r * RS][kk] * bv;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (j < N) {
        for (int r = 0; r < R; ++r) {
            const int i = i0 + r * RS;
            if (i < M)
                STORE_C(C + c_off + ((long)z * M + i) * N + j, acc[r]);
        }
    }
}
