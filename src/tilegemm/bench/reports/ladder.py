"""``ladder``: every rung at its defaults at one or more sizes, plus the rung and parameters
``kernel="auto"`` runs there (tuned, from the shipped database, or the defaults), as a share
of the vendor library in the same run (the summary table, shown last), with the rivals
timed beside it (Triton's matmul on a CUDA device) as a share of the same library."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilegemm.bench import report as rp
from tilegemm.bench.reports import Report
from tilegemm.bench.results import Results
from tilegemm.bench.timing import AUTO_SOURCE, PARAMS_DEFAULTS, Measurement

SOURCES_NOTE = ("parameters from: 'defaults' = the rung's registry defaults for this device "
                "(what matmul(kernel=<rung>) runs where nothing was tuned or shipped for the "
                "rung here); 'auto: ...' = what "
                "matmul(kernel='auto') runs for this product here, and where it found them "
                "(tuned: the tuning cache; database: the measurements shipped with "
                "tilegemm; default: the rung's defaults)")

if TYPE_CHECKING:
    from tilegemm.bench.reports import PlanContext
    from tilegemm.bench.sweeps import Case


def params_from(m: Measurement) -> str:
    """Where a row's parameters came from: "defaults", "auto: database (device)", or both
    when auto runs a rung at its defaults. Files written before this was recorded held
    only the rungs' defaults."""
    if m.vendor:
        return rp.DASH
    return ", ".join(m.sources) or PARAMS_DEFAULTS


def ladder_tables(results: Results) -> list[rp.Table]:
    tables = []
    dtype = rp.dtype_label(results.meta.get("settings", {}))
    for be in results.backends("ladder"):
        ms = results.for_report("ladder", be)
        for n in rp.sizes_of(ms):
            at = rp.in_order(m for m in ms if m.m == n)
            ref = rp.reference(results, be, at)
            ref_name = rp.short_name(ref.kernel) if ref else "vendor"
            t = rp.Table(f"Ladder — {be} on {rp.device_of(results, be)}, {dtype}, {n}³",
                      ["rung", "kernel", "parameters", "parameters from", "verified",
                       "median ms", "IQR ms", "GFLOP/s", f"% of {ref_name}"], text_columns=5)
            for m in at:
                s = m.stats
                iqr = f"{rp.fmt_ms(s.q1)}–{rp.fmt_ms(s.q3)}" if s and m.status == rp.OK else rp.DASH
                verified = {rp.OK: "yes", rp.FAILED: rp.FAILED}.get(m.status, "not run")
                params = " ".join(f"{k}={v}" for k, v in m.params.items())
                t.rows.append([rp.DASH if m.vendor else str(m.rung), m.kernel, params,
                               params_from(m), verified,
                               rp.fmt_ms(s.median) if s and m.status == rp.OK else rp.DASH, iqr,
                               rp.marked_cell(m), rp.percent(m, ref)])
            t.notes += rp.problem_notes(at)
            t.notes += rp.noise_notes(at)
            if any(s.startswith(AUTO_SOURCE) for m in at for s in m.sources):
                t.notes.append(SOURCES_NOTE)
            if line := rp.vendor_line(results, be):
                t.notes.append(line)
            t.notes += results.meta.get("rivals", {}).get(be, {}).values()
            tables.append(t)
    return tables


def cases(ctx: PlanContext) -> list[Case]:
    out = []
    for n in ctx.settings.ladder_sizes:
        for be in ctx.backends:
            out += ctx.ladder_cases("ladder", be, n)
            # What a user's matmul gets without naming a rung; the same kernel as a rung's
            # defaults is measured once and its row names both.
            if (auto := ctx.auto_case("ladder", be, n)) is not None:
                out.append(auto)
            out += [ctx.case("ladder", be, n, rival=r) for r in ctx.rivals.get(be, ())]
    return out


REPORT = Report("ladder", 40, cases, ladder_tables)
