"""Benchmark tables from a :class:`~tilegemm.bench.results.Results`: terminal, Markdown, CSV.

Each report (``tilegemm.bench.reports``) builds its own :class:`Table` s with the helpers
here; this module renders them.

Tables are built once as plain data (:class:`Table`) and rendered three ways, so what the
terminal shows, what ``--format md`` writes and what the README embeds are the same
table. A kernel that failed verification shows ``FAILED`` (with the reason under the
table), never a speed; a case not run shows ``—`` (the reason is listed too).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tilegemm.bench.results import Results
from tilegemm.bench.timing import FAILED, OK, SKIPPED, Measurement
from tilegemm.errors import InvalidValueError

DASH = "—"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    text_columns: int = 1  # leading columns of names (left-aligned); the rest are numbers


def fmt_gflops(x: float | None) -> str:
    if x is None:
        return DASH
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.2g}"


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:,.0f}"


def cell(m: Measurement | None) -> str:
    """GFLOP/s, or FAILED / — for a case that has no speed."""
    if m is None:
        return DASH
    if m.status == FAILED:
        return FAILED
    return fmt_gflops(m.gflops)


def short_name(vendor: str) -> str:
    """``cuBLAS (CuPy)`` → ``cuBLAS``: what a column header needs."""
    return vendor.split(" (")[0]


# Timings whose spread (IQR / median) exceeds this are marked: on a busy machine the
# median is not the kernel's speed, and a ratio to an equally disturbed vendor run can be
# off by orders of magnitude (a demo once printed "4748.9 % of NumPy").
NOISY_SPREAD = 0.10
NOISY_MARK = " ⚠"


def spread(m: Measurement | None) -> float | None:
    """IQR / median of a case's steady samples, or None without samples."""
    s = m.stats if m is not None and m.status == OK else None
    if s is None or s.median <= 0 or len(m.samples) < 2:
        return None
    return (s.q3 - s.q1) / s.median


def noisy(m: Measurement | None) -> bool:
    x = spread(m)
    return x is not None and x > NOISY_SPREAD


def marked_cell(m: Measurement | None) -> str:
    """:func:`cell`, marked when the timing was noisy."""
    return cell(m) + (NOISY_MARK if noisy(m) else "")


def percent(m: Measurement, ref: Measurement | None) -> str:
    if ref is None or m.gflops is None or ref.gflops is None:
        return DASH
    mark = NOISY_MARK if (noisy(m) or noisy(ref)) and m is not ref else ""
    return f"{100 * m.gflops / ref.gflops:.1f}%{mark}"


def noise_notes(ms: Iterable[Measurement]) -> list[str]:
    """One note naming the noisy timings (the vendor's included), if any."""
    bad = [m for m in ms if noisy(m)]
    if not bad:
        return []
    shown = ", ".join(f"{m.kernel if m.vendor else m.variant} at {m.size} "
                      f"({100 * spread(m):.0f}%)" for m in bad)
    return [f"{NOISY_MARK.strip()} noisy timing (IQR/median over {100 * NOISY_SPREAD:.0f}%): "
            f"{shown}; the machine was busy or the clock unsteady, so these ratios are not "
            "reliable: re-run on a quiet machine"]


def problem_notes(ms: Iterable[Measurement]) -> list[str]:
    """FAILED reasons, one per case; skip reasons, one per distinct reason and variant."""
    notes: list[str] = []
    seen: set[tuple[str, str]] = set()
    for m in ms:
        if m.status == FAILED:
            notes.append(f"FAILED {m.variant} at {m.size}: {m.reason}")
        elif m.status == SKIPPED and (m.variant, m.reason) not in seen:
            seen.add((m.variant, m.reason))
            notes.append(f"not run: {m.variant} ({m.size}...): {m.reason}")
    return notes


def device_of(results: Results, backend: str) -> str:
    info = results.meta.get("backends", {}).get(backend, {})
    return info.get("device") or backend


def vendor_line(results: Results, backend: str) -> str | None:
    note = results.meta.get("vendors", {}).get(backend)
    return f"vendor reference: {note}" if note else None


def reference(results: Results, backend: str, ms: Iterable[Measurement]) -> Measurement | None:
    """The vendor library's row among ``ms``, the 100 % of every share: the one the results
    name for the backend, so a rival timed beside it (Triton) is never taken for it; in a
    file that names none, the first vendor row."""
    name = results.meta.get("vendor_names", {}).get(backend)
    rows = [m for m in ms if m.vendor and m.status == OK]
    if name is None:
        return rows[0] if rows else None
    return next((m for m in rows if m.kernel == name), None)


def sizes_of(ms: Iterable[Measurement]) -> list[int]:
    return sorted({m.m for m in ms})


def in_order(ms: Iterable[Measurement]) -> list[Measurement]:
    """Rungs by rung number then parameters, the vendor last."""
    return sorted(ms, key=lambda m: (m.vendor, m.rung or 0, m.kernel,
                                     tuple(sorted(m.params.items()))))


def dtype_label(settings: dict) -> str:
    """The dtype, with the precision when it is not IEEE ("float32 tf32")."""
    dtype = settings.get("dtype", "float32")
    precision = settings.get("precision", "ieee")
    return dtype if precision == "ieee" else f"{dtype} {precision}"


def tables(results: Results, reports: Iterable[str] | None = None) -> list[Table]:
    """The tables of ``reports`` (default: all), in the order a reader wants them (each
    report's ``position``: the ladder, the summary, last)."""
    from tilegemm.bench.reports import all_reports

    wanted = set(all_reports() if reports is None else reports)
    out: list[Table] = []
    for name, rep in all_reports().items():
        if name in wanted:
            out += rep.tables(results)
    return out


