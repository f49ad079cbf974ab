"""Reproduce the optimisation note's performance tables on this machine's devices, against
the vendor BLAS.

Reports (``--reports``, all by default): ``compile`` (first call vs steady, as the Numba ROC
example prints them), ``sizes`` (GFLOP/s over sizes × block sizes, from the optimisation
note), ``rsweep`` (outputs per thread, also the note's) and ``ladder`` (every rung at its
defaults, and the rung and parameters ``kernel="auto"`` runs, as a share of cuBLAS / CLBlast /
NumPy). Every kernel is verified before it is timed; a wrong one shows
FAILED. The default is a quick run at small sizes; ``--full`` runs the note's sizes (8…4096,
ladder at 1024³ and 4096³).

Exit status 1 if any kernel FAILED.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tilegemm.commands._params import (
    check_fits_in_memory,
    check_verification_fits,
    given_options,
    unwritable,
)
from tilegemm.errors import InvalidValueError, UnavailableError
from tilegemm.registry import BACKENDS

if TYPE_CHECKING:
    from tilegemm.bench.sweeps import Settings

HELP = "the optimisation note's tables on this device vs the vendor library (tables, files, plots)"
FORMATS = ("md", "csv", "json")


def _int_list(text: str) -> tuple[int, ...]:
    """``8,16,32`` or a power-of-two range ``8..4096``."""
    text = text.strip()
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            if lo < 1 or hi < lo:
                raise ValueError
            out, v = [], lo
            while v <= hi:
                out.append(v)
                v *= 2
            return tuple(out)
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list like 8,16,32 or a range like 8..4096") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive integers")
    return values


def _reports(text: str) -> tuple[str, ...]:
    from tilegemm.bench.sweeps import REPORTS

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in REPORTS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown report(s) {', '.join(bad) or text!r}; choose from {', '.join(REPORTS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to run")
    prof = what.add_mutually_exclusive_group()
    prof.add_argument("--quick", action="store_true",
                      help="small sizes, short budgets (the default; what `make demo` runs)")
    prof.add_argument("--full", action="store_true",
                      help="the optimisation note's sizes: 8…4096, ladder at 1024³ and "
                           "4096³, R sweep at 1024³, 1 s per case")
    what.add_argument("--backend", action="append", choices=BACKENDS, dest="backends",
                      help="backend to run (repeatable); default: every usable one, the CUDA "
                           "simulator excluded")
    what.add_argument("--include-simulated", action="store_true",
                      help="also run simulated backends (numba's CUDA simulator: tiny sizes!)")
    what.add_argument("--reports", type=_reports, metavar="LIST",
                      help="comma list of compile,ladder,sizes,rsweep (default: all)")
    what.add_argument("--sizes", type=_int_list, metavar="LIST",
                      help="sizes M=N=K of the size table, e.g. 8..4096 or 64,128,256")
    what.add_argument("--blocks", type=_int_list, metavar="LIST",
                      help="block/tile sizes for rungs with a BLOCK or TILE parameter "
                           "(default 8,16,32)")
    what.add_argument("--ladder-sizes", type=_int_list, metavar="LIST",
                      help="size(s) of the ladder table")
    what.add_argument("--r-size", type=int, metavar="N", help="size of the R sweep")
    what.add_argument("--compile-size", type=int, metavar="N",
                      help="size of the first-call vs steady table (the Numba ROC example "
                           "used 256)")
    what.add_argument("--dtype", default="float32",
                      choices=("float32", "float64", "float16", "bfloat16"),
                      help="float16/bfloat16: the tensor-core rungs against cuBLAS FP16/BF16 "
                           "(PyTorch). The floating-point types with a vendor baseline; "
                           "'tilegemm run --dtype' runs any type matmul takes")
    what.add_argument("--precision", default="ieee", choices=("ieee", "tf32", "3xtf32"),
                      help="float32: tf32/3xtf32 run the tensor-core rungs, against cuBLAS "
                           "TF32 (CuPy/PyTorch, TF32 enabled) and FP32 SGEMM respectively")

    how = parser.add_argument_group("how to time")
    how.add_argument("--budget", type=float, metavar="S",
                     help="wall-clock seconds of steady repeats per case")
    how.add_argument("--min-reps", type=int, metavar="N",
                     help="timed repeats per case at least, unless 4x the budget has passed")
    how.add_argument("--max-reps", type=int, metavar="N",
                     help="timed repeats per case at most, even with budget left")
    how.add_argument("--warmup", type=int, metavar="N", help="untimed launches after the first")
    how.add_argument("--max-call-seconds", type=float, metavar="S",
                     help="skip a case predicted (from a smaller size) to take longer per call; "
                          "0: no limit, as in tune")
    how.add_argument("--no-rivals", action="store_true",
                     help="do not time Triton's matmul beside the vendor library (it compiles "
                          "and autotunes 16 configurations per shape class on first use)")
    how.add_argument("--flush-l2", action="store_true",
                     help="evict the cache between repeats (CUDA: write twice the L2 size)")
    parser.set_defaults(run_options=[a.dest for a in (*what._group_actions,
                                                      *how._group_actions)])

    out = parser.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS,
                     help="file format for --output; without --output, print it instead of "
                          "the terminal tables")
    out.add_argument("--output", "-o", metavar="PATH",
                     help="write the results to PATH, in --format or else the format its "
                          "extension names (.json, .md, .csv)")
    out.add_argument("--plot", metavar="FILE.png",
                     help="plot GFLOP/s vs size (the format from the extension: .png, .svg, "
                          ".pdf...)")
    out.add_argument("--save", metavar="DIR",
                     help="write DIR/<device>-<date>.json and .md (the committed form), and "
                          ".png when the sizes report ran; -2, -3... after the date "
                          "where a run of that day was saved already (nothing is "
                          "overwritten)")
    out.add_argument("--from-json", metavar="FILE",
                     help="render a saved results file instead of running anything")
    out.add_argument("--quiet", "-q", action="store_true", help="no terminal tables or progress")


def settings_from(args: argparse.Namespace) -> Settings:
    from dataclasses import replace

    from tilegemm.bench.sweeps import Settings

    settings = Settings.full() if args.full else Settings.quick()
    over = {}
    for name, attr in (("reports", "reports"), ("sizes", "sizes"), ("blocks", "blocks"),
                       ("ladder_sizes", "ladder_sizes"), ("r_size", "r_size"),
                       ("compile_size", "compile_size"), ("max_call_seconds", "max_call_s")):
        value = getattr(args, name, None)
        if value is not None:
            over[attr] = value
    for name in ("r_size", "compile_size"):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            raise InvalidValueError(f"--{name.replace('_', '-')} must be >= 1")
    # in the command line's words (the timing policy's own check names its fields)
    for name, least, strict in (("budget", 0, True), ("warmup", 0, False),
                                ("max_call_seconds", 0, False)):
        value = getattr(args, name, None)
        # NaN fails both comparisons; infinity is refused too: no sample count follows from
        # an infinite budget, and the results file must stay strict JSON
        if value is not None and not (math.isfinite(value) and (value > least if strict
                                                                else value >= least)):
            kind = "a finite number " if isinstance(value, float) else ""
            raise InvalidValueError(f"--{name.replace('_', '-')} must be {kind}"
                                    f"{'>' if strict else '>='} {least}, got {value}")
    over["dtype"] = args.dtype
    precision = getattr(args, "precision", "ieee")
    if precision != "ieee" and args.dtype != "float32":
        raise InvalidValueError(
            f"--precision {precision} applies to --dtype float32 only, not {args.dtype}"
            + (f" ({args.dtype} runs on tensor cores in its one mode: leave --precision at "
               "ieee)" if args.dtype in ("float16", "bfloat16") else ""))
    over["precision"] = precision
    if getattr(args, "no_rivals", False):
        over["rivals"] = False
    pol = {}
    for name, attr in (("budget", "budget_s"), ("min_reps", "min_reps"),
                       ("max_reps", "max_reps"), ("warmup", "warmup")):
        if getattr(args, name, None) is not None:
            pol[attr] = getattr(args, name)
    if args.flush_l2:
        pol["flush"] = True
    if pol:
        if "min_reps" in pol and "max_reps" not in pol:
            pol["max_reps"] = max(pol["min_reps"], settings.policy.max_reps)
        if "max_reps" in pol and "min_reps" not in pol:  # --max-reps 3 alone: at most 3
            pol["min_reps"] = min(pol["max_reps"], settings.policy.min_reps)
        if not 0 <= pol.get("min_reps", settings.policy.min_reps) <= pol.get(
                "max_reps", settings.policy.max_reps):
            raise InvalidValueError("--min-reps and --max-reps: need 0 <= --min-reps <= "
                                    "--max-reps (0: verify and first call only)")
        over["policy"] = replace(settings.policy, **pol)
    return replace(settings, **over)


def choose_backends(args: argparse.Namespace, settings: Settings | None = None,
                    ) -> tuple[list[str], list[str]]:
    """(backends to run, lines explaining the ones left out).

    A backend with no rung for the dtype and precision of ``settings`` (float16 on the CPU,
    TF32 without tensor cores) is refused when named, left out with a line otherwise; when
    none is left, the request is refused naming the backends that could run it, rather than
    running nothing.
    """
    from tilegemm.backends import get_backend
    from tilegemm.bench.sweeps import rungs_for

    asked = list(dict.fromkeys(args.backends or BACKENDS))
    run, left = [], []
    for name in asked:
        status = get_backend(name).status()
        if not status.usable or status.default_problem:  # bench runs the default device
            why = status.default_problem or status.reason
            if args.backends:
                raise UnavailableError(f"backend {name!r} is not usable here: {why}")
            left.append(f"{name}: not usable ({why})")
        elif status.simulated and not args.include_simulated:
            left.append(f"{name}: {status.reason} — skipped (simulated; --include-simulated "
                        "runs it, at tiny sizes only)")
        else:
            run.append(name)
    if not run:
        raise UnavailableError("no backend to benchmark: " + "; ".join(left))
    if settings is None:
        return run, left
    what = settings.dtype + ("" if settings.precision == "ieee"
                             else f" at precision {settings.precision}")
    cannot = [name for name in run if not rungs_for(name, settings.dtype, settings.precision)]
    if cannot and (args.backends or len(cannot) == len(run)):
        have = [b for b in BACKENDS if rungs_for(b, settings.dtype, settings.precision)]
        raise InvalidValueError(f"no {' or '.join(cannot)} rung computes {what}; backends "
                                f"with one: {', '.join(have) or 'none'}")
    left += [f"{name}: no rung computes {what}" for name in cannot]
    return [name for name in run if name not in cannot], left


def check_reports(args: argparse.Namespace, settings: Settings, backends: list[str]) -> None:
    """Refuse, before anything runs, what would print a report with nothing in it: --blocks
    values no rung of these backends takes (their rows were dropped without a word), and
    the R sweep named alone where no rung has an outputs-per-thread parameter."""
    from tilegemm.bench.reports.rsweep import OUTPUTS_PARAM
    from tilegemm.bench.reports.sizes import block_param
    from tilegemm.bench.sweeps import rungs_for

    # an option for a report --reports leaves out changed nothing, without a word
    for option, report in (("sizes", "sizes"), ("blocks", "sizes"),
                           ("ladder_sizes", "ladder"), ("r_size", "rsweep"),
                           ("compile_size", "compile")):
        if getattr(args, option, None) is not None and report not in settings.reports:
            raise InvalidValueError(
                f"--{option.replace('_', '-')} applies to the {report!r} report, which "
                f"--reports leaves out; add {report} to --reports or drop the option")
    # every size a report runs is allocated and checked against float64 NumPy: one that
    # cannot be was an error after the cases before it, whose results were lost
    for report, option, sizes in (("sizes", "--sizes", settings.sizes),
                                  ("ladder", "--ladder-sizes", settings.ladder_sizes),
                                  ("rsweep", "--r-size", (settings.r_size,)),
                                  ("compile", "--compile-size", (settings.compile_size,))):
        if report in settings.reports and sizes:
            n = max(sizes)  # the largest says it all
            check_fits_in_memory(n, n, n, 0, settings.dtype, option)
            check_verification_fits(n, n, n, 0, settings.dtype, option)
    specs = [s for be in backends for s in rungs_for(be, settings.dtype, settings.precision)]
    if args.blocks is not None and "sizes" in settings.reports:
        taken = {c for s in specs if (name := block_param(s))
                 for p in s.params if p.name == name for c in p.choices}
        unused = [b for b in args.blocks if b not in taken]
        if unused:
            raise InvalidValueError(
                f"--blocks {','.join(map(str, unused))}: no {'/'.join(backends)} rung takes "
                f"that block size; they take {', '.join(map(str, sorted(taken))) or 'none'}")
    if (args.reports is not None and "rsweep" in settings.reports
            and not any(p.name == OUTPUTS_PARAM for s in specs for p in s.params)):
        have = [b for b in BACKENDS if any(p.name == OUTPUTS_PARAM for s in rungs_for(
            b, settings.dtype, settings.precision) for p in s.params)]
        raise InvalidValueError(
            f"--reports rsweep: no {'/'.join(backends)} rung has an outputs-per-thread "
            f"parameter ({OUTPUTS_PARAM}); backends with one: {', '.join(have) or 'none'}")


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse file names the run could not write in the asked format, before it runs (the
    files are written last): a plot whose extension is no image format, and an --output
    whose format neither --format nor its extension tells."""
    if args.plot:
        from tilegemm.bench.plot import check_plot_path

        check_plot_path(args.plot)
    # before anything is timed: the files are written last, and a --full run takes hours
    for option, path, folder in (("--output", args.output, False), ("--plot", args.plot, False),
                                 ("--save", args.save, True)):
        why = unwritable(Path(path), folder) if path else None
        if why:
            raise InvalidValueError(f"{option} {path}: {why}")
    named = output_format(args.output) if args.output else None
    if args.format and named and named != args.format:
        raise InvalidValueError(f"--output {args.output} names {named} by its extension, but "
                                f"--format is {args.format}: give one of them, or make them "
                                "agree")
    if args.output and not args.format and named is None:
        suffix = Path(args.output).suffix
        raise InvalidValueError(
            f"--output {args.output}: " + (f"'{suffix}' names no results format"
                                           if suffix else "the name has no extension")
            + "; name it .json, .md or .csv, or pass --format")


