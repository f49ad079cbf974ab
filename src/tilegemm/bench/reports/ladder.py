"""``ladder``: every rung at its defaults at one or more sizes, as a share of the vendor
library in the same run (the summary table, shown last)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilegemm.bench.report import (
    DASH,
    FAILED,
    NOISY_MARK,
    OK,
    Table,
    cell,
    device_of,
    dtype_label,
    fmt_ms,
    in_order,
    noise_notes,
    noisy,
    percent,
    problem_notes,
    short_name,
    sizes_of,
    vendor_line,
)
from tilegemm.bench.reports import Report
from tilegemm.bench.results import Results

if TYPE_CHECKING:
    from tilegemm.bench.reports import PlanContext
    from tilegemm.bench.sweeps import Case


def ladder_tables(results: Results) -> list[Table]:
    tables = []
    dtype = dtype_label(results.meta.get("settings", {}))
    for be in results.backends("ladder"):
        ms = results.for_report("ladder", be)
        for n in sizes_of(ms):
            at = in_order(m for m in ms if m.m == n)
            ref = next((m for m in at if m.vendor and m.status == OK), None)
            ref_name = short_name(ref.kernel) if ref else "vendor"
            t = Table(f"Ladder — {be} on {device_of(results, be)}, {dtype}, {n}³",
                      ["rung", "kernel", "parameters", "verified", "median ms", "IQR ms",
                       "GFLOP/s", f"% of {ref_name}"], text_columns=4)
            for m in at:
                s = m.stats
                iqr = f"{fmt_ms(s.q1)}–{fmt_ms(s.q3)}" if s and m.status == OK else DASH
                verified = {OK: "yes", FAILED: FAILED}.get(m.status, "not run")
                params = " ".join(f"{k}={v}" for k, v in m.params.items())
                t.rows.append([DASH if m.vendor else str(m.rung), m.kernel, params, verified,
                               fmt_ms(s.median) if s and m.status == OK else DASH, iqr,
                               cell(m) + (NOISY_MARK if noisy(m) else ""), percent(m, ref)])
            t.notes += problem_notes(at)
            t.notes += noise_notes(at)
            if line := vendor_line(results, be):
                t.notes.append(line)
            tables.append(t)
    return tables


def cases(ctx: PlanContext) -> list[Case]:
    return [c for n in ctx.settings.ladder_sizes for be in ctx.backends
            for c in [*(ctx.case("ladder", be, n, s) for s in ctx.specs[be]),
                      ctx.case("ladder", be, n)]]


REPORT = Report("ladder", 40, cases, ladder_tables)
