"""Search rungs' parameters on this device, verify every candidate, cache the fastest.

Each candidate is checked against the float64 reference before it is timed (device-side
timing through the backend, median of --repeat launches); the best per rung is written to
the tuning cache (``--show`` lists it, ``--clear`` deletes it), which ``kernel="auto"``
then uses for this device, dtype and shape bucket (M, N, K rounded up to powers of two).
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

from tilegemm.commands._console import console as _console
from tilegemm.commands._params import (
    add_device_argument,
    add_shape_arguments,
    check_fits_in_memory,
    check_verification_fits,
    device_target,
    given_options,
    unwritable,
)
from tilegemm.errors import InvalidValueError
from tilegemm.registry import BACKENDS

HELP = "search a kernel's parameters for this device and cache the best"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="auto", choices=("auto", *BACKENDS),
                        help="whose rungs to tune, on its default device "
                             "('auto': the best usable backend here)")
    add_device_argument(parser)
    parser.add_argument("--kernel", action="append", default=None,
                        help="rung to tune (repeatable; default: every rung with parameters)")
    add_shape_arguments(parser, 4096, 0,
                        ("float32", "float64", "int32", "int64", "float16", "bfloat16"),
                        "element type (int32/int64: the CPU and OpenCL rungs that compute "
                        "them; float16/bfloat16: the tensor-core rungs, CUDA)")
    parser.add_argument("--precision", default="ieee", choices=("ieee", "tf32", "3xtf32"),
                        help="float32 only: tf32/3xtf32 tune the tensor-core rungs at that "
                             "precision (their precision parameter held fixed); the result "
                             "serves matmul(..., precision=) on this device")
    parser.add_argument("--strategy", default="random", choices=("exhaustive", "random"),
                        help="the order candidates are tried in, up to --budget: a seeded "
                             "shuffle (random) or the search space's own order (exhaustive)")
    parser.add_argument("--budget", type=int, default=40,
                        help="candidates to run per rung (0: all; on the CPU thousands, "
                             "of which rung blocked compiles one per register tile, 16 a "
                             "dtype, the others loading that code: hours)")
    parser.add_argument("--seed", type=int, default=0, help="random strategy and operand seed")
    parser.add_argument("--repeat", type=int, default=5, help="timed launches per candidate")
    parser.add_argument("--max-call-seconds", type=float, default=5.0, metavar="S",
                        help="skip a candidate predicted (from timing it on a small problem "
                             "first) to take longer per call; 0: no limit")
    parser.add_argument("--no-register-check", action="store_true",
                        help="CUDA: do not reject candidates that spill or overflow registers")
    parser.add_argument("--dry-run", action="store_true", help="do not write the cache")
    parser.add_argument("--show", action="store_true", help="list the tuning cache and exit")
    parser.add_argument("--clear", action="store_true", help="delete the tuning cache and exit")


def run(args: argparse.Namespace) -> int:
    from tilegemm.tune import cache

    if args.show and args.clear:
        raise InvalidValueError("--show lists the tuning cache and --clear deletes it: "
                                "give one of them")
    if args.show or args.clear:
        _refuse_search_options(args)
    if args.show:
        return _show(cache)
    if args.clear:
        path = cache.cache_path()
        print(f"{'removed' if cache.clear() else 'no cache at'} {path}")
        return 0
    return _tune(args)


def _refuse_search_options(args: argparse.Namespace) -> None:
    """--show and --clear act on the whole cache: options of a search given with them
    (--m 64 to see one size's entries, say) would be silently ignored, so they are refused."""
    given = given_options(args, exclude=frozenset({"show", "clear"}))
    if given:
        what = "lists" if args.show else "deletes"
        raise InvalidValueError(
            f"--{'show' if args.show else 'clear'} {what} the whole tuning cache, for every "
            f"backend, device and size; {', '.join(given)} would change nothing: leave "
            f"{'it' if len(given) == 1 else 'them'} out")


def _show(cache) -> int:  # noqa: ANN001 - the module
    """The cache grouped by device and dtype, one entry a line: readable at 80 columns."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", cache.TuneCacheWarning)
        entries = cache.load()
    for w in seen:  # one line each, not Python's warning with its source line
        print(f"warning: {w.message}")
    print(f"tuning cache: {cache.cache_path()} "
          f"({len(entries)} entr{'y' if len(entries) == 1 else 'ies'})")
    group = None
    for e in sorted(entries, key=lambda e: (e.backend, e.device, e.dtype, e.bucket, -e.gflops)):
        if (e.backend, e.device, e.arch, e.dtype) != group:
            group = (e.backend, e.device, e.arch, e.dtype)
            print(f"\n{e.backend} on {e.device}" + (f" ({e.arch})" if e.arch else "")
                  + f", {e.dtype}:")
        shape = "x".join(map(str, e.shape[:3])) + (f" batch {e.shape[3]}"
                                                     if len(e.shape) > 3 and e.shape[3] else "")
        params = " ".join(f"{k}={v}" for k, v in e.params.items())
        print(f"  sizes near {','.join(map(str, e.bucket))}: {e.kernel} {params}".rstrip())
        # entries that differ only in precision serve different calls: say which is which
        at = f" at precision={e.precision}" if e.precision != "ieee" else ""
        print(f"      {e.gflops:.1f} GFLOP/s{at}, measured at {shape}"
              + (f"; for kernel={e.kernel!r} only" if e.named_only else ""))
    return 0


# Above this many candidates of one rung, --budget 0 says up front how many will run.
ALL_CANDIDATES_NOTE = 100


def _tune(args: argparse.Namespace) -> int:
    import numpy as np
    from rich.progress import Progress
    from rich.table import Table

    from tilegemm.api import choose_backend
    from tilegemm.problem import describe
    from tilegemm.tune import cache, space, strategies
    from tilegemm.tune.select import device_id, untuned_choice

    for name in ("m", "n", "k"):  # an empty product has nothing to time
        if getattr(args, name) < 1:
            raise InvalidValueError(f"--{name} must be >= 1 (a product to time), "
                                    f"got {getattr(args, name)}")
    for name in ("batch", "budget", "max_call_seconds", "seed"):
        value = getattr(args, name)
        if not value >= 0:  # NaN too
            raise InvalidValueError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    if args.repeat < 1:
        raise InvalidValueError("--repeat must be >= 1 (the launches each candidate is "
                                "timed on)")
    dtype = np.dtype(args.dtype)
    precision = getattr(args, "precision", "ieee")
    if precision != "ieee" and dtype != np.float32:
        raise InvalidValueError(f"--precision {precision} applies to --dtype float32, not "
                                f"{dtype.name} (float16/bfloat16 have one tensor-core mode; "
                                "leave --precision ieee)")
    probe = np.zeros((1, 1), dtype=dtype)
    # Steered as matmul is: by --device, and by one named rung (--kernel shared: OpenCL's
    # where there is no GPU).
    one = args.kernel[0] if args.kernel and len(set(args.kernel)) == 1 else "auto"
    backend = choose_backend(args.backend, [describe(probe, "a"), describe(probe, "b")],
                             args.device, one)
    target = device_target(backend, args.device, args.backend)
    dev = device_id(target)
    specs = tuning_specs(backend.name, dtype, precision, args.kernel)
    if not specs:
        have = sorted({b for b in BACKENDS if tuning_specs(b, dtype, precision)})
        raise InvalidValueError(f"no {backend.name} rung with parameters computes {dtype.name}"
                                + (f" at precision {precision}" if precision != "ieee" else "")
                                + f"; backends with one: {', '.join(have) or 'none'}"
                                + _computed_as(backend.name, dtype))
    # every candidate is checked against float64 NumPy, as run checks its product (a
    # product beyond memory was killed by the system while timing its smaller probes)
    check_fits_in_memory(args.m, args.n, args.k, args.batch, dtype.name)
    check_verification_fits(args.m, args.n, args.k, args.batch, dtype.name)
    prob = strategies.problem_for(args.m, args.n, args.k, dtype, args.batch)
    limits = target.limits  # the device's own, never a guess per backend
    writes = not args.dry_run and not target.simulated
    if writes:
        _check_writable(cache.cache_path())  # before a search whose results it would lose
    check = None if args.no_register_check else space.register_check(backend, target)
    console = _console()
    on = f"{target.name} ({target.arch})" if target.arch else target.name
    console.print(f"tuning on {on}: {args.m}x{args.n}x{args.k} {dtype.name}"
                  + (f" precision {precision}" if precision != "ieee" else "")
                  + f"{f' batch {args.batch}' if args.batch else ''}, strategy {args.strategy}")
    # Five columns, the outcomes in words: readable in an 80-column terminal.
    summary = Table("kernel", "candidates", "best params", "ms", "GFLOP/s")
    for column in summary.columns:
        column.overflow = "fold"
    # The baseline: what kernel="auto" runs untuned, timed first. A tuned entry is what
    # kernel="auto" then runs (the fastest entry wins), so one that does not beat the
    # baseline is kept for calls naming its rung only; the baseline itself is an entry only
    # when its rung is being tuned.
    baseline = baseline_choice(backend, target, dtype, precision, specs,
                               lambda b, d, t: untuned_choice(b, d, t, prob), prob)
    # Launch strategies (searched=False, e.g. split-K) stay at the baseline's value.
    jobs = [(spec, space.candidates(spec, dtype, limits, precision,
                                    baseline[1] if baseline and baseline[0] is spec else None,
                                    target.kind),
             False) for spec in specs]
    if baseline is not None:
        jobs.insert(0, (baseline[0], [baseline[1]], True))
    if not args.budget:
        for spec, cands, is_baseline in jobs:
            if not is_baseline and len(cands) > ALL_CANDIDATES_NOTE:
                console.print(f"note: --budget 0 runs all {len(cands)} candidates of "
                              f"{spec.name}, each built (compiled, or loaded where an "
                              "earlier one compiled the same code) and timed: seconds to "
                              "tens of seconds each; --budget N tries N of them",
                              highlight=False)
    # What this device's cache holds now for each rung at this size is timed again here, in
    # the same conditions: a new search replaces it only if it beats it in this run (it was
    # overwritten by whatever a shorter search found, unmeasured against it).
    held = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cache.TuneCacheWarning)  # reported by --show
        entries = cache.load()
    for spec in specs:
        entry = cache.lookup(entries, dev, dtype.name, args.m, args.n, args.k, spec.name,
                             precision)
        if (entry is not None and entry.device == dev.name and spec.is_valid(entry.params)
                and (baseline is None or entry.params != baseline[1])):
            held[spec.name] = entry
            ordered = {p.name: entry.params[p.name] for p in spec.params}  # the rung's order
            jobs.insert(1 if baseline is not None else 0, (spec, [ordered], "held"))
    max_call = args.max_call_seconds or None
    untuned: tuple[object, float] | None = None  # (the baseline's rung, its GFLOP/s)
    # rung -> (spec, trial, GFLOP/s, the row it came from)
    best_of: dict[str, tuple[object, object, float, str]] = {}
    notes: list[str] = []
    failed: list[str] = []  # why candidates did not run, for a search that ran none
    too_slow: list[float] = []  # predicted seconds per call of candidates not run
    wrong = False
    for spec, cands, is_baseline in jobs:
        budget = args.budget or None
        total = min(len(cands), budget) if budget else len(cands)
        # A progress bar only on a terminal: elsewhere (CI logs, pipes) it leaves blank lines.
        with Progress(console=console, transient=True,
                      disable=not console.is_terminal) as bar:
            task = bar.add_task(spec.name, total=total)
            result = strategies.tune(
                backend, spec, prob, cands, strategy=args.strategy, budget=budget,
                seed=args.seed, repeats=args.repeat, resource_check=check, target=target,
                progress=lambda t, task=task: bar.advance(task) if t.status != "rejected"
                else None, max_call_s=max_call,
            )
        label = {True: f"{spec.name} (auto, untuned)",
                 "held": f"{spec.name} (cached before)"}.get(is_baseline, spec.name)
        counts = {s: sum(t.status == s for t in result.trials)
                  for s in ("ok", "wrong", "rejected", "error", "slow")}
        tried = f"{len(result.trials)}: " + ", ".join(
            f"{n} {status}" for status, n in counts.items() if n) if result.trials else "0"
        slow = [t.predicted for t in result.trials if t.status == "slow"]
        too_slow.extend(slow)
        if slow:
            notes.append(f"{label}: {len(slow)} candidate{'s' if len(slow) > 1 else ''} not "
                         f"run, predicted to take {min(slow):.3g} s or more per call, over "
                         f"the {max_call:g} s limit (--max-call-seconds)")
        best = result.best
        if best is None:
            summary.add_row(label, tried, "-", "-", "-")
            reasons = list(dict.fromkeys(t.detail for t in result.trials
                                         if t.status != "slow" and t.detail))
            if reasons:  # why, in the trials' own words (they were dropped)
                failed.extend(reasons)
                more = f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else ""
                notes.append(f"{label}: no candidate ran: {reasons[0]}{more}")
            wrong = wrong or any(t.status == "wrong" for t in result.trials)
            continue
        gflops = result.gflops(best)
        summary.add_row(label, tried, " ".join(f"{k}={v}" for k, v in best.params.items()),
                        f"{best.seconds * 1e3:.3f}", f"{gflops:.1f}")
        if is_baseline is True:
            untuned = (spec, gflops)
            if spec not in specs:
                continue  # timed to compare with, not tuned here: no entry of its own
        kept = best_of.get(spec.name)
        if kept is None or gflops > kept[2]:  # a rung's search may miss its untuned choice
            best_of[spec.name] = (spec, best, gflops, label)
    stored = 0
    for spec, best, gflops, row in best_of.values():
        if row != spec.name:  # the search's own best was slower than that row's
            kept_before = row.endswith("(cached before)")
            notes.append(f"{spec.name}: {'kept' if kept_before else 'cached'} the parameters "
                         f"of row '{row}' ({gflops:.1f} GFLOP/s), faster in this run than the "
                         "search's best" + ("" if writes else " (not written)"))
        named_only = (untuned is not None and untuned[0] not in specs and not spec.precisions
                      and gflops <= untuned[1])
        if named_only:
            # Kept for calls naming the rung (matmul(kernel="shared") runs its tuned
            # parameters), but never for kernel="auto", whose untuned choice is faster.
            # Entries of rungs with a precision parameter serve only calls naming them.
            notes.append(f"{spec.name} is for kernel={spec.name!r} only: at {gflops:.1f} "
                         "GFLOP/s it is slower than what kernel='auto' runs untuned "
                         f"({untuned[0].name}, {untuned[1]:.1f} GFLOP/s), which it does not "
                         "replace")
        if writes:
            stored += 1
            cache.record(cache.Entry(
                backend=backend.name, device=dev.name, arch=dev.arch, dtype=dtype.name,
                bucket=cache.shape_bucket(args.m, args.n, args.k), kernel=spec.name,
                params=best.params, seconds=best.seconds, gflops=gflops,
                shape=[args.m, args.n, args.k, args.batch], precision=precision,
                named_only=named_only))
    console.print(summary)
    for note in notes:
        console.print(f"note: {note}", highlight=False)
    if not args.dry_run:
        console.print(f"cache: {cache.cache_path()} ({stored} entr{'y' if stored == 1 else 'ies'} "
                      "written)", highlight=False)
    if not best_of and untuned is None and (wrong or failed or too_slow):  # none ran
        if wrong:
            return 1  # a kernel computed a wrong result (the notes say which)
        if failed:
            raise InvalidValueError(f"no candidate could run at this size: {failed[0]}")
        # nothing measured, nothing written: not a success a script should go on from
        raise InvalidValueError(
            f"no candidate ran: each was predicted to take {min(too_slow):.3g} s or more per "
            f"call, over the {max_call:g} s limit; raise --max-call-seconds or tune a "
            "smaller size")
    return 0


def _check_writable(path: Path) -> None:
    """Refuse, before any timing, a tuning cache that cannot be written."""
    from tilegemm.tune.cache import cache_dir

    why = unwritable(path)
    if why:
        where = ("TILEGEMM_CACHE_DIR" if os.environ.get("TILEGEMM_CACHE_DIR")
                 else "the user cache directory")
        raise InvalidValueError(
            f"the tuning cache {path} cannot be written ({why}; {where} is "
            f"{cache_dir()}): point TILEGEMM_CACHE_DIR at a writable directory, or pass "
            "--dry-run to tune without keeping the results")


def _computed_as(backend: str, dtype, spec=None) -> str:  # noqa: ANN001
    """Advice for a dtype that no rung of the backend takes, which its calls compute in
    another (float16 on the CPU, in float32): such calls use that dtype's tuning, so that
    is the one to tune. Nothing where a rung takes it (CUDA's tensor-core rungs)."""
    from tilegemm.problem import COMPUTED_AS
    from tilegemm.registry import specs_for

    wider = COMPUTED_AS.get(dtype.name, dtype.name)
    rungs = [spec] if spec is not None else [s for s in specs_for(backend) if s.params]
    if (wider == dtype.name or any(s.supports(dtype) for s in specs_for(backend))
            or not any(s.supports(wider) for s in rungs)):
        return ""
    return (f" ({dtype.name} products on {backend} are computed in {wider} and use its "
            f"tuning: pass --dtype {wider})")


def tuning_specs(backend: str, dtype, precision: str,  # noqa: ANN001 - a NumPy dtype
                 kernels: list[str] | None = None) -> list:
    """The rungs a tuning run covers: those that compute ``dtype`` at ``precision`` (the
    IEEE rungs for "ieee" float32/float64; the tensor-core rungs for "tf32", "3xtf32" and
    16-bit dtypes), or the named ``kernels`` after checking that they can."""
    from tilegemm import registry
    from tilegemm.tune import space

    if kernels:
        specs = [registry.get(k, backend) for k in dict.fromkeys(kernels)]  # each rung once
        for spec in specs:
            if not spec.supports(dtype):
                raise InvalidValueError(f"kernel {spec.name!r} does not support {dtype.name}; "
                                        f"it supports {', '.join(spec.dtypes)}"
                                        + _computed_as(backend, dtype, spec))
            if space.precision_pin(spec, dtype, precision) is False:
                can = ", ".join(spec.precisions) or "ieee"
                raise InvalidValueError(f"kernel {spec.name!r} cannot compute {dtype.name} at "
                                        f"precision {precision}; pass --precision one of {can}")
        return specs
    return [s for s in registry.specs_for(backend) if s.params and s.supports(dtype)
            and space.precision_pin(s, dtype, precision) is not False]


def baseline_choice(backend, target, dtype, precision: str, specs: list,  # noqa: ANN001
                    untuned, prob=None):  # noqa: ANN001, ANN201
    """What the call runs untuned, timed first: ``kernel="auto"``'s IEEE choice, or for a
    tensor-core run the rung kernel="auto" runs on this device at its defaults, precision
    parameter pinned, fitted to ``prob``'s shape as a call fits them (the rung's
    ``shape_params``)."""
    from tilegemm.precision import auto_tensor_spec
    from tilegemm.tune import space

    tensor = [s for s in specs if s.precisions]
    if not tensor or any(not s.precisions for s in specs):
        return untuned(backend, dtype.name, target)
    top = auto_tensor_spec(tensor, target.known_capability)
    pin = space.precision_pin(top, dtype, precision)
    try:
        resolved = backend.resolve(top, {pin[0]: pin[1]} if pin else {}, target)
        backend.check_limits(top, resolved, dtype, target)
    except (ValueError, TypeError):
        return None
    if prob is None:
        return top, resolved
    from tilegemm.tune.select import for_shape

    return for_shape(backend, target, prob, top, resolved, "")[:2]
