"""tilegemm: matrix multiplication from Python as a ladder of kernels.

Importing tilegemm imports no GPU library and initialises neither CUDA nor OpenCL; that
happens on the first call that needs a backend.
"""

# ``tilegemm.kernels`` and ``tilegemm.reference`` are modules that can be called: the rungs'
# package lists them when called, the reference module computes the float64 product (see
# tilegemm._callable). Binding functions of those names here would hide the modules.
from tilegemm import errors, kernels, reference
from tilegemm._compat import restore_numpy_aliases
from tilegemm.api import backends, gemm, matmul
from tilegemm.plan import Plan, plan
from tilegemm.reference import assert_close

restore_numpy_aliases()  # before numba.cuda is ever imported (see tilegemm._compat)


def _tbb_first() -> None:
    """TBB made loadable now (a millisecond, no Numba import): a caller who sizes Numba's
    pool with ``numba.set_num_threads`` before the first CPU product starts Numba's
    threading layer, which would otherwise be OpenMP (not fork-safe; see
    ``tilegemm.kernels.cpu._threads``)."""
    from tilegemm.kernels.cpu._threads import make_tbb_loadable

    make_tbb_loadable()


_tbb_first()


def __getattr__(name: str) -> object:
    """``tilegemm.dask`` imported on first use: ``import tilegemm`` stays free of Dask, and
    ``tilegemm.dask.matmul(a, b)``, which a Dask operand's error advises, works as written
    after ``import tilegemm`` alone."""
    if name == "dask":
        import importlib

        return importlib.import_module("tilegemm.dask")
    raise AttributeError(f"module 'tilegemm' has no attribute {name!r}")


__version__ = "0.1.0"
__all__ = ["matmul", "gemm", "plan", "Plan", "kernels", "backends", "reference", "assert_close",
           "errors", "__version__"]