def output_format(path: str) -> str | None:
    """The --output format its extension names (.json, .md, .csv), else None."""
    return {f".{f}": f for f in FORMATS}.get(Path(path).suffix.lower())


def run(args: argparse.Namespace) -> int:
    from tilegemm.bench.results import Results

    check_outputs(args)
    if args.quiet and not (args.format or args.output or args.save or args.plot):
        raise InvalidValueError("--quiet prints no tables, and no --output, --save, --plot or "
                                "--format keeps the results: the run would be thrown away")
    if args.from_json:
        # a saved run is rendered as it was: options of a new run would be ignored
        given = given_options(args, set(getattr(args, "run_options", [])) - {"reports"})
        if given:
            flags = ", ".join(given)
            raise InvalidValueError(f"--from-json renders a saved run as it was; {flags} "
                                    "would change nothing: leave them out, or run anew "
                                    "(--reports chooses which of its reports to show)")
        results = Results.load(args.from_json)
        if args.plot and not results.backends("sizes"):
            raise InvalidValueError(f"--plot: {args.from_json} has no 'sizes' report to plot")
        if args.reports:
            _check_plot(args, args.reports)
        _emit(results, args)
        return 0

    from tilegemm.bench.sweeps import run_bench
    from tilegemm.commands._console import console

    settings = settings_from(args)
    _check_plot(args, settings.reports)  # before anything runs
    backends, left = choose_backends(args, settings)
    check_reports(args, settings, backends)
    err = console(stderr=True)
    if not args.quiet:
        shown = settings.dtype + ("" if settings.precision == "ieee"
                                  else f", precision {settings.precision}")
        err.print(f"[dim]benchmarking {', '.join(backends)} ({settings.profile}, "
                  f"{shown}); reports: {', '.join(settings.reports)}[/]")
        for line in left:
            err.print(f"[dim]  {line}[/]", highlight=False)
    if args.quiet:
        results = run_bench(backends, settings)
    else:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      console=err, transient=True) as bar:
            task = bar.add_task("planning", total=None)

            def progress(done: int, total: int, case) -> None:
                bar.update(task, completed=done, total=total,
                           description=f"[{case.report}] {case.label}")

            results = run_bench(backends, settings, progress=progress)
    _emit(results, args)
    if results.failed:
        print(f"{len(results.failed)} case(s) FAILED verification or raised; see the notes "
              "under the tables", file=sys.stderr)
        return 1
    return 0


