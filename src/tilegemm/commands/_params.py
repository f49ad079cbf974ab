"""What several subcommands share: ``KEY=VALUE`` kernel parameters, shape and device
options, and checks of what was given and where results go."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tilegemm.errors import InvalidValueError

# Why most subcommands take fewer element types than ``run``: they work on the types rungs
# compute in; ``matmul`` computes the others (bool, int8, uint8, ...) in one of these.
KERNEL_TYPES_NOTE = ("the types rungs compute in; matmul computes bool and narrow or unsigned "
                     "integers in int32/int64 ('tilegemm run --dtype' runs any of them)")


def add_param_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "params", nargs="*", metavar="KEY=VALUE",
        help="kernel parameters, e.g. TILE=16 or BM=128 BN=128 (see 'tilegemm kernels')",
    )


def add_shape_arguments(parser: argparse.ArgumentParser, size: int, batch: int,
                        dtypes: tuple[str, ...], dtype_help: str,
                        metavar: str | None = None) -> None:
    """``--m --n --k --batch --dtype``: the product a subcommand runs, explains or tunes
    (``-m 1000`` as well as ``--m 1000``, as the sides are usually written)."""
    parser.add_argument("-m", "--m", type=int, default=size, help="rows of A and of the result")
    parser.add_argument("-n", "--n", type=int, default=size,
                        help="columns of B and of the result")
    parser.add_argument("-k", "--k", type=int, default=size,
                        help="the shared (contracted) dimension")
    parser.add_argument("--batch", type=int, default=batch,
                        help="batch count" + (" (0: a plain 2-D product)" if batch == 0 else ""))
    parser.add_argument("--dtype", default="float32", choices=dtypes, help=dtype_help,
                        metavar=metavar)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device``: what ``device=`` is to ``tilegemm.matmul``."""
    parser.add_argument(
        "--device", type=int, metavar="INDEX",
        help="the device to use, by its index in 'tilegemm info' (OpenCL and CUDA; default: "
             "the backend's default device, which PYOPENCL_CTX or CUDA_VISIBLE_DEVICES "
             "also choose)")


def device_target(backend, device: int | None, requested: str):  # noqa: ANN001, ANN201
    """The Target of ``--device`` on ``backend`` (its default device when None), refused in
    the command line's words where the backend has one device only."""
    if device is not None and not backend.accepts_device:
        chose = (f"--backend auto chose {backend.name!r}, which" if requested == "auto"
                 else f"backend {backend.name!r}")
        raise InvalidValueError(f"--device: {chose} has no device choice; --device picks a "
                                "device of --backend cuda or opencl")
    return backend.target(device)


def check_fits_in_memory(m: int, n: int, k: int, batch: int, dtype: str,
                         sizes: str = "--m/--n/--k") -> None:
    """Refuse, in one line, a product whose A, B or result this machine cannot allocate
    (``batch`` 0: a plain 2-D product), before any work starts. ``sizes``: the options
    that set the size, as the advice names them."""
    import numpy as np

    lead = (batch,) if batch else ()
    dt = np.dtype(dtype)
    more = " or --batch" if batch else ""
    for what, shape in (("A", lead + (m, k)), ("B", lead + (k, n)),
                        ("the result", lead + (m, n))):
        try:
            np.empty(shape, dt)  # not touched: only asks whether the memory exists
        except (MemoryError, ValueError):  # ValueError: beyond any array NumPy can describe
            gib = np.prod(shape, dtype=np.float64) * dt.itemsize / 2**30
            raise InvalidValueError(
                f"cannot allocate {what} of shape {shape} as {dt.name} ({gib:.1f} GiB) "
                f"on this machine; choose smaller {sizes}{more}") from None


def check_verification_fits(m: int, n: int, k: int, batch: int, dtype: str,
                            sizes: str = "--m/--n/--k") -> None:
    """Refuse, in one line, a product whose check against float64 NumPy would not fit in
    the memory available now (after the backend's own checks, which say more).

    Asking NumPy for the arrays alone (:func:`check_fits_in_memory`) is not enough: Linux
    promises memory it does not have, and the check holds the float64 reference, the error
    bound and their temporaries, about seven float64 arrays the size of the result. A
    32768 x 32768 float32 product (a 4 GiB result) was killed by the system, out of
    memory, instead of being refused."""
    import numpy as np

    from tilegemm.backends.cpu import available_memory

    dt = np.dtype(dtype)
    more = " or --batch" if batch else ""
    count = max(batch, 1)
    operands, result = count * (m * k + k * n), count * m * n
    # the arrays, the operands in float64 (and their magnitudes, for the bound), and the
    # reference, bound, error and comparison arrays in float64
    need = dt.itemsize * (operands + result) + 2 * (8 + dt.itemsize) * operands + 7 * 8 * result
    have = available_memory()
    if have is not None and need > have:
        raise InvalidValueError(
            f"running and checking {f'{batch} products of ' if batch else 'a '}"
            f"{m}x{n}x{k} in {dt.name} against float64 NumPy needs about "
            f"{need / 2**30:.1f} GiB; this machine has {have / 2**30:.1f} GiB available; "
            f"choose smaller {sizes}{more}")


def parse_params(items: list[str]) -> dict[str, int]:
    params: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidValueError(f"parameter {item!r} is not KEY=VALUE")
        key = key.strip()
        if not key.isupper():  # said here in the command line's words, not the API's
            raise InvalidValueError(f"parameter {key!r}: rung parameters are UPPER-CASE "
                                    f"(e.g. {key.upper()}={value}); 'tilegemm kernels' lists "
                                    "each rung's")
        try:
            number = int(value)
        except ValueError:
            raise InvalidValueError(f"parameter {key}: {value!r} is not an integer") from None
        if key in params and params[key] != number:  # which one was meant? ask, not guess
            raise InvalidValueError(f"parameter {key} is given twice ({key}={params[key]} and "
                                    f"{key}={number}); give it once")
        params[key] = number
    return params


def comma_params(text: str) -> dict[str, int]:
    """``BK=32,STAGES=3`` as parameters: argparse's ``type=`` for the benchmark scripts'
    ``--params`` (a malformed item is the parser's one-line error, not a traceback)."""
    try:
        return parse_params([item for item in text.split(",") if item])
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def given_options(args: argparse.Namespace, dests: set[str] | None = None,
                  exclude: frozenset[str] = frozenset()) -> list[str]:
    """The flags of the options (``dests``: of these only) given a value other than their
    default, in the parser's order: what an action that ignores them must refuse."""
    parser = getattr(args, "_parser", None)
    if parser is None:
        return []
    return [max(a.option_strings, key=len) for a in parser._actions  # --m, not -m
            if a.option_strings and (dests is None or a.dest in dests)
            and a.dest not in exclude and getattr(args, a.dest, a.default) != a.default]


def unwritable(path: Path, folder: bool = False) -> str | None:
    """Why ``path`` (a file, or with ``folder`` a directory) cannot be written, else None;
    nothing is created. A file is made and removed at once in the nearest existing
    directory: permission bits alone miss what refuses root (a read-only or pseudo file
    system such as /proc)."""
    if folder and path.exists() and not path.is_dir():
        return "exists and is not a directory"
    if not folder and path.is_dir():
        return "is a directory; name a file"
    probe = path if folder else path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
        if not folder and path.exists():
            with open(path, "a"):
                pass
    except OSError as exc:
        where = path if not folder and path.exists() else probe
        return f"cannot write to {where} ({exc.strerror or exc})"
    return None
