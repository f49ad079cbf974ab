/* Rung 1, naive: one work-item per element of C with the original example's mapping, dimension 0 -> row.
   Consecutive work-items (dimension 0) walk down a column of row-major C, so they read A
   and write C with a stride of a whole row. No local memory and no barrier, so the
   out-of-range work-items may simply return. */

kernel void gemm(GEMM_ARGS)
{
    const int i = get_global_id(0);  /* row: the original example's roc.get_global_id(0) */
    const int j = get_global_id(1);  /* column */
    const int z = get_global_id(2);  /* product in the batch */
    if (i >= M || j >= N)
        return;
    global const T *a = A + a_off + z * a_bs + (long)i * K;
    global const T *b = B + b_off + z * b_bs + j;
    T acc = ZERO;
    for (int k = 0; k < K; ++k)
        acc += a[k] * b[(long)k * N];
    STORE_C(C + c_off + ((long)z * M + i) * N + j, acc);
}
