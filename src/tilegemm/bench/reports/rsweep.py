"""``rsweep`` (the optimisation note's outputs-per-thread sweep): rungs with an
outputs-per-thread parameter ``R``, once per R, beside the note's own figures."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilegemm.bench.report import (
    DASH,
    NOISY_MARK,
    OK,
    Table,
    cell,
    device_of,
    in_order,
    noise_notes,
    noisy,
    percent,
    problem_notes,
    short_name,
    sizes_of,
)
from tilegemm.bench.reports import Report
from tilegemm.bench.results import Results

if TYPE_CHECKING:
    from tilegemm.bench.reports import PlanContext
    from tilegemm.bench.sweeps import Case


# the optimisation note's outputs-per-thread sweep (TFLOP/s at 1024³, block 32×32, its GPU is not
# named): shown beside ours for the shape of the curve, not as a target.
NOTE_R_TFLOPS: dict[int, float] = {1: 3.67, 2: 4.80, 4: 6.02, 8: 6.77, 16: 6.67, 32: 5.32}
OUTPUTS_PARAM = "R"  # outputs per thread (the optimisation note's ILP kernel)


def rsweep_tables(results: Results) -> list[Table]:
    """the optimisation note's outputs-per-thread sweep."""
    tables = []
    for be in results.backends("rsweep"):
        ms = results.for_report("rsweep", be)
        ref = next((m for m in ms if m.vendor and m.status == OK), None)
        for n in sizes_of(ms):
            at = [m for m in in_order(ms) if m.m == n and not m.vendor]
            ref_name = short_name(ref.kernel) if ref else "vendor"
            t = Table(f"Outputs per thread (R) — {be} on {device_of(results, be)}, {n}³",
                      ["kernel", "R", "parameters", "GFLOP/s", f"% of {ref_name}",
                       "optimisation note TFLOP/s (1024³, its GPU)"], text_columns=3)
            for m in at:
                r = m.params.get("R")
                params = " ".join(f"{k}={v}" for k, v in m.params.items() if k != "R")
                seed = NOTE_R_TFLOPS.get(r) if r is not None else None
                t.rows.append([m.kernel, str(r), params, cell(m) + (NOISY_MARK if noisy(m)
                                                                     else ""),
                               percent(m, ref), f"{seed:.2f}" if seed is not None else DASH])
            if ref is not None:
                t.rows.append([ref.kernel, DASH, "", cell(ref), "100.0%", DASH])
            t.notes += problem_notes(at)
            t.notes += noise_notes(at + ([ref] if ref is not None else []))
            tables.append(t)
    return tables


def cases(ctx: PlanContext) -> list[Case]:
    n = ctx.settings.r_size
    out = []
    for be in ctx.backends:
        swept = [s for s in ctx.specs[be] if any(p.name == OUTPUTS_PARAM for p in s.params)]
        for s in swept:
            choices = next(p.choices for p in s.params if p.name == OUTPUTS_PARAM)
            out += [ctx.case("rsweep", be, n, s, {OUTPUTS_PARAM: r})
                    for r in ctx.settings.r_values if r in choices]
        if swept:
            out.append(ctx.case("rsweep", be, n))
    return out


REPORT = Report("rsweep", 30, cases, rsweep_tables)
