/* Rung 6, vectorized: rung 5 with VW-wide vector types (floatVW / doubleVW). Global loads
   of the A and B tiles, the local tile of B, the accumulators and the stores of C are
   vectors of VW consecutive elements: fewer, wider memory instructions (128-bit loads on
   GPUs at VW=4; one AVX register per vector on CPUs), and on CPU devices the explicit
   vectors are what fills the SIMD lanes.

   A vector access is used only where it is legal: the operand's base offset and row
   length are multiples of VW (so the address is aligned) and the whole vector lies inside
   the matrix. Anything else (odd N or K, the right and bottom edges) takes the
   element-by-element path with bounds, so every shape stays correct. */

/* Every loop over the register tile (TM rows, TNV vectors, VW lanes) is unrolled fully, so
   that acc[][] and bv[] have constant indices only and live in vector registers. Left to
   itself, PoCL's LLVM (15, Debian's PoCL 3.1 on a Zen 5 EPYC) kept the 8-iteration row
   loop rolled and acc[] on the stack: a load, an FMA and a store per vector per k, the
   stores (not the FMAs) setting the pace. */
#define UNROLL _Pragma("unroll")

#define WN (BN / TN)    /* work-items along N (dimension 0) */
#define WM (BM / TM)    /* work-items along M (dimension 1) */
#define NT (WN * WM)
#define TNV (TN / VW)   /* vectors per work-item along N */
#define BNV (BN / VW)   /* vectors per row of the B tile */
#define BKV (BK / VW)   /* vectors per row of the A tile (along k) */

