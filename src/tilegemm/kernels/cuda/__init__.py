"""Numba CUDA rungs, one module per rung (``kNN_<name>.py``), each defining ``SPEC``.

Conventions every rung follows:

- Import only NumPy and tilegemm at top level; ``build(params, dtype)`` imports numba.cuda
  and binds it as the *module global* ``cuda`` (``global cuda; from numba import cuda``).
  Numba's simulator swaps in its per-thread ``cuda`` module only through a kernel's
  globals, so a closure variable would break ``NUMBA_ENABLE_CUDASIM=1``.
- Compile-time parameters (tile sizes) and typed constants (``zero = dtype.type(0)``) are
  closure variables of ``build``: numba freezes them as constants.
- Kernel signature ``(A, B, C, alpha, beta)``: ``A`` (batch or 1, M, K), ``B`` (batch or 1,
  K, N), ``C`` (batch, M, N); C is read only when ``beta != 0``.
- Grid-stride loops over tiles in x, y and z (grids are capped by
  :func:`tilegemm.launch.capped_grid`), bounds on every edge, no return before a barrier.
"""
