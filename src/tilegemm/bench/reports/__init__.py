"""The benchmark reports, one module each: the cases it measures and the tables it shows.

A report is a module in this package that defines ``REPORT = Report(...)``: its name (a
``tilegemm bench --reports`` choice), its position among the tables, ``cases`` (from a
:class:`PlanContext`: the backends, the settings, the rungs for the dtype and precision,
and ``case`` to make a :class:`~tilegemm.bench.sweeps.Case` of a rung or of the vendor
library) and ``tables`` (from the measured :class:`~tilegemm.bench.results.Results` to
:class:`~tilegemm.bench.report.Table` s). Discovery finds it, so adding a report is adding
one file: measuring (identical cases of several reports run once), verification, results
files, Markdown, CSV and terminal output need nothing more.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tilegemm.bench.report import Table
    from tilegemm.bench.results import Results
    from tilegemm.bench.sweeps import Case, Settings
    from tilegemm.registry import KernelSpec


@dataclass(frozen=True)
class PlanContext:
    """What a report's ``cases`` may use. ``specs[backend]``: the rungs that compute the
    dtype at the precision asked for. ``case(report, backend, n, spec=None, overrides=None)``:
    an n×n×n case of ``spec`` with ``overrides`` over its device defaults (a tensor-core
    rung's precision pinned), or of the backend's vendor library when ``spec`` is None
    (``rival=name``: of that rival instead). ``rivals[backend]``: the rivals timed there.
    ``auto_case(report, backend, n)``: the case ``kernel="auto"`` runs for that product
    (its rung and parameters), or None when it runs none of ``specs[backend]``."""

    backends: tuple[str, ...]
    settings: Settings
    specs: Mapping[str, list[KernelSpec]]
    case: Callable[..., Case]
    auto_case: Callable[[str, str, int], Case | None] = lambda report, backend, n: None
    rivals: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def ladder_cases(self, report: str, backend: str, n: int,
                     variants: Callable[[KernelSpec], Iterable[Mapping[str, int]]] = lambda s: [{}],
                     ) -> list[Case]:
        """The cases of one backend's ladder at n: every rung once per parameter set
        ``variants(spec)`` gives (its device defaults by default), then the vendor library."""
        return [*(self.case(report, backend, n, s, v) for s in self.specs[backend]
                  for v in variants(s)), self.case(report, backend, n)]


@dataclass(frozen=True)
class Report:
    name: str
    position: int  # tables are shown in ascending position (the summary last)
    cases: Callable[[PlanContext], list[Case]]
    tables: Callable[[Results], list[Table]]
    cold: bool = False  # measured before every other case, so its first calls are cold


@cache
def all_reports() -> dict[str, Report]:
    """Every report in this package, by name, in position order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            report = getattr(importlib.import_module(f"{__name__}.{info.name}"), "REPORT", None)
            if isinstance(report, Report):
                found.append(report)
    return {r.name: r for r in sorted(found, key=lambda r: (r.position, r.name))}


def names() -> tuple[str, ...]:
    return tuple(all_reports())