def header_lines(results: Results) -> list[str]:
    meta = results.meta
    lines = [f"tilegemm {meta.get('tilegemm_version', '')} bench, "
             f"{meta.get('created', '')}, commit {meta.get('git_commit', 'unknown')}"]
    host = meta.get("host", {})
    if host:
        env = " ".join(f"{k}={v}" for k, v in host.get("env", {}).items())
        lines.append(f"host: {host.get('cpu', '')}, {host.get('cores', '?')} cores, "
                     f"{host.get('system', '')}" + (f"; {env}" if env else ""))
    for be, info in meta.get("backends", {}).items():
        extra = ", ".join(f"{k} {info[k]}" for k in ("compute_capability", "driver",
                                                      "driver_cuda_version") if info.get(k))
        lines.append(f"{be}: {info.get('device', '')}" + (f" ({extra})" if extra else ""))
    settings = meta.get("settings", {})
    pol = settings.get("policy", {})
    if settings:
        lines.append(f"profile {settings.get('profile')}, {dtype_label(settings)}; timing: "
                     f"median of ≥{pol.get('min_reps')} reps within {pol.get('budget_s')} s "
                     f"after {pol.get('warmup')} warm-up launches"
                     + (_flushed_text(results) if pol.get("flush") else ""))
    return lines


def _flushed_text(results: Results) -> str:
    """What ``--flush-l2`` did, from the measurements themselves: a backend without a cache
    flusher (OpenCL) ran warm, its rungs and its reference alike, and the reader is told."""
    timed = [m for m in results.measurements if m.samples]
    warm = sorted({m.backend for m in timed if not m.flushed})
    if timed and len(warm) == len({m.backend for m in timed}):
        return ", L2 flush asked for but not available on " + ", ".join(warm)
    return ", L2 flushed between reps" + (f" (not on {', '.join(warm)}: no flusher)"
                                          if warm else "")


# --- renderers -----------------------------------------------------------------------------


def to_markdown(results: Results, reports: Iterable[str] | None = None) -> str:
    out = [f"<!-- generated by `tilegemm bench`; commit {results.meta.get('git_commit')} -->"]
    out += [f"- {line}" for line in header_lines(results)]
    for t in tables(results, reports):
        out += ["", f"### {t.title}", ""]
        out.append("| " + " | ".join(t.columns) + " |")
        out.append("|" + "|".join("---" if i < t.text_columns else "---:"
                                  for i in range(len(t.columns))) + "|")
        for row in t.rows:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        if t.notes:
            out.append("")
            out += [f"- {n}" for n in t.notes]
    return "\n".join(out) + "\n"


CSV_FIELDS = ("reports", "backend", "kernel", "vendor", "rung", "params", "m", "n", "k", "batch",
              "dtype", "status", "gflops", "median_s", "min_s", "q1_s", "q3_s", "max_s",
              "n_samples", "first_s", "method", "flushed", "reason", "sources")


def to_csv(results: Results) -> str:
    """One row per measurement (not pivoted): easy to load into anything."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for m in results.measurements:
        s = m.stats
        row: dict[str, Any] = {
            "reports": ";".join(m.reports), "backend": m.backend, "kernel": m.kernel,
            "vendor": m.vendor, "rung": m.rung if m.rung is not None else "",
            "params": " ".join(f"{k}={v}" for k, v in m.params.items()), "m": m.m, "n": m.n,
            "k": m.k, "batch": m.batch, "dtype": m.dtype, "status": m.status,
            "gflops": m.gflops if m.gflops is not None else "",
            "median_s": s.median if s else "", "min_s": s.min if s else "",
            "q1_s": s.q1 if s else "", "q3_s": s.q3 if s else "", "max_s": s.max if s else "",
            "n_samples": len(m.samples), "first_s": m.first_s if m.first_s is not None else "",
            "method": m.method, "flushed": m.flushed, "reason": m.reason,
            "sources": ";".join(m.sources),
        }
        w.writerow([row[f] for f in CSV_FIELDS])
    return buf.getvalue()


def render(results: Results, fmt: str, reports: Iterable[str] | None = None) -> str:
    """``results`` in format ``fmt``, holding only ``reports`` (default: all)."""
    if fmt == "md":
        return to_markdown(results, reports)
    chosen = results.select(None if reports is None else list(reports))
    if fmt == "csv":
        return to_csv(chosen)
    if fmt == "json":
        return chosen.to_json() + "\n"
    raise InvalidValueError(f"unknown format {fmt!r}; choose md, csv or json")


def print_rich(results: Results, reports: Iterable[str] | None = None, console: Any = None) -> None:
    """The tables in the terminal (FAILED in red, the vendor row in bold)."""
    from rich.markup import escape
    from rich.table import Table as RichTable

    if console is None:
        from tilegemm.console import console as make_console

        console = make_console()
    for line in header_lines(results):
        console.print(f"[dim]{escape(line)}[/]")
    for t in tables(results, reports):
        rt = RichTable(title=escape(t.title), title_justify="left")
        for i, col in enumerate(t.columns):
            rt.add_column(col, justify="left" if i < t.text_columns else "right", overflow="fold")
        for row in t.rows:
            rt.add_row(*[f"[bold red]{c}[/]" if c == FAILED else escape(c) for c in row])
        console.print(rt)
        for note in t.notes:
            style = "red" if note.startswith(FAILED) else "dim"
            console.print(f"  [{style}]{escape(note)}[/]", highlight=False)
