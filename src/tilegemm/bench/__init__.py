"""The benchmark harness behind ``tilegemm bench`` (and the tuner's measurements).

- :mod:`~tilegemm.bench.timing` — the one place kernels are timed: verify first, then
  warm-up, then repeats within a time budget; median and spread; first call apart.
- :mod:`~tilegemm.bench.vendors` — the vendor library each backend is compared with
  (cuBLAS through CuPy or PyTorch, CLBlast, NumPy).
- :mod:`~tilegemm.bench.sweeps` — the optimisation note's tables as plans of cases read from the
  registry (sizes × block sizes, outputs per thread, the ladder, first call vs steady).
- :mod:`~tilegemm.bench.results` — measurements and run metadata, JSON in and out.
- :mod:`~tilegemm.bench.report` — the tables (terminal, Markdown, CSV).
- :mod:`~tilegemm.bench.plot` — GFLOP/s vs size (the only module importing matplotlib).
- :mod:`~tilegemm.bench.environment` — device, versions, git commit, file-name slugs.
"""
