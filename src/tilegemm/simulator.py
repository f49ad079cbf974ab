"""The one switch for numba's CUDA simulator: read here, nowhere else.

``NUMBA_ENABLE_CUDASIM=1`` must be set before ``numba.cuda`` is first imported; numba then
runs every CUDA kernel as Python threads on the host (correct but slow). Kernels, the
backend, the analysis and the tuner all ask :func:`enabled` instead of reading the
environment themselves, so they cannot disagree about which mode a process is in.
"""

from __future__ import annotations

import os

ENV_VAR = "NUMBA_ENABLE_CUDASIM"


def enabled() -> bool:
    """Whether CUDA kernels run on numba's simulator in this process."""
    return os.environ.get(ENV_VAR, "") not in ("", "0")
