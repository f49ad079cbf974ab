"""``rsweep`` (the optimisation note's outputs-per-thread sweep): rungs with an
outputs-per-thread parameter ``R``, once per R, beside the note's own figures."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilegemm.bench import report as rp
from tilegemm.bench.reports import Report
from tilegemm.bench.results import Results

if TYPE_CHECKING:
    from tilegemm.bench.reports import PlanContext
    from tilegemm.bench.sweeps import Case
    from tilegemm.registry import KernelSpec


# the optimisation note's outputs-per-thread sweep (TFLOP/s at 1024³, block 32×32, its GPU is not
# named): shown beside ours for the shape of the curve, not as a target.
NOTE_R_TFLOPS: dict[int, float] = {1: 3.67, 2: 4.80, 4: 6.02, 8: 6.77, 16: 6.67, 32: 5.32}
OUTPUTS_PARAM = "R"  # outputs per thread (the optimisation note's ILP kernel)


def rsweep_tables(results: Results) -> list[rp.Table]:
    """the optimisation note's outputs-per-thread sweep."""
    tables = []
    for be in results.backends("rsweep"):
        ms = results.for_report("rsweep", be)
        ref = next((m for m in ms if m.vendor and m.status == rp.OK), None)
        for n in rp.sizes_of(ms):
            at = [m for m in rp.in_order(ms) if m.m == n and not m.vendor]
            ref_name = rp.short_name(ref.kernel) if ref else "vendor"
            t = rp.Table(f"Outputs per thread (R) — {be} on {rp.device_of(results, be)}, {n}³",
                      ["kernel", "R", "parameters", "GFLOP/s", f"% of {ref_name}",
                       "optimisation note TFLOP/s (1024³, its GPU)"], text_columns=3)
            for m in at:
                r = m.params.get("R")
                params = " ".join(f"{k}={v}" for k, v in m.params.items() if k != "R")
                seed = NOTE_R_TFLOPS.get(r) if r is not None else None
                t.rows.append([m.kernel, str(r), params, rp.marked_cell(m),
                               rp.percent(m, ref), f"{seed:.2f}" if seed is not None else rp.DASH])
            if ref is not None:
                t.rows.append([ref.kernel, rp.DASH, "", rp.cell(ref), "100.0%", rp.DASH])
            t.notes.append("parameters other than R: the rung's generic defaults (registry, "
                           "per device kind)")
            t.notes += rp.problem_notes(at)
            t.notes += rp.noise_notes(at + ([ref] if ref is not None else []))
            tables.append(t)
    return tables


def cases(ctx: PlanContext) -> list[Case]:
    def r_values(s: KernelSpec) -> list[dict[str, int]]:  # none for a rung without R
        choices = next((p.choices for p in s.params if p.name == OUTPUTS_PARAM), ())
        return [{OUTPUTS_PARAM: r} for r in ctx.settings.r_values if r in choices]

    return [c for be in ctx.backends if any(r_values(s) for s in ctx.specs[be])
            for c in ctx.ladder_cases("rsweep", be, ctx.settings.r_size, r_values)]


REPORT = Report("rsweep", 30, cases, rsweep_tables)
