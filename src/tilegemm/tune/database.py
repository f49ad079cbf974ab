"""The shipped database of measured parameters per device (``database.json``).

Defaults tuned on one machine can run at a fraction of the speed on another: the CPU
micro-kernel's register tile must fit the vector registers of the ISA (16 on AVX2, 32 on
AVX-512 and on 64-bit ARM's NEON) for the dtype. ``kernel="auto"`` consults, in order:
the user's tuning cache (``tilegemm tune``), then this database (this device by name and
ISA, and by CPU family and model where an entry names them; then the ISA's defaults,
entries with device ``"*"``), then the rung's own defaults. An entry may also name the
smallest product it serves (``"min_shape": {"n": 512, "k": 256}``): a tile measured faster
on large products can lose on narrow ones, where most of its columns are padding, and those
then take the entry without the condition. Entries record where they were measured; add
one from a ``tilegemm tune`` or ``benchmarks/cpu_blocked.py`` run.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from tilegemm.backends.base import Target

PATH = Path(__file__).with_name("database.json")

# Architectures (first part of LLVM's target triple) that are 64-bit ARM: Linux says
# "aarch64", Apple's systems "arm64".
AARCH64 = ("aarch64", "arm64")
# What platform.machine() calls 64-bit x86 on Linux and elsewhere.
X86_64 = ("x86_64", "amd64")


@cache
def entries(path: Path = PATH) -> tuple[dict[str, Any], ...]:
    data = json.loads(path.read_text())
    return tuple(data["entries"])


@cache
def host_isa() -> str:
    """The CPU's vector ISA as the micro-kernel sees it (see :func:`isa_of`), from the
    features and the architecture Numba compiles for, so it agrees with the code: the host's
    features, unless ``NUMBA_CPU_FEATURES`` names others (e.g. with ``NUMBA_CPU_NAME``, to
    build code for another machine) or ``NUMBA_ENABLE_AVX=0`` turned AVX off. A 32-register
    AVX-512 tile compiled as AVX2 code would spill, so the tile must follow the code."""
    return isa_of(compiled_cpu_features(), compiled_arch())


def isa_of(features: Mapping[str, bool], arch: str) -> str:
    """The ISA tier for code with these CPU features ({feature: enabled}, LLVM's names)
    on this architecture (the first part of the target triple): "avx512", "avx2" (with
    FMA), "neon" (64-bit ARM) or "generic".

    Every 64-bit ARM application processor has NEON (Advanced SIMD), so an aarch64 target
    is "neon" unless the features turn it off; its feature list may also be empty (LLVM
    cannot read the host's features on every system). Machines with SVE are "neon" too:
    the kernels' fixed-width vectors compile to NEON's 128-bit registers there, and its 32
    registers are what the register tile must fit."""
    if features.get("avx512f"):
        return "avx512"
    if features.get("avx2") and features.get("fma"):
        return "avx2"
    if arch in AARCH64 and features.get("neon", True):
        return "neon"
    return "generic"


def compiled_cpu_features() -> dict[str, bool]:
    """The CPU features Numba's CPU code generator uses, as {feature: enabled}: the same
    rule as ``numba.core.codegen.CPUCodegen._get_host_cpu_features`` (the
    ``NUMBA_CPU_FEATURES`` string if set, else LLVM's host features less AVX when
    ``NUMBA_ENABLE_AVX=0``)."""
    from tilegemm._compat import import_numba

    import_numba()  # the first CPU decision's first use of Numba: one thread imports it
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features

    text = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features()
    return parse_features(text)


def parse_features(text: str) -> dict[str, bool]:
    """LLVM's feature string (``"+avx2,-avx512f"``) as {feature: enabled}."""
    return {f[1:]: f[0] == "+" for f in text.split(",") if f[:1] in "+-" and len(f) > 1}


def compiled_arch() -> str:
    """The architecture Numba compiles for: the first part of the process's target triple
    (``x86_64``, ``aarch64``; ``arm64`` on Apple's systems)."""
    from llvmlite import binding as ll

    return ll.get_process_triple().split("-")[0]


@cache
def host_hardware_isa() -> str:
    """The host CPU's own vector ISA tier (:func:`isa_of`), whatever Numba is told to
    compile for: what an OpenCL CPU driver such as PoCL builds its kernels for. Read from
    Linux's list of CPU features where there is one (see :func:`features_of_flags`), else
    from LLVM's reading of the host: an OpenCL process would otherwise import LLVM's
    bindings for this alone."""
    from tilegemm.backends.cpu import cpu_flags

    machine = platform.machine().lower()
    flags = cpu_flags()
    if flags is not None and machine in (*X86_64, *AARCH64):
        return isa_of(features_of_flags(flags, machine), "x86_64" if machine in X86_64
                      else machine)
    from llvmlite import binding as ll

    try:
        text = ll.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM cannot read the features on every system (some ARM ones)
        text = ""
    return isa_of(parse_features(text), compiled_arch())


def features_of_flags(flags: frozenset[str], machine: str) -> dict[str, bool]:
    """LLVM's names for the features :func:`isa_of` reads, from Linux's CPU flags: x86
    names them as LLVM does (``avx512f``, ``avx2``, ``fma``); 64-bit ARM calls NEON
    ``asimd``."""
    if machine in AARCH64:
        return {"neon": "asimd" in flags}
    return {name: name in flags for name in ("avx512f", "avx2", "fma")}


def isa(target: Target) -> str:
    """The database's architecture tier for ``target``: the ISA for host code; for an
    OpenCL device that is the host's CPU (PoCL's, for one), the CPU's ISA, since that is
    what its kernels are compiled for and what a register tile must fit; else the Target's
    architecture (CUDA "sm_90"; "" for an OpenCL GPU, whose entries are per device)."""
    from tilegemm.backends import host_backend

    if target.backend == host_backend():
        return host_isa()
    if _host_cpu_of_another_backend(target):
        return host_hardware_isa()
    return target.arch


def _host_cpu_of_another_backend(target: Target) -> bool:
    """Whether ``target`` is the host's CPU driven by a backend other than the CPU one (an
    OpenCL CPU device such as PoCL's), which compiles with a toolchain of its own."""
    from tilegemm.backends import host_backend

    return target.kind == "cpu" and target.backend != host_backend()


def host_family_model() -> str:
    """The host CPU's ``<family>-<model>`` (``26-2``), which entries may name: virtual
    machines of different generations often report the same CPU name ("AMD EPYC" for both
    Zen 4 and Zen 5), and a tile measured on one can be far from the best on the other."""
    from tilegemm.backends.cpu import cpu_family_model

    return cpu_family_model()


def _cpu_rank(entry: dict[str, Any], family_model: str) -> int | None:
    """How closely ``entry``'s optional ``"cpu"`` field (``"25"``: any model of family 25;
    ``"26-2"``: that model) matches the host: 2 for the model, 1 for the family, 0 when the
    entry names none, None when it names another CPU (the entry does not apply)."""
    want = entry.get("cpu")
    if not want:
        return 0
    if family_model == want:
        return 2
    if "-" not in want and family_model.startswith(want + "-"):
        return 1
    return None


# The dimensions an entry's "min_shape" may bound.
SHAPE_DIMS = ("m", "n", "k")

Shape = tuple[int, int, int]


def serves(entry: Mapping[str, Any], shape: Shape | None) -> bool:
    """Whether ``entry`` serves a product of this (M, N, K) shape: always, unless it names
    a ``"min_shape"``; then only products at least that large in every dimension it names
    (not one of unknown shape)."""
    least = entry.get("min_shape")
    if not least:
        return True
    if shape is None:
        return False
    return all(size >= least.get(dim, 0) for dim, size in zip(SHAPE_DIMS, shape))


def bound_text(entry: Mapping[str, Any]) -> str:
    """The products ``entry`` is limited to, for a reader ("M >= 64, N >= 512"), or ""."""
    least = entry.get("min_shape") or {}
    return ", ".join(f"{dim.upper()} >= {least[dim]}" for dim in SHAPE_DIMS if dim in least)


def _shape_bounds(table: tuple[dict[str, Any], ...]) -> tuple[dict[str, int], ...]:
    """The distinct "min_shape" bounds of ``table``'s entries (most tables have none),
    worked out again only for another table (entries are dicts, which cannot key a cache)."""
    if _bounds_of[0] is not table:
        bounds: list[dict[str, int]] = []
        for e in table:
            least = e.get("min_shape")
            if least and least not in bounds:
                bounds.append(least)
        _bounds_of[:] = [table, tuple(bounds)]
    return _bounds_of[1]


_bounds_of: list[Any] = [None, ()]  # (the table, its bounds) of the last call


def shape_class(shape: Shape, table: tuple[dict[str, Any], ...] | None = None
                ) -> tuple[bool, ...]:
    """Which of ``table``'s "min_shape" bounds ``shape`` meets: two shapes of one class get
    the same answer from :func:`lookup`, so a caller can remember answers per class rather
    than per shape (a few comparisons, and a bounded memo)."""
    table = entries() if table is None else table
    return tuple(serves({"min_shape": b}, shape) for b in _shape_bounds(table))


def lookup(target: Target, dtype: str, table: tuple[dict[str, Any], ...] | None = None,
           shape: Shape | None = None) -> tuple[dict[str, Any], str] | None:
    """(entry, tier) for ``target``, ``dtype`` and a product of ``shape`` (M, N, K; None:
    entries with a "min_shape" do not apply): tier "device" (name and ISA match, and for
    host code the CPU family/model when the entry names one, the closest match first, then
    an entry bounded by shape before one that is not), else "isa" (an entry for any device
    of this ISA, the ``"*"`` one first; for an OpenCL CPU device, the ISA's ``"*"`` entry
    only; none for a device without an architecture string, such as an OpenCL GPU, whose
    entries would otherwise serve every other device); None when the database has nothing
    (the rung's defaults apply)."""
    from tilegemm.backends import host_backend

    table = entries() if table is None else table
    arch = isa(target)
    family_model = host_family_model() if target.backend == host_backend() else ""
    same = [e for e in table if e["backend"] == target.backend and e["dtype"] == dtype
            and e["isa"] == arch and serves(e, shape)]
    ranked = [((rank, bool(e.get("min_shape"))), e) for e in same if e["device"] == target.name
              and (rank := _cpu_rank(e, family_model)) is not None]
    if ranked:
        return max(ranked, key=lambda r: r[0])[1], "device"
    if not arch:  # no architecture to share (OpenCL GPUs): entries are per device only
        return None
    if _host_cpu_of_another_backend(target):
        # Another OpenCL CPU driver's entry (another PoCL build, LLVM, tile code) is no
        # evidence for this one: only an entry made for the whole ISA serves it.
        same = [e for e in same if e["device"] == "*"]
    for e in sorted(same, key=lambda e: (e["device"] != "*", not e.get("min_shape"))):
        return e, "isa"
    return None
