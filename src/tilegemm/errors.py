"""The errors a caller's input can cause, apart from everything else that can go wrong.

Every check that refuses a call (a wrong shape, dtype, parameter, device or size; a backend
that cannot run here) raises one of these. Each is also the built-in exception NumPy or
Python would raise for the same mistake (``ValueError``, ``TypeError``, ``RuntimeError``),
so code that catches those keeps working. The command line tells them apart from internal
failures: a :class:`UsageError` prints one line and exits with status 2; anything else is a
bug in tilegemm or its libraries and exits with status 3 (``--debug`` shows the traceback).
"""

from __future__ import annotations

from typing import Any

try:  # NumPy's own exception for a disallowed cast into ``out`` (a TypeError)
    from numpy._core._exceptions import _UFuncOutputCastingError as _NumPyOutputCastingError
except ImportError:  # pragma: no cover - NumPy 1.x
    try:
        from numpy.core._exceptions import _UFuncOutputCastingError as _NumPyOutputCastingError
    except ImportError:
        _NumPyOutputCastingError = None  # type: ignore[assignment,misc]


class UsageError(Exception):
    """Base class: the call was refused before anything ran; the caller can fix it."""


class InvalidValueError(UsageError, ValueError):
    """A shape, parameter, size or option value that cannot be used."""


class InvalidTypeError(UsageError, TypeError):
    """A dtype, array type or argument type that cannot be used."""


class UnavailableError(UsageError, RuntimeError):
    """What was asked for cannot run on this machine (no GPU, no driver, no device)."""


if _NumPyOutputCastingError is not None:
    class OutputCastingError(UsageError, _NumPyOutputCastingError):  # type: ignore[misc]
        """The result cannot be cast into ``out`` under NumPy's ``same_kind`` rule: the same
        exception type (and message) as ``np.matmul`` raises, so code catching NumPy's
        ``UFuncTypeError`` or ``TypeError`` keeps working."""
else:  # pragma: no cover
    class OutputCastingError(UsageError, TypeError):  # type: ignore[no-redef]
        """The result cannot be cast into ``out`` under NumPy's ``same_kind`` rule."""


def output_casting_error(from_: Any, to: Any) -> OutputCastingError:
    """NumPy's "Cannot cast ufunc 'matmul' output from ... to ..." for these dtypes."""
    import numpy as np

    if _NumPyOutputCastingError is not None:
        return OutputCastingError(np.matmul, "same_kind", np.dtype(from_), np.dtype(to), 0)
    return OutputCastingError(  # pragma: no cover
        f"Cannot cast ufunc 'matmul' output from {np.dtype(from_)!r} to {np.dtype(to)!r} "
        "with casting rule 'same_kind'")


_PACKAGE_DIR = __file__.rsplit("errors.py", 1)[0]


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` called by the caller of this function that
    makes the warning name the first line outside tilegemm (the user's call), however deep
    inside tilegemm it is issued."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or frame.f_globals.get("__name__", "").startswith(_NOT_USERS)):
        frame, level = frame.f_back, level + 1
    return level


# Code between tilegemm's frames that is never the user's: Numba (a compiled rung loading
# its code on its first call) and tilegemm's generated kernel modules, kept in the cache.
_NOT_USERS = ("numba.", "llvmlite.", "tilegemm_kernel_")

