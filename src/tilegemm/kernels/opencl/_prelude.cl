/* Prepended by tilegemm to every OpenCL rung (see tilegemm.backends.opencl_program).

   Defines from the host: TG_T (element type), TG_VT (its TG_VW-wide vector type),
   TG_FP64 (double precision: enable the extension), TG_INT (an integer product).

   Why no builtins in the hot loops: on PoCL's CPU device (the pip wheel, LLVM 14) the
   OpenCL builtins mad(), fma() and vloadN() are compiled as out-of-line calls, one per
   element; plain `acc += a * b` (contracted to an FMA by the compiler) and vector
   pointer loads are 4-6x faster there and no slower on GPUs. */

#ifdef TG_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

typedef TG_T T;
typedef TG_VT VT;  /* T itself when TG_VW == 1 */

#define ZERO ((T)0)

/* The one kernel signature every rung shares (offsets and batch strides in elements). */
#define GEMM_ARGS                                                   \
    const int M, const int N, const int K,                          \
    global const T *restrict A, const long a_off, const long a_bs,  \
    global const T *restrict B, const long b_off, const long b_bs,  \
    global T *restrict C, const long c_off,                         \
    const T alpha, const T beta

/* Write one element of C: C is read only when beta != 0, so a NaN-poisoned (or
   uninitialised) output never leaks into the result. */
#define STORE_C(ptr, acc)                                           \
    do {                                                            \
        if (beta == ZERO) *(ptr) = alpha * (acc);                   \
        else *(ptr) = alpha * (acc) + beta * *(ptr);                \
    } while (0)
