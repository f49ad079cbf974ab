"""The autotuner: search a rung's parameters on this device and remember the best.

- :mod:`~tilegemm.tune.space` — the candidates: the rung's own parameter space
  (``KernelSpec.space()``, pruned by the rung's constraints), then device limits (threads,
  static shared memory, and — for CUDA, when computable — registers and spills);
- :mod:`~tilegemm.tune.strategies` — exhaustive or seeded random search; every candidate is
  verified against the float64 reference before it is timed, and timed through
  ``Backend.prepare(...).elapsed(n)`` (device-side timing, median of repeats);
- :mod:`~tilegemm.tune.cache` — the per-device JSON cache;
- :mod:`~tilegemm.tune.select` — ``auto_choice``, the one place ``kernel="auto"`` is decided.

Nothing here imports a GPU library at import time.
"""
