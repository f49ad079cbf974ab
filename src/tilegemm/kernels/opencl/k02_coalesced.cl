/* Rung 2, coalesced: the only change from rung 1 is the mapping, dimension 0 -> column.
   Consecutive work-items now read consecutive elements of a row of B and write
   consecutive elements of C (one memory transaction per group of work-items), and all of
   them read the same element of A (a broadcast). */

kernel void gemm(GEMM_ARGS)
{
    const int j = get_global_id(0);  /* column */
    const int i = get_global_id(1);  /* row */
    const int z = get_global_id(2);
    if (i >= M || j >= N)
        return;
    global const T *a = A + a_off + z * a_bs + (long)i * K;
    global const T *b = B + b_off + z * b_bs + j;
    T acc = ZERO;
    for (int k = 0; k < K; ++k)
        acc += a[k] * b[(long)k * N];
    STORE_C(C + c_off + ((long)z * M + i) * N + j, acc);
}
