"""CPU backend: Numba ``@njit`` rungs on NumPy arrays (NumPy itself is the reference)."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tilegemm.backends.base import (
    Backend,
    BackendStatus,
    Limits,
    Prepared,
    Target,
    poison_enabled,
    poison_value,
    resolve_scalars,
    size_text,
    wall_clock_elapsed,
)
from tilegemm.errors import InvalidValueError
from tilegemm.kernels.cpu._threads import make_tbb_loadable
from tilegemm.problem import (
    GemmProblem,
    Operand,
    host_operand_3d,
    host_operand_stored,
    rounded_to_result,
    written_directly,
)
from tilegemm.registry import KernelSpec

# Before anything starts Numba's threads: its thread- and fork-safe layer needs this (see
# tilegemm.kernels.cpu._threads).
make_tbb_loadable()

# A write of a buffer larger than the CPU's last-level cache evicts it between timed runs.
HOST_FLUSH_BYTES = 64 * 1024 * 1024


@cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none): the one
    read of that file behind :func:`cpu_name` and :func:`cpu_family_model`."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields


# Names of common 64-bit ARM cores by (implementer, part), the numbers 64-bit ARM Linux
# puts in /proc/cpuinfo instead of a model name (as lscpu's table does). A core missing
# here is still told apart from others, by its numbers (see :func:`_arm_name`).
ARM_CORES: dict[tuple[int, int], str] = {
    (0x41, 0xD08): "ARM Cortex-A72",      # AWS Graviton (1st generation), Raspberry Pi 4
    (0x41, 0xD0B): "ARM Cortex-A76",      # Raspberry Pi 5
    (0x41, 0xD0C): "ARM Neoverse-N1",     # AWS Graviton2, Ampere Altra
    (0x41, 0xD40): "ARM Neoverse-V1",     # AWS Graviton3
    (0x41, 0xD49): "ARM Neoverse-N2",
    (0x41, 0xD4F): "ARM Neoverse-V2",     # AWS Graviton4, NVIDIA Grace
    (0xC0, 0xAC3): "Ampere AmpereOne",
}


def _arm_name(fields: Mapping[str, str]) -> str:
    """The core's name from /proc/cpuinfo's ``CPU implementer`` and ``CPU part`` on 64-bit
    ARM Linux (:data:`ARM_CORES`), else those numbers spelled out; "" without them."""
    implementer, part = fields.get("cpu implementer", ""), fields.get("cpu part", "")
    try:
        key = (int(implementer, 0), int(part, 0))
    except ValueError:
        return ""
    return ARM_CORES.get(key, f"ARM CPU (implementer {key[0]:#04x}, part {key[1]:#05x})")


@cache
def _macos_brand() -> str:
    """``machdep.cpu.brand_string`` ("Apple M2 Pro") on macOS, else ""."""
    if platform.system() != "Darwin":
        return ""
    import subprocess

    try:
        done = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


# Where Linux describes the first CPU's caches, one folder per cache (index0, index1, ...).
SYSFS_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


@cache
def l2_cache_bytes() -> int | None:
    """The level-2 cache one CPU has to itself, in bytes; None where the system does not say.

    The blocked rung sizes work to it (``k02_blocked.l2_budget``). Linux lists the first
    CPU's caches in sysfs: the level-2 data or unified cache's size, divided by the number
    of CPUs that share it (hyperthreads of one core, or a cluster of small cores), since
    each of those CPUs runs a thread of its own. macOS: ``hw.perflevel0.l2cachesize`` (the
    performance cores') per ``hw.perflevel0.cpusperl2``, else ``hw.l2cachesize``.
    """
    if SYSFS_CACHES.is_dir():
        return _sysfs_l2(SYSFS_CACHES)
    if platform.system() == "Darwin":
        size = _sysctl_int("hw.perflevel0.l2cachesize") or _sysctl_int("hw.l2cachesize")
        return None if not size else size // max(1, _sysctl_int("hw.perflevel0.cpusperl2") or 1)
    return None


def _sysfs_l2(caches: Path) -> int | None:
    """:func:`l2_cache_bytes` from a sysfs cache folder (``cpu0/cache``)."""
    for index in sorted(caches.glob("index[0-9]*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip().upper()
            shared = (index / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        if level != "2" or kind not in ("Data", "Unified"):
            continue
        scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1:], 1)
        try:
            total = int(size.rstrip("KMG")) * scale
        except ValueError:
            return None
        return total // max(1, _cpu_count(shared))
    return None


def _cpu_count(cpu_list: str) -> int:
    """How many CPUs a sysfs CPU list names ("0-3,8-11" is 8)."""
    count = 0
    for part in filter(None, cpu_list.split(",")):
        first, _, last = part.partition("-")
        try:
            count += int(last or first) - int(first) + 1
        except ValueError:
            return 1
    return count


def _sysctl_int(name: str) -> int | None:
    """An integer from macOS's ``sysctl -n name``, or None."""
    import subprocess

    try:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True,
                              timeout=5, check=False)
        return int(done.stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity set where the system has one (a
    container limited to some CPUs, ``taskset``), which is also how many threads Numba
    starts, not every CPU the machine has (``os.cpu_count``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call (macOS, Windows)
        return os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU model, the one reader used by results files, benchmark scripts and the
    tuning cache's device key: /proc/cpuinfo's model name on Linux (on 64-bit ARM, which
    has none, the core named by its implementer and part numbers), the brand string on
    macOS, else what ``platform`` knows. Without this, every ARM Linux machine would be
    called "aarch64" and share one tuning-cache entry."""
    fields = _cpuinfo()
    return (fields.get("model name") or _arm_name(fields) or _macos_brand()
            or platform.processor() or platform.machine() or "CPU")


def cpu_family_model() -> str:
    """``<family>-<model>`` from /proc/cpuinfo (``6-207`` for an Emerald Rapids Xeon), or "".

    Virtual machines often report only the vendor's generic name ("Intel(R) Xeon(R)
    Processor"), which is the same for several generations; the family and model numbers
    tell them apart. On 64-bit ARM Linux it is ``<implementer>-<part>`` (``0x41-0xd0c``),
    so a database entry's ``"cpu"`` can name one vendor (``"0x41"``) or one core.
    """
    fields = _cpuinfo()
    family, model = fields.get("cpu family", ""), fields.get("model", "")
    if family and model:
        return f"{family}-{model}"
    implementer, part = fields.get("cpu implementer", ""), fields.get("cpu part", "")
    return f"{implementer}-{part}" if implementer and part else ""


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as Linux reports them in /proc/cpuinfo (``flags`` on x86,
    ``Features`` on ARM), or None where there is no such list. Linux lists a feature only
    where the kernel enables it (AVX-512 where it saves the registers), as LLVM's reading
    of the host also requires, and reading the file takes a fraction of a millisecond
    where LLVM's bindings take 30-70 ms to import."""
    fields = _cpuinfo()
    text = fields.get("flags", fields.get("features"))
    return None if text is None else frozenset(text.split())


def host_output(prob: GemmProblem, c: Operand | None, out: Any, beta: Any) -> np.ndarray:
    """The (batch, M, N) array kernels write: ``out`` itself when given, else a new array.

    When beta != 0 it starts as C0 broadcast to the result shape; when beta == 0 kernels
    must not read it, so it is poisoned under TILEGEMM_POISON to prove they don't.
    """
    dest = out if out is not None else np.empty(prob.out_shape, dtype=prob.dtype)
    if beta != 0:
        c0 = np.broadcast_to(np.asarray(rounded_to_result(c.obj, prob), dtype=prob.dtype),
                             prob.out_shape)
        np.copyto(dest, c0)  # copy first: c may alias out
    elif poison_enabled() and dest.size:
        dest.fill(poison_value(prob.dtype))
    return dest


def _alpha_limit(program: Any, prob: GemmProblem) -> float:
    """The largest ``|alpha|`` a CPU rung applies itself to a float product (see
    :meth:`CpuBackend.run`): 1 where K may be cut into more than one panel (the rung's
    ``k_panel``: the fewest K steps any of its paths puts in a panel), each of whose sums
    alpha scales as it is added; else the dtype's largest finite number (an infinite alpha
    is applied afterwards)."""
    if prob.k > getattr(program, "k_panel", prob.k):
        return 1.0
    return float(np.finfo(prob.dtype).max)


@cache
def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say); asked once,
    since every call that decides anew checks its product against it."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory() -> int | None:
    """Memory a new allocation can have now without swapping, in bytes: Linux's
    MemAvailable (free memory plus caches it can drop), else the system's count of free
    pages, else None. Asked anew each time: it changes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


@cache
def _status() -> BackendStatus:
    """Probed once: ``kernel="auto"`` asks on every call, and small products are measured in
    microseconds."""
    l2 = l2_cache_bytes()  # what the blocked rung sizes its work to: worth seeing
    size = (f"{l2 // 1024} KiB" if l2 < 2**20 else f"{l2 / 2**20:g} MiB") if l2 else ""
    cache = f", L2 {size} per CPU" if l2 else ""
    return BackendStatus("cpu", True, f"Numba on {usable_cpus()} CPU core(s){cache}",
                         ("host CPU",))


class CpuBackend(Backend):
    name = "cpu"
    label = "CPU"
    array_kind = "host"

    def status(self) -> BackendStatus:
        return _status()

    @cache  # noqa: B019 - one backend object per process
    def _target(self, index: int | None) -> Target:
        # No block limits: a CPU "block" is a loop nest; the largest allocation is the
        # host's memory (check_problem).
        return Target(self.name, cpu_name(), "cpu", platform.machine(),
                      Limits(threads_per_block=0), timer="perf_counter", vendors=("numpy",))

    def device_details(self, target: Target) -> dict[str, Any]:
        """What results files record about the CPU beside its name: the family and model
        (which tell generations under one vendor string apart) and the L2 cache one CPU has,
        which sizes the blocked rung's work (``l2_cache_bytes``)."""
        return {"device": target.name, "cpu_family_model": cpu_family_model(),
                "l2_bytes_per_cpu": l2_cache_bytes()}

    def check_problem(self, operands: Any, prob: GemmProblem, target: Target,
                      out: Any = None) -> None:
        """Refuse a product whose result and operand copies exceed this machine's memory.

        The rung reads C-ordered (or, 2-D, Fortran-ordered) arrays of the computed dtype
        in place; any other operand (another dtype, strided, broadcast with zero strides)
        is copied first. Without this check a huge copy (a broadcast row standing for
        2**36 columns, say) would fail in NumPy with a MemoryError naming an internal array,
        or be allocated and swap the machine to a halt.
        """
        memory = physical_memory()
        if memory is None:
            return
        item = prob.dtype.itemsize
        # written straight into out (say an np.memmap larger than memory): nothing to
        # allocate for the result
        direct = out is not None and written_directly(out, prob)
        result = 0 if direct else prob.batch * prob.m * prob.n * item
        if prob.out_dtype != prob.dtype and out is None:
            # computed in a wider dtype (int8 in int32, float16 in float32), then cast into
            # a new array of the result's: both exist at once (an out= takes the cast)
            result += prob.batch * prob.m * prob.n * prob.out_dtype.itemsize
        copies = 0
        # an empty product reads, and so copies, neither operand (see run)
        for op, which in zip(() if prob.empty else operands[:2], "ab", strict=False):
            x = op.obj
            mode = prob.batch_mode(which)
            if (op.kind == "host" and isinstance(x, np.ndarray) and x.dtype == prob.dtype
                    and mode != "broadcast" and (x.flags.c_contiguous
                                                 or (x.ndim == 2 and x.flags.f_contiguous))):
                continue
            copies += prob.operand_elements(which) * item
        if result + copies > memory:
            raise InvalidValueError(
                f"this product needs {size_text(result + copies)} of memory (the result "
                f"{size_text(result)}, copies of operands that are not C-ordered "
                f"{prob.dtype.name} arrays {size_text(copies)}), more than this machine has "
                f"({size_text(memory)}); split it into smaller products (or pass out=, a "
                "C-ordered array of the result, to write into)")

    def cache_flusher(self, target: Target | None = None) -> Any:
        buf = np.empty(HOST_FLUSH_BYTES // 8, dtype=np.float64)
        return lambda: buf.fill(1.0)

    def run(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a: Operand, b: Operand, c: Operand | None, out: Any, alpha: Any, beta: Any,
        target: Target | None = None,
    ) -> np.ndarray:
        alpha, beta = resolve_scalars(prob, alpha, beta)
        if prob.empty:  # no element to compute: no operand is read, so none is copied
            return host_output(prob, c, out, beta)
        program = spec.program(params, prob.dtype)
        # A rung that packs transposed operands itself (blocked) reads a Fortran-ordered
        # matrix, an x.T or a slice of columns in place; the others get C-ordered copies.
        if getattr(program, "takes_transposed", False):
            b3, tb = host_operand_stored(b.obj, prob, "b")
            a3, ta = host_operand_stored(a.obj, prob, "a", plain_rows_apart=not tb)
        else:
            (a3, ta), (b3, tb) = (host_operand_3d(a.obj, prob, "a"), False), (
                host_operand_3d(b.obj, prob, "b"), False)
        # out=a (as NumPy allows): kernels read A while writing C, so an out that overlaps
        # an operand the kernel reads gets a fresh buffer, copied into out at the end.
        alias = out is not None and (np.may_share_memory(out, a3)
                                     or np.may_share_memory(out, b3))
        dest = host_output(prob, c, None if alias else out, beta)
        c3 = dest.reshape(prob.batch, prob.m, prob.n)
        # The rung scales each K panel's partial product by alpha as it adds it (as
        # BLAS does); with an infinite alpha, panels of opposite signs then give
        # inf - inf = NaN where alpha·(A@B) is ±inf, and with a large finite one a
        # panel could overflow to an infinity the next panel cannot bring back
        # (alpha = 2**127 and a product of 1.0 gave -inf). Such an alpha (infinite, or
        # above 1 in size over more than one K panel) is applied once, to the whole
        # product, as the GPU rungs and NumPy apply it.
        later = prob.dtype.kind == "f" and bool(abs(alpha) > _alpha_limit(program, prob))
        saved = c3.copy() if later and beta != 0 else None
        one, zero = prob.dtype.type(1), prob.dtype.type(0)
        args = (one, zero) if later else (alpha, beta)
        if ta or tb:
            program(a3, b3, c3, *args, int(ta) | int(tb) << 1)
        else:
            program(a3, b3, c3, *args)
        if later:  # the kernel's arithmetic, so no warning (inf × 0 is NaN silently)
            with np.errstate(all="ignore"):
                c3 *= alpha
                if saved is not None:
                    c3 += beta * saved
        if alias:
            np.copyto(out, dest)
            return out
        return dest

    def host_program(self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
                     target: Target) -> Any:
        """The compiled rung itself: with alpha one and beta zero, :meth:`run` is that call,
        and with the alphas :meth:`host_alpha_limit` gives, a call with ``c`` copied into
        the result first."""
        return spec.program(params, prob.dtype)

    def host_alpha_limit(self, program: Any, prob: GemmProblem) -> float:
        """For a float product, what :meth:`run` hands the rung itself (see there):
        alpha no larger than 1 in size over more than one K panel, else any finite alpha.
        An integer product's alpha and beta go to the rung as they are, once checked to fit
        its dtype: any of that size (an int, compared exactly)."""
        if prob.dtype.kind == "f":
            return _alpha_limit(program, prob)
        return int(np.iinfo(prob.dtype).max)  # (an int: float() would round int64's up)

    def prepare(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a3: np.ndarray, b3: np.ndarray, target: Target | None = None,
    ) -> Prepared:
        """Compile (outside any timing), then time launches with ``perf_counter``.

        The CPU has no transfers, so a launch is exactly the rung's call on operands prepared
        once: C-contiguous (batch|1, M, K) and (batch|1, K, N) arrays of the problem dtype.
        """
        a3 = np.ascontiguousarray(a3, dtype=prob.dtype)
        b3 = np.ascontiguousarray(b3, dtype=prob.dtype)
        c3 = np.empty((prob.batch, prob.m, prob.n), dtype=prob.dtype)
        if poison_enabled() and c3.size:
            c3.fill(poison_value(prob.dtype))
        alpha, beta = prob.dtype.type(1), prob.dtype.type(0)
        program = spec.program(params, prob.dtype)

        def launch() -> None:
            if not prob.empty:
                program(a3, b3, c3, alpha, beta)

        return Prepared(launch=launch, fetch=c3.copy,
                        elapsed=lambda n: wall_clock_elapsed(launch, n))


BACKEND = CpuBackend()
