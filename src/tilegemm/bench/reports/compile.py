"""``compile`` (the Numba ROC example): first call (compilation included) against steady
time, with NumPy's time beside the GPU's. Its cases run before all others, so that their
first calls are the cold ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilegemm.bench import report as rp
from tilegemm.bench.reports import Report
from tilegemm.bench.results import Results

if TYPE_CHECKING:
    from tilegemm.bench.reports import PlanContext
    from tilegemm.bench.sweeps import Case


def compile_tables(results: Results) -> list[rp.Table]:
    """the Numba ROC example's comparison: first call (compilation included) vs steady, and
    NumPy."""
    tables = []
    from tilegemm.backends import host_backend

    host = host_backend()
    ms_all = [m for m in results.measurements if "compile" in m.reports]
    numpy_row = next((m for m in ms_all if m.backend == host and m.vendor), None)
    for be in results.backends("compile"):
        at = rp.in_order(m for m in ms_all if m.backend == be)
        if not at or (be == host and all(m.vendor for m in at)):
            continue
        n = at[0].m
        t = rp.Table(f"First call vs steady — {be} on {rp.device_of(results, be)}, {n}³",
                  ["kernel", "parameters", "first call ms", "steady median ms", "first/steady",
                   "GFLOP/s (steady)"], text_columns=2)
        rows = at + ([numpy_row] if numpy_row is not None and be != host else [])
        for m in rows:
            s = m.stats if m.status == rp.OK else None
            ratio = f"{m.first_s / s.median:,.0f}×" if s and m.first_s and s.median else rp.DASH
            name = f"{m.kernel} (CPU)" if m.vendor and m.backend == host else m.kernel
            params = " ".join(f"{k}={v}" for k, v in m.params.items())
            t.rows.append([name, params, rp.fmt_ms(m.first_s) if m.status == rp.OK else rp.cell(m),
                           rp.fmt_ms(s.median) if s else rp.DASH, ratio, rp.cell(m)])
        t.notes += rp.problem_notes(rows)
        t.notes.append("first call = build/compile + operand upload + one launch, host clock; "
                       "steady = median of backend-timed launches after warm-up; every rung "
                       "at its generic defaults (registry, per device kind), not the tuned or "
                       "shipped parameters matmul uses")
        tables.append(t)
    return tables


def cases(ctx: PlanContext) -> list[Case]:
    n = ctx.settings.compile_size
    out = [c for be in ctx.backends for c in ctx.ladder_cases("compile", be, n)]
    if ctx.backends:  # the Numba ROC example prints NumPy's time beside the GPU's
        from tilegemm.backends import host_backend

        out.append(ctx.case("compile", host_backend(), n))
    return out


REPORT = Report("compile", 10, cases, compile_tables, cold=True)