def _emit(results, args: argparse.Namespace) -> None:
    from tilegemm.bench import report

    fmt = args.format
    from tilegemm.bench.sweeps import REPORTS

    asked = results.meta.get("settings", {}).get("reports", REPORTS)
    if getattr(args, "from_json", None) and args.reports:  # a saved run: those of its reports
        missing = [r for r in args.reports if r not in asked]
        if missing:
            raise InvalidValueError(f"--reports {','.join(missing)}: {args.from_json} holds "
                                    f"only {', '.join(asked)}")
        asked = args.reports
    reports = [r for r in REPORTS if r in asked]
    if fmt and not args.output:
        sys.stdout.write(report.render(results, fmt, reports))
    elif not args.quiet:
        report.print_rich(results, reports)
    if args.output:
        path = Path(args.output)
        fmt = fmt or output_format(args.output) or "json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.render(results, fmt, reports))
        print(f"wrote {path}", file=sys.stderr)
    if args.plot:
        from tilegemm.bench.plot import plot_sizes

        print(f"wrote {plot_sizes(results.select(reports), args.plot)}", file=sys.stderr)
    if args.save:
        _save(results, Path(args.save), reports)


def _free_stem(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/name-2``, ``-3``... where a run already saved under it:
    a second run of the day once replaced the first one's JSON and Markdown and left its
    plot beside them, drawn from data no longer there."""
    taken = {p.name for p in folder.iterdir()}
    stem, n = name, 1
    while any(stem + ext in taken for ext in (".json", ".md", ".png")):
        n += 1
        stem = f"{name}-{n}"
    return folder / stem


def _check_plot(args: argparse.Namespace, reports: Sequence[str]) -> None:
    """--plot draws the size sweep: refused where ``reports`` leave it out."""
    if args.plot and "sizes" not in reports:
        raise InvalidValueError("--plot draws the 'sizes' report, which --reports leaves out; "
                                "add sizes to --reports or drop --plot")


def _save(results, folder: Path, reports: list[str]) -> None:
    from tilegemm.bench import report

    folder.mkdir(parents=True, exist_ok=True)
    stem = _free_stem(folder, results.default_stem())
    stem.with_suffix(".json").write_text(report.render(results, "json", reports))
    stem.with_suffix(".md").write_text(report.to_markdown(results, reports))
    written = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    if "sizes" in reports and results.backends("sizes"):  # the plot of the JSON beside it
        from tilegemm.bench.plot import plot_sizes

        written.append(plot_sizes(results.select(reports), stem.with_suffix(".png")))
    for p in written:
        print(f"wrote {p}", file=sys.stderr)
