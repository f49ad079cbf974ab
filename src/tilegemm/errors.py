"""The errors a caller's input can cause, apart from everything else that can go wrong.

Every check that refuses a call (a wrong shape, dtype, parameter, device or size; a backend
that cannot run here) raises one of these. Each is also the built-in exception NumPy or
Python would raise for the same mistake (``ValueError``, ``TypeError``, ``RuntimeError``),
so code that catches those keeps working. The command line tells them apart from internal
failures: a :class:`UsageError` prints one line and exits with status 2; anything else is a
bug in tilegemm or its libraries and exits with status 3 (``--debug`` shows the traceback).
"""

from __future__ import annotations


class UsageError(Exception):
    """Base class: the call was refused before anything ran; the caller can fix it."""


class InvalidValueError(UsageError, ValueError):
    """A shape, parameter, size or option value that cannot be used."""


class InvalidTypeError(UsageError, TypeError):
    """A dtype, array type or argument type that cannot be used."""


class UnavailableError(UsageError, RuntimeError):
    """What was asked for cannot run on this machine (no GPU, no driver, no device)."""
