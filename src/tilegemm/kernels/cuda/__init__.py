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

Register economy in the fast rungs (6–9; measured with ``tilegemm kernels --backend cuda
--resources``, see docs/performance.md):

- Grid-stride loops, the loop over K and the per-k-tile ``kk`` loop are ``while`` loops
  (``z = cuda.blockIdx.z`` / ``while z < batch:`` / ``z += cuda.gridDim.z``), not
  ``range``. numba lowers ``range(start, stop, step)`` with a run-time step through a trip
  count (a 64-bit division) and two 64-bit induction variables per loop, and LLVM keeps
  them, and whatever it hoists into the outer loops, live across the whole K loop; a
  ``while`` loop has one induction variable, and one starting at 0 is known to be >= 0,
  which lets ``kk // W`` become a shift (rung 6 alone: 185 → 151 registers on sm_90).
- Edge paths index operands through ``_access.load``/``store`` rather than ``arr[i, j]``:
  numba's negative-index fix-up on every scalar access otherwise keeps a second copy of
  each row offset live (rung 6 alone: 185 → 161).
- Together: float32 defaults on sm_90 from 157–188 registers to 121–127, i.e. from one to
  two 256-thread blocks per SM, with no spills; float64 defaults no longer spill.
- Rungs 7 and 8 are generated as source at build time (``k08_warptile.generate``,
  ``_codegen``): the BK k steps written out, a block-uniform interior path, per-thread load
  offsets (``_access.vload_at``) and two blocks per SM in float32 (128 registers); see
  docs/performance.md for the machine code (``tilegemm explain --sass``).
- Indices stay 64-bit (numba's ``intp``), so no product of an index and a stride can
  overflow at 2**31 elements.
"""
