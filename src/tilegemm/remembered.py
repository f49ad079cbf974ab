"""When the decisions remembered for repeated calls go stale, and forgetting them.

Repeated calls skip the full path's decision: host products in :mod:`tilegemm.fastpath`,
device arrays in :mod:`tilegemm.fastpath_device`. Each keeps its own tables, registered
here (:func:`table`), and they share what is kept in this module: the state of the tuning
cache file the decisions were made under, and when it is read again.

What is remembered is a decision, so it is made again when something it depends on
changes: every table is emptied when ``TILEGEMM_CACHE_DIR`` changes (read on every call),
when this process writes the tuning cache file (``tilegemm tune``'s results), and when
another process has changed it: the file's time is read with ``stat`` at most once every
``STAT_INTERVAL_NS`` (50 ms) of calls, since one ``stat`` (about 1.9 µs on a Xeon VM) was a
third of a remembered 8×8×8 call. So a tuning run in another process is seen by this one's
remembered calls within 50 ms, and by every other call (``plan``, the full path) at once.
A time read is trusted only once a ``stat`` has confirmed it: a decision remembered under
an older state of the file than the last one seen is checked on its next call.
:func:`forget` empties every table on request. A table holds at most ``LIMIT`` cases; all
of them are dropped when one is full (a loop over a few shapes refills it at once).
"""

from __future__ import annotations

import os
import time
from typing import Any

from tilegemm._environ import environ_reader

LIMIT = 256  # remembered cases per table at most
# How often remembered calls read the tuning cache file's time (another process's writes).
STAT_INTERVAL_NS = 50_000_000

cache_dir, _ = environ_reader("TILEGEMM_CACHE_DIR")
poison, _encode = environ_reader("TILEGEMM_POISON")
# what base.poison_enabled() reads as "off": unset, empty or "0"
POISON_OFF = (None, _encode(""), _encode("0"))

# the tuning cache file the decisions read, its mtime then, and TILEGEMM_CACHE_DIR then
# (which moves the file: a decision made under another directory is stale too; kept as
# cache_dir() reads it)
_watch: list[Any] = [None, None, None]
# time.monotonic_ns() of the last stat that found _watch current; 0: not confirmed since
# _watch last changed, so the next check reads the file's time
_confirmed = [0]
_tables: list[Any] = []  # every table of remembered cases (dicts and sets)


def table(empty: Any) -> Any:
    """``empty`` (a dict or a set), registered as a table of remembered cases: emptied by
    :func:`forget` with all the others."""
    _tables.append(empty)
    return empty


def mtime(path: str | None) -> int | None:
    """The modification time of the file ``path`` in ns, or None (no path, no file)."""
    try:
        return os.stat(path).st_mtime_ns if path else None
    except OSError:
        return None


def given(params: dict[str, Any] | None) -> tuple[tuple[str, int], ...] | None:
    """The rung parameters a call names, as part of a key; None when one is not a plain
    integer (what the full path makes of another value is its own business)."""
    if not params:
        return ()
    if any(type(v) is not int for v in params.values()):
        return None
    return tuple(sorted(params.items()))


def current(tuning_cache: str | None, tuning_mtime: int | None) -> bool:
    """Whether the remembered cases were made under this state of the tuning cache file
    (``tuning_cache``, modified at ``tuning_mtime``) and the present cache directory."""
    return _watch == [tuning_cache, tuning_mtime, cache_dir()]


def enter(tuning_cache: str | None, tuning_mtime: int | None, *tables: Any) -> None:
    """Make ready to remember a case decided under this state of the tuning cache file, in
    ``tables``: everything remembered is dropped first when the state changed or one of
    ``tables`` is full."""
    state = [tuning_cache, tuning_mtime, cache_dir()]
    if _watch != state or any(len(t) >= LIMIT for t in tables):
        forget()
    _watch[:] = state


def stale() -> bool:
    """Whether the tuning cache file changed, or moved, since the remembered decisions:
    the directory on every call, the file's time when no ``stat`` in the last
    ``STAT_INTERVAL_NS`` confirmed the state the decisions were made under."""
    if cache_dir() != _watch[2]:
        return True
    now = time.monotonic_ns()
    if _confirmed[0] and now - _confirmed[0] < STAT_INTERVAL_NS:
        return False
    if mtime(_watch[0]) != _watch[1]:
        return True
    _confirmed[0] = now
    return False


def forget() -> None:
    """Drop every remembered decision (the next calls take the full path again)."""
    for t in _tables:
        t.clear()
    _confirmed[0] = 0