kernel void gemm(GEMM_ARGS)
{
#if NT > 1
    local T As[BK][BM];     /* transposed: k-major */
    local VT Bs[BK][BNV];
#endif
    const int tx = get_local_id(0);
    const int ty = get_local_id(1);
    const int tid = ty * WN + tx;
#if NT == 1
    /* Consecutive work-groups take consecutive row blocks of the same column block, so
       the B panel they all read stays in cache (and in the TLB: its rows are N apart). */
    const int row0 = get_group_id(0) * BM;
    const int col0 = get_group_id(1) * BN;
#else
    const int col0 = get_group_id(0) * BN;
    const int row0 = get_group_id(1) * BM;
#endif
    const int z = get_group_id(2);
    const long a_base = a_off + z * a_bs;
    const long b_base = b_off + z * b_bs;
    const long c_base = c_off + (long)z * M * N;
    global const T *a = A + a_base;
    global const T *b = B + b_base;
    /* Aligned vector access is possible when every row starts on a multiple of VW. */
#if NT > 1
    const bool a_vec = a_base % VW == 0 && K % VW == 0;
#endif
#if NT > 1 || !defined(TG_PANELS)
    const bool b_vec = b_base % VW == 0 && N % VW == 0;
#endif
    const bool c_vec = c_base % VW == 0 && N % VW == 0;

    VT acc[TM][TNV];
    UNROLL
    for (int r = 0; r < TM; ++r)
        UNROLL
        for (int v = 0; v < TNV; ++v)
            acc[r][v] = (VT)ZERO;

#if NT == 1 && defined(TG_PANELS)
    /* One work-item per work-group, A and B packed in panels by the backend (TG_PANELS,
       where OpenCLProgram.packs finds reading in place costly): the work-item's TM rows of
       A are one contiguous K x TM panel, k-major, and its TN columns of B one contiguous
       K x TN panel, both zero-padded past the matrix, so the loop reads two sequential
       streams, B as aligned vectors, with no bounds checks (C's store keeps its own).
       Why pack: read in place, B's TN columns are K rows N elements apart. When N times
       the element size is a multiple of 4 KB (1024 or 2048 in float32) those rows all
       fall in the same few sets of the CPU's caches, which then keep only a few hundred
       of them: the strip is evicted before the next row block reads it again. 1040-wide
       products ran at 1.3x the speed of 1024-wide ones (Xeon, AVX-512). B's rows not
       being whole vectors (N not a multiple of VW) cost more: element-by-element loads.
       Packed, each panel is one run of aligned addresses, at the price of one pass over A
       and over B before the product. The loop is the in-place one below with the panels'
       strides (TM, TN) in place of the matrices' (K, N). */
    {
        global const T *ap = a + (long)(row0 / TM) * K * TM;
        global const T *bp = b + (long)(col0 / TN) * K * TN;
        for (int k = 0; k < K; ++k) {
            VT bv[TNV];
            UNROLL
            for (int v = 0; v < TNV; ++v)
                bv[v] = *(global const VT *)(bp + (long)k * TN + v * VW);
            UNROLL
            for (int r = 0; r < TM; ++r) {
                const T av = ap[(long)k * TM + r];
                UNROLL
                for (int v = 0; v < TNV; ++v)
                    acc[r][v] += av * bv[v];
            }
        }
    }
#elif NT == 1
    /* One work-item per work-group (BM == TM, BN == TN, the CPU default): there is no
       other work-item to share a tile with, so staging in local memory would only copy
       data; read A and B straight from global memory and let the caches stage them.
       Interior blocks take an unchecked vector loop; edge blocks the checked one. */
    if (b_vec && row0 + TM <= M && col0 + TN <= N) {
        global const T *arow = a + (long)row0 * K;
        global const T *bcol = b + col0;
        for (int k = 0; k < K; ++k) {
            VT bv[TNV];
            UNROLL
            for (int v = 0; v < TNV; ++v)
                bv[v] = *(global const VT *)(bcol + (long)k * N + v * VW);
            UNROLL
            for (int r = 0; r < TM; ++r) {
                const T av = arow[(long)r * K + k];
                UNROLL
                for (int v = 0; v < TNV; ++v)
                    acc[r][v] += av * bv[v];
            }
        }
    } else {
        for (int k = 0; k < K; ++k) {
            VT bv[TNV];
            UNROLL
            for (int v = 0; v < TNV; ++v) {
                T *x = (T *)&bv[v];
                UNROLL
                for (int e = 0; e < VW; ++e) {
                    const int j = col0 + v * VW + e;
                    x[e] = j < N ? b[(long)k * N + j] : ZERO;
                }
            }
            UNROLL
            for (int r = 0; r < TM; ++r) {
                const T av = row0 + r < M ? a[(long)(row0 + r) * K + k] : ZERO;
                UNROLL
                for (int v = 0; v < TNV; ++v)
                    acc[r][v] += av * bv[v];
            }
        }
    }
#else
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int l = tid; l < BM * BKV; l += NT) {
            const int r = l / BKV, kv = l % BKV;
            const int i = row0 + r, k = k0 + kv * VW;
            global const T *src = a + (long)i * K + k;
            if (a_vec && i < M && k + VW <= K) {
                const VT x = *(global const VT *)src;
                UNROLL
                for (int e = 0; e < VW; ++e)
                    As[kv * VW + e][r] = ((const T *)&x)[e];
            } else {
                UNROLL
                for (int e = 0; e < VW; ++e)
                    As[kv * VW + e][r] = (i < M && k + e < K) ? src[e] : ZERO;
            }
        }
        for (int l = tid; l < BK * BNV; l += NT) {
            const int kk = l / BNV, cv = l % BNV;
            const int k = k0 + kk, j = col0 + cv * VW;
            global const T *src = b + (long)k * N + j;
            if (b_vec && k < K && j + VW <= N) {
                Bs[kk][cv] = *(global const VT *)src;
            } else {
                local T *dst = (local T *)&Bs[kk][cv];
                UNROLL
                for (int e = 0; e < VW; ++e)
                    dst[e] = (k < K && j + e < N) ? src[e] : ZERO;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < BK; ++kk) {
            T av[TM];
            VT bv[TNV];
            UNROLL
            for (int r = 0; r < TM; ++r)
                av[r] = As[kk][ty + r * WM];
            UNROLL
            for (int v = 0; v < TNV; ++v)
                bv[v] = Bs[kk][v * WN + tx];
            UNROLL
            for (int r = 0; r < TM; ++r)
                UNROLL
                for (int v = 0; v < TNV; ++v)
                    acc[r][v] += av[r] * bv[v];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#endif

    UNROLL
    for (int r = 0; r < TM; ++r) {
        const int i = row0 + ty + r * WM;
        if (i >= M)
            continue;
        global T *crow = C + c_base + (long)i * N;
        UNROLL
        for (int v = 0; v < TNV; ++v) {
            const int j = col0 + (v * WN + tx) * VW;
            if (c_vec && j + VW <= N) {
                global VT *dst = (global VT *)(crow + j);
                if (beta == ZERO) *dst = alpha * acc[r][v];
                else *dst = alpha * acc[r][v] + beta * *dst;
            } else {
                const T *x = (const T *)&acc[r][v];
                UNROLL
                for (int e = 0; e < VW; ++e)
                    if (j + e < N)
                        STORE_C(crow + j + e, x[e]);
            }
        }
    }
}
