"""tilegemm: matrix multiplication from Python as a ladder of kernels.

Importing tilegemm imports no GPU library and initialises neither CUDA nor OpenCL; that
happens on the first call that needs a backend.
"""

# The rungs live in the subpackage ``tilegemm.kernels``; the public function of the same
# name lists them. Python binds a subpackage as an attribute of its parent when the
# subpackage is first imported, which would shadow the function; importing the (empty,
# GPU-free) subpackage here first and binding the function afterwards keeps
# ``tilegemm.kernels()`` callable while ``tilegemm.kernels.cuda`` still imports normally.
import tilegemm.kernels  # noqa: F401  (see above; must precede the API import)
from tilegemm import errors
from tilegemm._compat import restore_numpy_aliases
from tilegemm.api import backends, gemm, kernels, matmul
from tilegemm.plan import Plan, plan
from tilegemm.reference import assert_close, reference

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
