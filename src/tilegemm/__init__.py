"""tilegemm: matrix multiplication from Python as a ladder of kernels.

Importing tilegemm imports no GPU library and initialises neither CUDA nor OpenCL; that
happens on the first call that needs a backend.
"""

from tilegemm.api import backends, gemm, kernels, matmul
from tilegemm.reference import assert_close, reference

__version__ = "0.1.0"
__all__ = ["matmul", "gemm", "kernels", "backends", "reference", "assert_close", "__version__"]
