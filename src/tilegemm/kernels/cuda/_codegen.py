"""Kernels whose inner loops are written out at build time, as Python source.

Why: numba lowers ``for kk in range(BK)`` to a loop with a 64-bit counter, and LLVM does not
unroll a body of 64 FMAs and a few shared loads 16 times. In the loop every shared address
is rebuilt from ``kk`` on every step (the swizzle, the row offset) and nothing overlaps one
step's loads with the previous step's FMAs: about 20 integer instructions per 64 FMAs. With
the steps written out, every shared address is a per-thread base plus a constant, which
ptxas folds into the load instruction (``LDS.128 R8, [R2+0x400]``), and ptxas can issue
the next step's loads among this step's FMAs. The generated source is an ordinary numba
kernel: it compiles, runs on the simulator and is traced like the hand-written rungs.

``indent(lines, spaces)`` indents generated lines, ``fill(template, parts)`` puts them in
place of ``#@NAME`` marker lines; ``compile_source(source, name,
namespace)`` turns the text into a function whose globals are ``namespace`` (the rung's
constants and helpers, and ``cuda``: numba's simulator swaps ``cuda`` in a kernel's globals,
so it must be a global there, not a closure variable). The text is registered with
``linecache`` so tracebacks, the simulator and ``tilegemm explain``'s tracer can show it.
"""

from __future__ import annotations

import itertools
import linecache
import re
from collections.abc import Callable, Iterable
from typing import Any

_serial = itertools.count()


def indent(lines: Iterable[str], spaces: int) -> str:
    """``lines`` joined, each indented by ``spaces`` (the first too)."""
    pad = " " * spaces
    return "\n".join(pad + line for line in lines)


def compile_source(source: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """Define the function ``name`` from ``source`` with ``namespace`` as its globals."""
    filename = f"<tilegemm generated {name} #{next(_serial)}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated text
    return namespace[name]


def fill(template: str, parts: dict[str, list[str]]) -> str:
    """``template`` with every line ``#@NAME`` replaced by ``parts[NAME]``, each line
    indented like the marker (so one part can go to several depths)."""

    def lines(match: re.Match[str]) -> str:
        return indent(parts[match.group(2)], len(match.group(1)))

    return re.sub(r"^( *)#@(\w+)$", lines, template, flags=re.MULTILINE)
