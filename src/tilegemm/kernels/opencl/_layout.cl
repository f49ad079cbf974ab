/* Layout helper (not a rung): copy a strided, possibly broadcast (batch, rows, cols) view
   into a dense row-major array on the device, so pyopencl operands that are transposed,
   non-contiguous or partially broadcast never make a trip through the host.
   zoff[z] is the element offset of matrix z; rs and cs are row and column strides. */

kernel void gather(global const T *src, global const long *zoff, const long rs,
                   const long cs, global T *dst, const long dst_off, const int rows,
                   const int cols)
{
    const int c = get_global_id(0);
    const int r = get_global_id(1);
    const int z = get_global_id(2);
    if (r < rows && c < cols)
        dst[dst_off + ((long)z * rows + r) * cols + c] = src[zoff[z] + r * rs + c * cs];
}

/* float16 elements to T (float or double), which PyOpenCL's astype cannot do for a mixed
   float16 device operand: vload_half reads a half from memory without cl_khr_fp16. */
kernel void widen_half(global const half *src, global T *dst, const long n)
{
    const long i = get_global_id(0);
    if (i < n)
        dst[i] = (T)vload_half(i, src);
}

/* One operand of a product to panels, for a kernel that reads it W rows of A (or W
   columns of B) at a time (k06_vectorized.cl, TG_PANELS): panel p holds elements
   p*W ... p*W + W-1 along the operand's outer dimension (A's rows, B's columns) for every
   k, k after k (K x W contiguous), zero past that dimension's last element (extent - 1).
   Element (k, j) of matrix z is src[off + z * bs + k * ks + j * js]: ks = N, js = 1 for B
   (K x N), ks = 1, js = K for A (M x K, j its row). dst holds batch x ceil(extent / W)
   panels, one matrix after another. One work-item writes one k of one panel (W
   consecutive elements): work-items next to each other in dimension 0 take the next k. */
kernel void pack_panels(global const T *src, const long off, const long bs, const long ks,
                        const long js, const int K, const int extent, const int W,
                        global T *dst)
{
    const int k = get_global_id(0);
    const int p = get_global_id(1);
    const int z = get_global_id(2);
    if (k >= K)
        return;
    const int panels = (extent + W - 1) / W;
    global const T *s = src + off + z * bs + k * ks + (long)p * W * js;
    global T *d = dst + (((long)z * panels + p) * K + k) * W;
    const int n = min(W, extent - p * W);
    for (int e = 0; e < n; ++e)
        d[e] = s[e * js];
    for (int e = n; e < W; ++e)
        d[e] = (T)0;
}
