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
