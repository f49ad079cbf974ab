"""The rungs, one module each, discovered by ``tilegemm.registry``.

Called, this package lists them: ``tilegemm.kernels()`` (every backend's) or
``tilegemm.kernels("cuda")``, as ``KernelSpec`` objects (parameters, constraints, dtypes).
Its modules import as any others: ``import tilegemm.kernels.cpu.k01_triple_loop as k``.
"""

from tilegemm._callable import make_callable

make_callable(__name__, "tilegemm.api:kernels")
