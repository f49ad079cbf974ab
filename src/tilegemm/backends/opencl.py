"""OpenCL backend: the OpenCL C rungs on any OpenCL device, through PyOpenCL.

Devices. Every device of every platform gets an index (platforms in the order the ICD
loader lists them, devices in each platform's order): that is the ``device=`` index of
:func:`tilegemm.matmul`. Without it the device is the one ``PYOPENCL_CTX`` names, if set
(PyOpenCL's own syntax, e.g. ``0:1``), else the first GPU, else the first device. On a
machine with no GPU that is PoCL's CPU device, which ships as a pip wheel
(``pocl-binary-distribution``) so no system package is needed. ``status().accelerated`` is
true only for a GPU: ``backend="auto"`` prefers a real GPU but never PoCL on the CPU over
the CPU backend.

Programs. A rung's :class:`~tilegemm.backends.opencl_program.OpenCLProgram` is compiled
once per (source, defines, context/device) and kept in memory. Across processes the driver
keeps the build: PoCL in its kernel cache, which tilegemm points into its own cache
directory (see :mod:`tilegemm.compile_cache`), NVIDIA's driver itself, other drivers through
PyOpenCL's binary cache. A failed build raises ``RuntimeError`` with the compiler log.

Arrays. NumPy operands are copied in and the result copied out. ``pyopencl.array.Array``
operands stay on their device and the result is a ``pyopencl.array.Array`` in the same
context: no host trip. Transposed, strided or partially broadcast device operands are
made dense on the device by a small gather kernel; a rung that reads its operands packed
in panels (``vectorized`` with one work-item per work-group, where that pays) has them
packed on the device by another (``OpenCLProgram.packs``). All arrays of one call must share one
context; the call starts after the work pending on them (their events, their other
queues) and the result carries its event, as PyOpenCL's own operations do.

Checks before anything runs: float64 needs ``cl_khr_fp64``; work-items per work-group,
each work-group dimension and local memory are compared with the device's limits (and,
after the build, with the compiled kernel's own work-group limit).
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import re
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
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
    unknown_device,
)
from tilegemm.backends.opencl_program import (
    KERNEL_NAME,
    OpenCLProgram,
)
from tilegemm.errors import (
    InvalidTypeError,
    InvalidValueError,
    UnavailableError,
    user_stacklevel,
)
from tilegemm.problem import (
    GemmProblem,
    Operand,
    host_operand_3d,
    is_pyopencl_array,
    rounded_to_result,
)
from tilegemm.registry import KernelSpec

LAYOUT = "_layout.cl"
# the OpenCL type of each element size, for the layout helpers that only move bits
BITS = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}


_POCL_CACHE_SET = False


def _cl() -> Any:
    global _POCL_CACHE_SET
    if not _POCL_CACHE_SET:
        # Before PoCL starts (it reads POCL_CACHE_DIR once, when the first OpenCL call
        # loads the platforms). Importing pyopencl starts nothing, so a caller that imported
        # it first still gets the cache; one that already listed the platforms keeps PoCL's
        # default folder, and the variable only names where tilegemm looks.
        _POCL_CACHE_SET = True
        from tilegemm.compile_cache import use_pocl_cache

        use_pocl_cache()
    import pyopencl

    return pyopencl


# Why the OpenCL backend cannot run in this process, when it is a child forked after its
# parent had started OpenCL (see _forked_after_use); "" otherwise.
_INHERITED = ""
_FORK_WATCHED = False  # whether _forked_after_use is registered (once per process)


def _forked_after_use() -> None:
    """In a child forked after this process listed the OpenCL platforms: OpenCL is off.

    The driver started there (PoCL's worker threads, a GPU driver's state) does not exist
    in the child, whose copy of it waits for ever: the child's first OpenCL call hung
    (PoCL 3.0), even when the parent had only listed the devices. The child's calls are
    refused with the reason instead, and what it inherited (remembered calls, the
    backend's answers) is dropped."""
    global _INHERITED
    _INHERITED = (
        "OpenCL was started in the parent process before this process was forked, and an "
        "OpenCL driver does not work in a forked child (its calls wait for ever); start "
        "worker processes with multiprocessing's 'spawn' or 'forkserver' method "
        "(multiprocessing.get_context('spawn')), or use OpenCL only in the workers")
    OpenCLBackend.status.cache_clear()
    from tilegemm import remembered

    remembered.forget()


@cache
def all_devices() -> tuple[Any, ...]:
    """Every OpenCL device here, in ``device=`` index order (listing them starts the
    drivers: a child forked after that cannot use OpenCL, see :func:`_forked_after_use`)."""
    global _FORK_WATCHED
    cl = _cl()
    platforms = cl.get_platforms()  # (raises where there is none: nothing was started)
    if not _FORK_WATCHED and hasattr(os, "register_at_fork"):
        _FORK_WATCHED = True
        os.register_at_fork(after_in_child=_forked_after_use)
    found: list[Any] = []
    for platform in platforms:
        try:
            found.extend(platform.get_devices())
        except cl.Error:  # a platform without devices reports DEVICE_NOT_FOUND
            continue
    return tuple(found)


def device_kind(device: Any) -> str:
    """"gpu", "cpu" or "accelerator": the key of a rung's ``device_defaults``."""
    cl = _cl()
    if device.type & cl.device_type.GPU:
        return "gpu"
    if device.type & cl.device_type.CPU:
        return "cpu"
    return "accelerator"


def has_fp64(device: Any) -> bool:
    return "cl_khr_fp64" in device.extensions.split() or bool(
        getattr(device, "double_fp_config", 0))


def _handle(x: Any) -> Any:
    """What identifies an OpenCL object: its handle, or for shared virtual memory (an
    ``SVMAllocation``, which has none) its address."""
    ptr = getattr(x, "int_ptr", None)
    return ptr if ptr is not None else ("svm", getattr(x, "svm_ptr", id(x)))


def _array_device(x: Any) -> Any:
    """The device of pyopencl array ``x``: its queue's, else its context's first."""
    return x.queue.device if x.queue is not None else x.context.devices[0]


def _same(x: Any, y: Any) -> bool:
    return _handle(x) == _handle(y)


def _memory_root(buf: Any) -> Any:
    """The handle of the memory ``buf`` lives in: a sub-buffer's parent buffer (a
    sub-buffer has a handle of its own), else ``buf``'s own."""
    try:
        parent = buf.get_info(_cl().mem_info.ASSOCIATED_MEMOBJECT)
    except Exception:  # shared virtual memory, or a driver that cannot say
        parent = None
    return _handle(parent if parent is not None else buf)


def is_pocl(device: Any) -> bool:
    """Whether ``device`` is driven by PoCL (the Portable Computing Language)."""
    return "PoCL" in device.platform.version or "Portable Computing Language" in (
        device.platform.name)


def built_program(context: Any, device: Any, source: str, options: Sequence[str],
                  made: list[Any] | None = None, keep_as: str | None = None) -> Any:
    """``source`` built with ``options`` for ``device`` in ``context`` (a ``cl.Program``).

    ``keep_as`` (an entry name) keeps the program's binary, as PoCL returns it after the
    build, in tilegemm's compile cache, and later processes build from it: PoCL answers a
    build from source that it finds in its own cache in 50-60 ms, since it runs the
    preprocessor over its 1 MB OpenCL header to find the entry, and a build from the
    binary in 1-2 ms (PoCL 3.0, 2-core AMD EPYC). Asking PoCL for the binary compiles
    every kernel for any work-group size first: 0.03 s for the device probe, but 2.3-2.8 s
    for a rung's program, built in about 0.9 s, so rungs build from source (PoCL's
    cache). The key holds the source's hash, the options, the device, PoCL's version, the
    host CPU and PyOpenCL's version (``compile_cache.cached_texts``); a binary PoCL
    refuses gives a ``CompileCacheWarning``, is deleted and built from source again. Only
    on PoCL: other drivers keep their own caches (see ``compile_cache``). ``made``
    collects each program built from source, so a failed build's log can be read; a
    failed build raises ``cl.Error`` and stores nothing."""
    cl = _cl()
    made = [] if made is None else made

    def from_source() -> Any:
        program = cl.Program(context, source)
        made.append(program)
        return program.build(options=list(options), devices=[device])

    if keep_as is None or not is_pocl(device):
        return from_source()
    from tilegemm import compile_cache
    from tilegemm.backends.cpu import cpu_family_model
    from tilegemm.tune.database import host_hardware_isa

    key = {"describe": {"backend": "opencl", "kernel": keep_as},
           "source": hashlib.sha256(source.encode()).hexdigest(), "options": list(options),
           "device": device.name.strip(), "driver": device.driver_version.strip(),
           "platform": device.platform.version.strip(),
           "cpu": f"{cpu_family_model()} {host_hardware_isa()}"}

    def build() -> dict[str, str]:
        program = from_source()
        binaries = program.get_info(cl.program_info.BINARIES)
        devices = program.get_info(cl.program_info.DEVICES)
        binary = next(b for d, b in zip(devices, binaries, strict=True) if _same(d, device))
        return {"binary": base64.b64encode(binary).decode("ascii")}

    n_made = len(made)
    texts = compile_cache.cached_texts(compile_cache.OPENCL_SUBDIR, keep_as, key, build)
    if len(made) > n_made:
        return made[-1]
    try:
        binary = base64.b64decode(texts["binary"], validate=True)
        return cl.Program(context, [device], [binary]).build(options=list(options),
                                                              devices=[device])
    except (cl.Error, ValueError, KeyError) as exc:
        warnings.warn(f"kernel cache entry for OpenCL program {keep_as} could not be loaded "
                      f"({type(exc).__name__}: {str(exc).strip()[:200]}); rebuilding it",
                      compile_cache.CompileCacheWarning, stacklevel=user_stacklevel())
        compile_cache.discard_texts(compile_cache.OPENCL_SUBDIR, keep_as, key)
        n_made = len(made)
        compile_cache.cached_texts(compile_cache.OPENCL_SUBDIR, keep_as, key, build)
        # (another process may have stored it again meanwhile: then built here uncached)
        return made[-1] if len(made) > n_made else from_source()


# The smallest program a device must build before it is chosen by default.
_PROBE_SOURCE = "__kernel void probe(__global float *x) { x[get_global_id(0)] += 1.0f; }"
_BUILD_PROBLEMS: dict[int, str] = {}


def build_problem(device: Any) -> str:
    """"" when ``device`` builds a trivial program, else a one-line reason why it cannot.

    A device can be listed and still unable to compile anything: PoCL 3.0, as bundled with
    the PyOpenCL wheels, uses LLVM 14, which does not know CPUs newer than it (an AMD Zen 5
    EPYC, CPU family 26) and asks its own compiler for the CPU "generic", which it then
    rejects ("unknown target CPU 'generic'"). Such a device is skipped when choosing the
    default device and refused when named with ``device=``, with this reason, instead of
    failing at the first rung's build. One build per device and process (PoCL keeps the
    successful build in its kernel cache).
    """
    key = int(device.int_ptr)
    if key not in _BUILD_PROBLEMS:
        cl = _cl()
        try:
            built_program(cl.Context([device]), device, _PROBE_SOURCE, (), keep_as="probe")
            _BUILD_PROBLEMS[key] = ""
        except cl.Error as exc:
            log = " ".join(line.strip() for line in str(exc).splitlines()
                           if "error" in line.lower() and "clBuildProgram" not in line)
            reason = f"{_platform_label(device)} cannot compile for it"
            if "unknown target CPU" in log:
                reason += (": its LLVM does not know this CPU model (a PoCL built with a newer "
                           "LLVM does, e.g. Debian/Ubuntu's pocl-opencl-icd)")
            _BUILD_PROBLEMS[key] = reason + (f" [{log[:200]}]" if log else "")
    return _BUILD_PROBLEMS[key]


def _platform_label(device: Any) -> str:
    """"PoCL 3.0-rc2 (LLVM 14.0.6)" from PoCL's long version string, else the platform's
    name and version."""
    version = device.platform.version.strip()
    found = re.search(r"(PoCL \S+).*?(LLVM [\d.]+)", version)
    if found:
        return f"{found.group(1)} ({found.group(2)})"
    return f"{device.platform.name.strip()} ({version})"


@cache
def default_device_index() -> int:
    """The device used without ``device=``: PYOPENCL_CTX, else the first GPU, else the first
    device, skipping devices that cannot build a program (see :func:`build_problem`)."""
    cl = _cl()
    devices = all_devices()
    if not devices:
        raise UnavailableError("no OpenCL device found")
    ctx = os.environ.get("PYOPENCL_CTX")
    if ctx:
        def names_none(why: str) -> UnavailableError:
            return UnavailableError(
                f"PYOPENCL_CTX={ctx!r} names no OpenCL device here ({why}); unset it, set it "
                "to platform:device of one of "
                + ", ".join(f"{p}:{i} {d.name.strip()}"
                            for p, platform in enumerate(cl.get_platforms())
                            for i, d in enumerate(platform.get_devices()))
                + ", or pass device= (see 'tilegemm info')")

        numbers = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", ctx)
        if numbers:  # PyOpenCL takes a device index past the platform's last as its first
            platforms = cl.get_platforms()
            p, i = int(numbers.group(1)), int(numbers.group(2))
            if p < len(platforms) and i >= len(platforms[p].get_devices()):
                raise names_none(f"platform {p} has {len(platforms[p].get_devices())} "
                                 "device(s)")
        try:
            chosen = cl.create_some_context(interactive=False).devices[0]
        except Exception as exc:  # PyOpenCL's own wording of a value that names no device
            raise names_none(str(exc)) from None
        for i, d in enumerate(devices):
            if _same(d, chosen):
                return i
        raise UnavailableError(f"PYOPENCL_CTX={ctx!r} chose a device "
                               "that is not in the platform list")
    order = sorted(range(len(devices)), key=lambda i: device_kind(devices[i]) != "gpu")
    for i in order:
        if not build_problem(devices[i]):
            return i
    by_reason: dict[str, list[str]] = {}
    for i in order:
        by_reason.setdefault(build_problem(devices[i]), []).append(
            f"[{i}] {devices[i].name.strip()}")
    raise UnavailableError("no OpenCL device here can compile a program: " + "; ".join(
        f"{', '.join(names)}: {reason}" for reason, names in by_reason.items()))


def check_device_index(index: Any) -> int:
    """``device=`` as a valid index, or a ValueError listing the devices."""
    devices = all_devices()
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not (
            0 <= int(index) < len(devices)):
        raise unknown_device("OpenCL", index, tuple(d.name.strip() for d in devices))
    return int(index)


@dataclass
class _Place:
    """Where one call runs: a context, one of its devices and an in-order queue."""

    context: Any
    device: Any
    queue: Any


@dataclass
class _OwnDevice:
    context: Any
    device: Any
    queue: Any  # with profiling, for Prepared.elapsed


@dataclass
class _Cache:
    kernels: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    queues: dict[tuple[int, int], Any] = field(default_factory=dict)
    unrecorded: set[int] = field(default_factory=set)  # kernels not launched yet (PoCL cache)
    # contexts the entries above belong to, least recently used first (see _keep)
    contexts: dict[int, None] = field(default_factory=dict)
    last_context: int | None = None
    # the events of first launches not yet seen to have run (see _first_launch)
    first_launches: list[Any] = field(default_factory=list)
    # CL_KERNEL_WORK_GROUP_SIZE per (kernel, device), as compiled
    group_limits: dict[tuple[int, int], int] = field(default_factory=dict)
    # (program, kernel) per (context, device, rung, dtype, parameters), checked against
    # the device (see _checked_kernel)
    checked: dict[tuple[Any, ...], tuple[Any, Any]] = field(default_factory=dict)


class OpenCLBackend(Backend):
    name = "opencl"
    label = "OpenCL"
    array_kind = "opencl"
    accepts_device = True  # matmul/gemm(device=i) selects a device by index

    def __init__(self) -> None:
        self._own: dict[int, _OwnDevice] = {}
        self._cache = _Cache()
        # queues of prepared products (benchmarks) that may have work in flight
        self._used: dict[int, Any] = {}
        self._targets: dict[int, Target] = {}  # per device index, while the device is the same

    # -- probing ------------------------------------------------------------------------

    @cache  # noqa: B019 - one backend object per process
    def status(self) -> BackendStatus:
        if _INHERITED:
            return BackendStatus("opencl", False, _INHERITED)
        try:
            cl = _cl()
        except Exception as exc:  # pragma: no cover - pyopencl is a dependency
            return BackendStatus("opencl", False, f"pyopencl cannot be imported: {exc}")
        try:
            devices = all_devices()
        except Exception as exc:
            return BackendStatus("opencl", False, f"no OpenCL platform found ({exc})")
        if not devices:
            return BackendStatus("opencl", False, "OpenCL platforms found but no devices")
        try:
            index = default_device_index()
        except Exception as exc:
            index, no_default = -1, str(exc)
        else:
            no_default = ""
        names = tuple(
            f"[{i}] {d.name.strip()} ({device_kind(d)}, {d.platform.name.strip()})"
            + (" default" if i == index else "")
            + ("; cannot compile here" if build_problem(d) else "")
            for i, d in enumerate(devices)
        )
        version = f"PyOpenCL {cl.VERSION_TEXT}"
        if no_default:
            working = [i for i, d in enumerate(devices) if not build_problem(d)]
            if not working or not os.environ.get("PYOPENCL_CTX"):
                return BackendStatus("opencl", False,
                                     f"cannot choose an OpenCL device: {no_default}", names)
            # A PYOPENCL_CTX that names no device: calls naming one with device= still run
            # (one without is refused with this reason, see _target).
            return BackendStatus(
                "opencl", True, f"{version}; {no_default}; calls must name a device: "
                + " or ".join(f"device={i}" for i in working), names,
                default_problem=no_default)
        default = devices[index]
        problem = build_problem(default)
        if problem:  # chosen by PYOPENCL_CTX: calls without device= cannot run
            ctx = os.environ.get("PYOPENCL_CTX", "")
            why = (f"the default device [{index}] {default.name.strip()}"
                   + (f" (PYOPENCL_CTX={ctx!r})" if ctx else "") + f": {problem}")
            working = [i for i, d in enumerate(devices) if not build_problem(d)]
            if not working:
                return BackendStatus("opencl", False, why, names)
            # Another device can compile: a call naming it with device= runs there, so the
            # backend stays usable; one without device= is refused (see _device_target).
            return BackendStatus(
                "opencl", True, f"{version}; {why}; calls must name a device that can: "
                + " or ".join(f"device={i}" for i in working), names, default_problem=why)
        return BackendStatus(
            "opencl", True, f"{version}; default device [{index}] "
            f"{default.name.strip()}", names, accelerated=device_kind(default) == "gpu",
        )

    def describe_devices(self) -> Any:
        """A rich table of every platform and device: whether tilegemm can use it (and why
        not), and the limits the checks use. Four columns of wrapped lines, so a device's
        name stays whole in an 80-column terminal."""
        from rich.markup import escape
        from rich.table import Table

        try:
            devices = all_devices()
        except Exception:  # no device at all: the backends table says why
            return None
        if not devices:
            return None
        try:
            default = default_device_index()
        except Exception:  # none can run (the backends table says so): each says why
            default = None
        table = Table(title="OpenCL devices (device= index, * the default)", expand=True)
        table.add_column("#", no_wrap=True)
        table.add_column("device", overflow="fold", ratio=3)
        table.add_column("usable here", overflow="fold", ratio=2)
        for i, d in enumerate(devices):
            problem = build_problem(d)
            table.add_row(
                f"{i}{' *' if i == default else ''}",
                f"[bold]{escape(d.name.strip())}[/]\n{device_kind(d)}, "
                f"{escape(d.platform.name.strip())}, {' '.join(d.version.split()[:2])}; "
                f"{d.max_compute_units} compute units, work-group {d.max_work_group_size} "
                f"({'×'.join(map(str, d.max_work_item_sizes))}), "
                f"local mem {d.local_mem_size // 1024} KiB, "
                f"global mem {d.global_mem_size / 2**30:.1f} GiB, "
                f"fp64 {'yes' if has_fp64(d) else 'no'}",
                f"[red]no[/]: {escape(problem)}" if problem else "[green]yes[/]",
            )
        return table

    # -- parameters and limits --------------------------------------------------------------

    def device_names(self) -> tuple[str, ...]:
        return tuple(d.name.strip() for d in all_devices())

    def _target(self, index: int | None) -> Target:
        if index is not None:
            return self._device_target(index)
        default = default_device_index()
        try:
            return self._device_target(default)
        except UnavailableError as exc:  # the default cannot compile: say how it was chosen
            ctx = os.environ.get("PYOPENCL_CTX")
            working = [i for i, d in enumerate(all_devices()) if not build_problem(d)]
            raise UnavailableError(
                f"{exc} (the default device{f', chosen by PYOPENCL_CTX={ctx!r}' if ctx else ''})"
                + ("; pass " + " or ".join(f"device={i}" for i in working) if working else "")
            ) from None

    def _device_target(self, index: int) -> Target:
        d = all_devices()[index]
        known = self._targets.get(index)
        if known is not None and known.handle is d:
            return known
        problem = build_problem(d)
        if problem:
            raise UnavailableError(f"OpenCL device [{index}] {d.name.strip()}: {problem}. "
                                   "Devices: " + ", ".join(self.status().devices))
        kind = device_kind(d)
        limits = Limits(threads_per_block=int(d.max_work_group_size),
                        block_dims=tuple(int(x) for x in d.max_work_item_sizes),
                        shared_per_block=int(d.local_mem_size),
                        max_allocation=int(d.max_mem_alloc_size))
        target = self._targets[index] = Target(
            self.name, d.name.strip(), kind, "", limits, timer="OpenCL profiling events",
            index=index, accelerated=kind == "gpu", vendors=("clblast",), handle=d)
        return target

    def target_for(self, operands: Sequence[Operand], device: int | None = None) -> Target:
        """The device of the caller's pyopencl arrays (``device=``, if given, must be it)."""
        arrays = [op.obj for op in operands if op.kind == "opencl"]
        if not arrays:
            return self.target(device)
        dev = _array_device(arrays[0])
        here = next((i for i, d in enumerate(all_devices()) if _same(d, dev)), None)
        if device is not None:
            wanted = self.target(device)
            if here != wanted.index:
                where = f"device {here} ({dev.name.strip()})" if here is not None else (
                    dev.name.strip())
                raise InvalidValueError(
                    f"device={device} is {wanted.name}, but the pyopencl arrays live on "
                    f"{where}; omit device= to run where the data is")
            return wanted
        return self.target(here) if here is not None else self.target()

    def array_place(self, x: Any) -> Any:
        """The device ``x`` lives on (its handle), which :meth:`target_for` runs on."""
        return _array_device(x).int_ptr

    def device_details(self, target: Target) -> dict[str, Any]:
        d = target.handle
        return {"platform": d.platform.name.strip(), "driver": d.driver_version,
                "opencl": d.version, "compute_units": int(d.max_compute_units)}

    def results_prefix(self, info: Mapping[str, Any]) -> str:
        where = f"{info.get('platform', '')} {info.get('device', '')}"
        return "opencl-pocl-" if "Portable Computing Language" in where else "opencl-"

    def check_limits(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                     target: Target | None = None) -> None:
        if not self.status().usable:
            return
        self._check_device(spec, params, np.dtype(dtype), (target or self.target()).handle)

    def _check_device(
        self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype, device: Any,
    ) -> None:
        name = device.name.strip()
        if dtype.name == "float64" and not has_fp64(device):
            raise InvalidTypeError(
                f"OpenCL device {name} lacks cl_khr_fp64: float64 is not supported "
                "there (use float32 or another device)")
        program: OpenCLProgram = spec.program(params, dtype)
        threads = program.local[0] * program.local[1]
        if threads > device.max_work_group_size:
            raise InvalidValueError(
                f"{spec.name}: {threads} work-items per work-group exceed the device limit "
                f"max_work_group_size={device.max_work_group_size} on {name}")
        for dim, (size, limit) in enumerate(zip(program.local, device.max_work_item_sizes)):
            if size > limit:
                raise InvalidValueError(
                    f"{spec.name}: work-group size {size} in dimension {dim} exceeds the device "
                    f"limit max_work_item_sizes[{dim}]={limit} on {name}")
        if program.local_mem > device.local_mem_size:
            raise InvalidValueError(
                f"{spec.name}: needs {program.local_mem} bytes of local memory per work-group, "
                f"more than the device limit local_mem_size={device.local_mem_size} on {name}")

    def check_problem(self, operands: Any, prob: GemmProblem, target: Target,
                      out: Any = None) -> None:
        arrays = [op.obj for op in operands if op.kind == "opencl"]
        if arrays and out is not None and is_pyopencl_array(out):
            arrays.append(out)
        _one_context(arrays)  # here too, so plan() refuses what a call would
        self._check_sizes(target.handle, prob)

    @staticmethod
    def _check_sizes(device: Any, prob: GemmProblem) -> None:
        """Refuse a product whose buffers the device cannot allocate, before creating any.

        Without this, PyOpenCL fails part-way through with ``INVALID_BUFFER_SIZE`` (one buffer
        over ``max_mem_alloc_size``) or an out-of-resources error. A product with no element
        to compute allocates nothing (its operands are never uploaded).
        """
        if prob.empty:
            return
        item = prob.dtype.itemsize
        lead = {w: (1 if prob.batch_mode(w) == "single" else prob.batch) for w in ("a", "b")}
        buffers = (
            ("A", (lead["a"], prob.m, prob.k) if prob.k else (0,)),
            ("B", (lead["b"], prob.k, prob.n) if prob.k else (0,)),
            ("the result", (prob.batch, prob.m, prob.n)),
        )
        total = 0
        largest = device.max_mem_alloc_size
        for what, shape in buffers:
            nbytes = math.prod(shape) * item
            total += nbytes
            if nbytes > largest:
                name = device.name.strip()
                shown = "×".join(map(str, shape[1:] if shape[0] == 1 else shape))
                raise InvalidValueError(
                    f"{what} ({shown} {prob.dtype.name}, {size_text(nbytes)}) is larger than the "
                    f"largest buffer OpenCL device {name} can allocate (max_mem_alloc_size = "
                    f"{size_text(device.max_mem_alloc_size)}); split the product or use another "
                    "device")
        if total > device.global_mem_size:
            name = device.name.strip()
            raise InvalidValueError(
                f"A, B and the result need {size_text(total)}, more than OpenCL device {name} has "
                f"(global_mem_size = {size_text(device.global_mem_size)})")

    # -- devices, queues, programs ----------------------------------------------------------

    def own_device(self, index: int | None = None) -> _OwnDevice:
        """This backend's context and profiling queue on device ``index`` (default device)."""
        cl = _cl()
        index = default_device_index() if index is None else check_device_index(index)
        own = self._own.get(index)
        if own is None:
            device = all_devices()[index]
            context = cl.Context([device])
            queue = cl.CommandQueue(
                context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
            own = self._own[index] = _OwnDevice(context, device, queue)
        return own

    def _keep(self, context: Any) -> None:
        """Note ``context`` as the most recently used, and drop what is cached for the
        least recently used beyond ``CONTEXTS_KEPT`` callers' contexts (their kernels,
        programs and queues). Each cached kernel holds its context: a process that made a
        context per task kept every one of them alive, about 2 MiB each on PoCL, until it
        exited. A dropped context's kernels are built again if it comes back (from
        PoCL's or the driver's cache)."""
        cache, ptr = self._cache, context.int_ptr
        if cache.last_context == ptr:
            return  # already the most recent: the usual case
        with _CACHE_LOCK:  # (other threads look up and add entries meanwhile)
            cache.last_context = ptr
            cache.contexts.pop(ptr, None)
            cache.contexts[ptr] = None
            own = {o.context.int_ptr for o in list(self._own.values())}
            callers = [c for c in cache.contexts if c not in own]
            for old in callers[:max(0, len(callers) - CONTEXTS_KEPT)]:
                del cache.contexts[old]
                for key in [k for k in list(cache.kernels) if k[0] == old]:
                    kernel = cache.kernels.pop(key, None)
                    if kernel is not None:
                        cache.unrecorded.discard(kernel.int_ptr)
                        for g in [g for g in list(cache.group_limits) if g[0] == kernel.int_ptr]:
                            cache.group_limits.pop(g, None)
                for key in [k for k in list(cache.queues) if k[0] == old]:
                    cache.queues.pop(key, None)
                for key in [k for k in list(cache.checked) if k[0] == old]:
                    cache.checked.pop(key, None)

    def _queue(self, context: Any, device: Any) -> Any:
        key = (context.int_ptr, device.int_ptr)
        self._keep(context)
        queue = self._cache.queues.get(key)
        if queue is None:
            cl = _cl()
            queue = self._cache.queues[key] = cl.CommandQueue(
                context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
        return queue

    def _place(self, arrays: Sequence[Any], target: Target | None) -> _Place:
        """The context of the caller's pyopencl arrays, else our own on the target device.

        The call runs on the first array's queue when it is in order (the caller's work
        there comes first by itself), else on an in-order queue of ours; see
        :meth:`_after_callers_work` for the arrays' other queues."""
        device = None if target is None else target.index
        if not arrays:
            own = self.own_device(device)
            return _Place(own.context, own.device, own.queue)
        first = arrays[0]
        _one_context(arrays)
        context = first.context
        dev = _array_device(first)
        if target is not None and not _same(target.handle, dev):
            raise InvalidValueError(
                f"device={target.index} is {target.name}, but the pyopencl arrays live on "
                f"{dev.name.strip()}; omit device= to run where the data is")
        queue = first.queue
        if queue is None or _out_of_order(queue):
            queue = self._queue(context, dev)
        return _Place(context, dev, queue)

    @staticmethod
    def _after_callers_work(queue: Any, arrays: Sequence[Any]) -> None:
        """Make ``queue`` start this call's commands only after the caller's work on its
        arrays: the events PyOpenCL keeps on each array (a fill, a copy, an operation not
        yet finished) and everything enqueued before now on any other queue an array
        belongs to (its marker). PyOpenCL's own operations wait the same way; without it, an
        operand filled on another queue was read before it was written."""
        cl = _cl()
        done = cl.command_execution_status.COMPLETE
        # (an event that has run needs no barrier: one per call cost more than the check)
        waits = [event for x in arrays for event in (getattr(x, "events", None) or ())
                 if event.command_execution_status != done]
        others: dict[Any, Any] = {}
        for x in arrays:
            q = getattr(x, "queue", None)
            if q is not None and not _same(q, queue):
                others[_handle(q)] = q
        waits.extend(cl.enqueue_marker(q) for q in others.values())
        if waits:
            cl.enqueue_barrier(queue, wait_for=waits)

    def kernel(self, target: _Place | _OwnDevice, program: OpenCLProgram,
               name: str = KERNEL_NAME, source: str | None = None) -> Any:
        """The compiled kernel, built once per (source, options, context, device)."""
        source = program.source if source is None else source
        key = (target.context.int_ptr, target.device.int_ptr, source, program.options, name)
        self._keep(target.context)
        kernel = self._cache.kernels.get(key)
        if kernel is None:
            kernel = self._build(target, program, name, source)
            from tilegemm.compile_cache import record_pocl_cache_at_exit

            record_pocl_cache_at_exit()
            self._cache.kernels[key] = kernel
            self._cache.unrecorded.add(kernel.int_ptr)
        return kernel

    def _first_launch(self, kernel: Any, event: Any) -> None:
        """Once a kernel's first launch in this process has run, record the PoCL cache's
        files (PoCL writes a kernel's code at its first launch): a process that never exits
        normally (a multiprocessing worker, one killed) would otherwise leave its entries
        unrecorded, and a later truncation of one would abort every process that loads it
        instead of being found and rebuilt (see ``compile_cache._check_pocl_entries``).

        Nothing waits for the launch: a call on device arrays returns while its kernels may
        still wait for the caller's own work (waiting here hung a call whose operand waited
        on a ``UserEvent`` set after it). A first launch that has not run yet is looked at
        again by later calls, and the exit handler records whatever is left."""
        cache = self._cache
        if event is not None and kernel.int_ptr in cache.unrecorded:
            cache.unrecorded.discard(kernel.int_ptr)
            cache.first_launches.append(event)
        if not cache.first_launches:
            return
        complete = _cl().command_execution_status.COMPLETE  # 0; an error is negative
        waiting = [e for e in cache.first_launches if e.command_execution_status > complete]
        if len(waiting) < len(cache.first_launches):
            cache.first_launches = waiting
            from tilegemm.compile_cache import record_pocl_cache_now

            record_pocl_cache_now()

    @staticmethod
    def _build(target: _Place | _OwnDevice, program: OpenCLProgram, name: str,
               source: str) -> Any:
        cl = _cl()
        made: list[Any] = []
        try:
            built = built_program(target.context, target.device, source, program.options,
                                  made)
        except cl.Error as exc:
            try:
                log = made[-1].get_build_info(target.device, cl.program_build_info.LOG)
            except cl.Error:
                log = ""
            raise RuntimeError(
                f"OpenCL build of {program.rung} failed on {target.device.name.strip()} "
                f"with {' '.join(program.options)}:\n{(log or str(exc)).strip()}") from None
        return cl.Kernel(built, name)

    def _layout_kernel(self, target: _Place, dtype: np.dtype) -> Any:
        """The gather kernel for elements of ``dtype``'s size: it moves bits, so one kernel
        serves every type of a size (an int16 or bool operand is gathered before its
        conversion, in its own type)."""
        return self._layout_function(target, "gather", BITS[dtype.itemsize])

    def _layout_function(self, target: _Place | _OwnDevice, name: str, element: str) -> Any:
        """Kernel ``name`` of the layout helpers (``_layout.cl``) for OpenCL type
        ``element``, built once per device."""
        defines = {"TG_T": element, "TG_VW": "1", "TG_VT": element}
        if element == "double":
            defines["TG_FP64"] = "1"
        program = OpenCLProgram("layout", LAYOUT, tuple(sorted(defines.items())), (1, 1),
                                (1, 1))
        return self.kernel(target, program, name, program.source)

    def _checked_kernel(self, spec: KernelSpec, params: Mapping[str, int], dtype: np.dtype,
                        target: _Place | _OwnDevice) -> tuple[OpenCLProgram, Any]:
        """Device checks, the build, and the compiled kernel's own work-group limit; once
        per (context, device, rung, dtype, parameters): the checks read a dozen device
        properties, each a driver call, about 30 µs a call on PoCL."""
        cl = _cl()
        checked_key = (target.context.int_ptr, target.device.int_ptr, spec.key, dtype,
                       tuple(params.items()))
        checked = self._cache.checked.get(checked_key)
        if checked is not None:
            self._keep(target.context)
            return checked
        self._check_device(spec, params, dtype, target.device)
        program: OpenCLProgram = spec.program(params, dtype)
        kernel = self.kernel(target, program)
        key = (kernel.int_ptr, target.device.int_ptr)
        limit = self._cache.group_limits.get(key)
        if limit is None:  # a query per call was a tenth of a small product's time
            limit = self._cache.group_limits[key] = kernel.get_work_group_info(
                cl.kernel_work_group_info.WORK_GROUP_SIZE, target.device)
        threads = program.local[0] * program.local[1]
        if threads > limit:
            raise InvalidValueError(
                f"{spec.name}: {threads} work-items per work-group exceed the compiled kernel's "
                f"limit CL_KERNEL_WORK_GROUP_SIZE={limit} on {target.device.name.strip()}")
        self._cache.checked[checked_key] = (program, kernel)
        return program, kernel

    # -- operands -----------------------------------------------------------------------

    def _gather(self, target: _Place, x: Any, dtype: np.dtype, zoff: np.ndarray, rs: int,
                cs: int, rows: int, cols: int, dst: Any | None = None) -> Any:
        """Dense (len(zoff), rows, cols) copy of a strided device view, on the device."""
        cla = _cla()
        batch = len(zoff)
        if dst is None:
            dst = cla.empty(target.queue, (batch, rows, cols), dtype)
        if dst.size == 0:
            return dst
        offsets = _host_buffer(target.queue, np.ascontiguousarray(zoff, dtype=np.int64))
        kernel = self._layout_kernel(target, dtype)
        _enqueue(kernel, target.queue, (cols, rows, batch), None, x.base_data, offsets,
                 np.int64(rs), np.int64(cs), dst.base_data,
                 np.int64(dst.offset // dtype.itemsize), np.int32(rows), np.int32(cols))
        return dst

    def _device_operand(self, target: _Place, op: Operand, prob: GemmProblem,
                        which: str) -> tuple[Any, int, int]:
        """A pyopencl operand as (buffer, element offset, batch stride) with dense rows."""
        x = op.obj
        rows, cols = (prob.m, prob.k) if which == "a" else (prob.k, prob.n)
        mode = prob.batch_mode(which)
        if (op.dtype == prob.dtype and x.flags.c_contiguous and mode != "broadcast"
                and not (prob.trans_a if which == "a" else prob.trans_b)):
            # the usual case, read in place: dense rows, one matrix after another (a vector
            # is one dense row, or a column of one-element rows)
            return x.base_data, x.offset // op.dtype.itemsize, rows * cols * (mode == "full")
        own_lead = prob.a_batch_shape if which == "a" else prob.b_batch_shape
        view = _strided_view(x, prob, which)
        zoff, rs, cs = _batch_offsets(view, own_lead, prob.batch_shape,
                                     x.offset // x.dtype.itemsize)
        if op.dtype != prob.dtype:
            # Mixed dtypes: gathered dense in its own type, then converted once, on the
            # device. (PyOpenCL's astype of a transposed or strided view returns the
            # elements in memory order under row-major strides, or refuses the view.)
            shared = len(zoff) > 1 and bool(np.all(zoff == zoff[0]))  # a broadcast batch
            dense = self._gather(target, x, x.dtype, zoff[:1] if shared else zoff, rs, cs,
                                 rows, cols)
            dense = self._converted(target, dense, prob.dtype)
            step = 0 if dense.shape[0] == 1 else rows * cols
            return dense.base_data, dense.offset // dense.dtype.itemsize, step
        dense_rows = (cols <= 1 or cs == 1) and (rows <= 1 or rs == cols)
        if dense_rows:
            if len(zoff) == 1:
                return x.base_data, int(zoff[0]), 0
            steps = np.diff(zoff)
            if np.all(steps == steps[0]):
                return x.base_data, int(zoff[0]), int(steps[0])
        dense = self._gather(target, x, prob.dtype, zoff, rs, cs, rows, cols)
        # one gathered matrix serves the whole batch (a 2-D operand beside a batched one):
        # a batch stride would read past its end
        step = 0 if len(zoff) == 1 else rows * cols
        return dense.base_data, dense.offset // dense.dtype.itemsize, step

    def _converted(self, target: _Place, dense: Any, dtype: np.dtype) -> Any:
        """A dense device array converted to ``dtype`` on the device. PyOpenCL's astype
        maps neither float16 nor bool: bool bytes (0 or 1) are converted as uint8, float16
        by a kernel of our own (``widen_half``)."""
        cla = _cla()
        if dense.dtype == np.bool_:
            dense = dense.view(np.uint8)
        if dense.dtype != np.float16:
            with _LAUNCH_LOCK:  # PyOpenCL's kernels are shared too
                return dense.astype(dtype, queue=target.queue)
        out = cla.empty(target.queue, dense.shape, dtype)
        if out.size:
            kernel = self._layout_function(target, "widen_half",
                                           "double" if dtype == np.float64 else "float")
            _enqueue(kernel, target.queue, (out.size,), None, dense.base_data,
                     out.base_data, np.int64(out.size))
        return out

    def _fill_c0(self, target: _Place, c: Operand, prob: GemmProblem, dest: Any) -> None:
        """Put C0 (broadcast to the result) into ``dest`` before a beta != 0 launch."""
        shape3 = (prob.batch, prob.m, prob.n)
        if c.kind != "opencl":
            # Into a buffer made from host memory, then copied on the device behind the
            # work the call waits for: a blocking write would wait for that work (a caller's
            # UserEvent set after the call hung it).
            host = np.ascontiguousarray(
                np.broadcast_to(np.asarray(rounded_to_result(c.obj, prob), dtype=prob.dtype),
                                prob.out_shape)).reshape(dest.shape)
            source = _cla().Array(target.queue, dest.shape, prob.dtype,
                                  data=_host_buffer(target.queue, host))
            with _LAUNCH_LOCK:  # (see _enqueue)
                dest.with_queue(target.queue).setitem(slice(None), source)  # SVM too
            return
        x = c.obj
        if c.dtype != prob.dtype:
            raise InvalidTypeError(f"gemm: device c has dtype {c.dtype.name}, the result is "
                            f"{prob.dtype.name}; cast it on the device first")
        if _is_out(x, dest, prob):
            return  # out is c: already in place
        # c broadcast to the result shape, then viewed as (batch, M, N) with strides.
        shape = prob.out_shape
        strides = _broadcast_strides(x, shape)
        if prob.squeeze_n:
            shape, strides = shape + (1,), strides + (0,)
        if prob.squeeze_m:
            shape = shape[:-1] + (1,) + shape[-1:]
            strides = strides[:-1] + (0,) + strides[-1:]
        lead = shape[:-2]
        zoff = _offsets(lead, strides[:-2], x.offset // x.dtype.itemsize)
        self._gather(target, x, prob.dtype, zoff, strides[-2], strides[-1], prob.m, prob.n,
                     dst=dest.reshape(shape3))

    # -- running ------------------------------------------------------------------------

    def run(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a: Operand, b: Operand, c: Operand | None, out: Any, alpha: Any, beta: Any,
        target: Target | None = None,
    ) -> Any:
        cl = _cl()
        alpha, beta = resolve_scalars(prob, alpha, beta)
        ops = [op for op in (a, b, c) if op is not None]
        arrays = [op.obj for op in ops if op.kind == "opencl"]
        on_device = bool(arrays)
        if out is not None and on_device:
            arrays.append(out)
        target = self._place(arrays, target)  # (the sizes were checked by check_problem)
        program, kernel = self._checked_kernel(spec, params, prob.dtype, target)
        queue = target.queue
        shape3 = (prob.batch, prob.m, prob.n)
        itemsize = prob.dtype.itemsize

        if on_device:
            self._after_callers_work(queue, arrays)

        # The destination: out itself when it is a dense device array that overlaps no
        # input (c included, unless c is out itself: then C0 is already in place), else a
        # fresh (batch, M, N) array, copied into out at the end. out is written in its own
        # shape (the result's): the kernel writes the (batch, M, N) elements in that order,
        # and a reshape is one more PyOpenCL Array (20-30 µs, a fifth of a small call).
        dest = None
        if out is not None and on_device:
            if not out.flags.c_contiguous:
                raise InvalidValueError("out: a device out array must be C-contiguous")
            # An out sharing a buffer with A, B or c would be overwritten while read.
            overlaps = out.base_data is not None and any(
                op is not None and op.kind == "opencl" and op.obj.base_data is not None
                and _memory_root(op.obj.base_data) == _memory_root(out.base_data)
                and not (op is c and _is_out(c.obj, out, prob)) for op in (a, b, c))
            if not overlaps:
                dest = out
        # The operands first: a conversion that fails leaves out as it was.
        a_args = b_args = (None, 0, 0)  # no K: the kernels never touch A or B
        if not prob.empty and prob.k != 0:
            a_args = self._operand(target, a, prob, "a")
            b_args = self._operand(target, b, prob, "b")
        if dest is None:
            # a device result is made in its own shape: the kernel writes the same elements
            # in the same order as a (batch, M, N) array's, and a reshape is one more
            # PyOpenCL Array, about a tenth of a small call's Python
            dest = _empty_array(queue, prob.out_shape if on_device and out is None else shape3,
                                prob.dtype)
        if dest.size:
            if beta != 0:
                self._fill_c0(target, c, prob, dest)
            elif poison_enabled():
                with _LAUNCH_LOCK:  # PyOpenCL's kernels are shared too (see _enqueue)
                    dest.with_queue(queue).fill(poison_value(prob.dtype))  # buffer or SVM
        event = None
        if not prob.empty:
            if prob.k != 0:
                program, kernel, a_args, b_args, _ = self._panels(target, program, kernel,
                                                                  prob, a_args, b_args)
            event = self._launch(kernel, program, queue, prob, a_args, b_args,
                                 (dest.base_data, dest.offset // itemsize), alpha, beta)
        # (nothing is left for synchronize(): a host result has been read back, a device
        # result carries its event)

        if on_device:
            last = event  # the call's last command on this in-order queue, if no copy follows
            if out is not None:
                if dest is not out:
                    with _LAUNCH_LOCK:  # (a kernel for some layouts; see _enqueue)
                        out.reshape(shape3).with_queue(queue).setitem(slice(None), dest)  # SVM too
                    last = None
                result = out
            else:
                result = dest if dest.shape == prob.out_shape else dest.reshape(prob.out_shape)
            # PyOpenCL's operations on the result (get(), on any queue) wait for this
            done = cl.enqueue_marker(queue) if last is None else last
            result.add_event(done)
            caller = getattr(arrays[0], "queue", None)
            if caller is not None and not _same(caller, queue):
                # the call ran on our in-order queue (the caller's is out of order): a
                # marker on the caller's waits for it, so that finishing the caller's queue
                # covers this call, and a new result keeps the caller's queue
                result.add_event(cl.enqueue_marker(caller, wait_for=[done]))
                if out is None:
                    result = result.with_queue(caller)
            if not prob.empty:
                self._first_launch(kernel, event)
            return result
        host = out if out is not None else np.empty(prob.out_shape, dtype=prob.dtype)
        if host.size:
            cl.enqueue_copy(queue, host.reshape(shape3), dest.base_data,
                            src_offset=dest.offset, is_blocking=True)
        if not prob.empty:
            self._first_launch(kernel, event)  # (its launch has run: the read waited)
        return host

    def host_program(self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
                     target: Target) -> Any:
        """:meth:`run` for host operands of this problem's shapes, with what does not
        depend on the data done once: the device, the checks, the kernel.

        On PoCL (Xeon family 6 model 167) an 8×8 product took about 335 µs on the full path
        and 108 µs through this program in the same run; a kernel's launch and wait alone
        took 75-110. Each step left here is one the product needs: a buffer per operand
        (copied as it is created), the result's, the launch (with the packing of A and B
        where the program packs), and the blocking read."""
        cl = _cl()
        place = self._place([], target)
        program, kernel = self._checked_kernel(spec, params, prob.dtype, place)
        queue, context = place.queue, place.context
        shape3 = (prob.batch, prob.m, prob.n)
        nbytes = math.prod(shape3) * prob.dtype.itemsize
        fill = poison_value(prob.dtype)
        write = cl.mem_flags.READ_WRITE

        def run(a3: np.ndarray, b3: np.ndarray, c3: np.ndarray, alpha: Any,
                beta: Any) -> None:
            a_args, b_args = _host_operand_args(queue, a3), _host_operand_args(queue, b3)
            if beta != 0:  # c3 holds C0 (gemm's c), which the kernel reads
                dest = cl.Buffer(context, write | cl.mem_flags.COPY_HOST_PTR, hostbuf=c3)
            elif poison_enabled():  # as run() fills its result on the device
                dest = cl.Buffer(context, write | cl.mem_flags.COPY_HOST_PTR,
                                 hostbuf=np.full(shape3, fill, prob.dtype))
            else:
                dest = cl.Buffer(context, write, nbytes)
            used, used_kernel, a_args, b_args, _ = self._panels(place, program, kernel, prob,
                                                                a_args, b_args)
            event = self._launch(used_kernel, used, queue, prob, a_args, b_args, (dest, 0),
                                 alpha, beta)
            cl.enqueue_copy(queue, c3, dest, is_blocking=True)
            self._first_launch(used_kernel, event)

        return run

    def host_alpha_limit(self, program: Any, prob: GemmProblem) -> float:
        """For a float product, any finite alpha: the kernels scale each finished sum once,
        as they store it (with beta times the C0 that :meth:`host_program`'s program copies
        to the device). Integer products convert their scalars with checks of their own."""
        return float(np.finfo(prob.dtype).max) if prob.dtype.kind == "f" else 0.0

    def _operand(self, target: _Place, op: Operand, prob: GemmProblem,
                 which: str) -> tuple[Any, int, int]:
        if op.kind == "opencl":
            return self._device_operand(target, op, prob, which)
        x3 = host_operand_3d(op.obj, prob, which)
        return _host_operand_args(target.queue, x3)

    def _panels(self, target: _Place | _OwnDevice, program: OpenCLProgram, kernel: Any,
                prob: GemmProblem, a_args: tuple[Any, int, int], b_args: tuple[Any, int, int],
                ) -> tuple[OpenCLProgram, Any, tuple[Any, int, int], tuple[Any, int, int], Any]:
        """(program, kernel, A's and B's arguments, the first packing's event) for the
        launch: where the program reads A and B packed for this product
        (``OpenCLProgram.packs``), its variant that does and both operands packed into
        panels on the device; else all as given and no event. Packing is skipped, not
        refused, when the panels would not fit beside A, B and C in the device's memory."""
        item = prob.dtype.itemsize
        if not program.packs(prob.m, prob.n, prob.k, item, b_args[1:]):
            return program, kernel, a_args, b_args, None
        k = prob.k
        # (arguments, extent, panel width, k stride, outer stride) of A, then B
        cases = ((a_args, prob.m, program.panels[0], 1, k),
                 (b_args, prob.n, program.panels[1], prob.n, 1))
        shapes = [((prob.batch if args[2] else 1), -(-extent // width), k, width)
                  for args, extent, width, _, _ in cases]
        sizes = [math.prod(shape) * item for shape in shapes]
        used = (prob.operand_elements("a") + prob.operand_elements("b")
                + prob.batch * prob.m * prob.n) * item  # A, B and C, as _check_sizes counts
        device = target.device
        if max(sizes) > device.max_mem_alloc_size or used + sum(sizes) > device.global_mem_size:
            return program, kernel, a_args, b_args, None
        pack = self._layout_function(target, "pack_panels", BITS[item])
        packed, events = [], []
        for ((buf, off, bs), extent, width, ks, js), shape in zip(cases, shapes, strict=True):
            dst = _cla().empty(target.queue, shape, prob.dtype)
            events.append(_enqueue(
                pack, target.queue, (k, shape[1], shape[0]), None, buf, np.int64(off),
                np.int64(bs), np.int64(ks), np.int64(js), np.int32(k), np.int32(extent),
                np.int32(width), dst.base_data))
            packed.append((dst.base_data, 0, shape[1] * k * width if shape[0] > 1 else 0))
        variant = program.with_panels
        return variant, self.kernel(target, variant), packed[0], packed[1], events[0]

    @staticmethod
    def _launch(kernel: Any, program: OpenCLProgram, queue: Any, prob: GemmProblem,
                a_args: tuple[Any, int, int], b_args: tuple[Any, int, int],
                c_args: tuple[Any, int], alpha: Any, beta: Any) -> Any:
        i64 = np.int64
        return _enqueue(
            kernel, queue, program.global_size(prob.batch, prob.m, prob.n), program.local_size,
            np.int32(prob.m), np.int32(prob.n), np.int32(prob.k),
            a_args[0], i64(a_args[1]), i64(a_args[2]),
            b_args[0], i64(b_args[1]), i64(b_args[2]),
            c_args[0], i64(c_args[1]), alpha, beta,
        )

    def prepare(
        self, spec: KernelSpec, params: Mapping[str, int], prob: GemmProblem,
        a3: np.ndarray, b3: np.ndarray, target: Target | None = None,
    ) -> Prepared:
        """Operands copied to the device once; ``elapsed`` reads OpenCL profiling events."""
        cla = _cla()
        own = self.own_device(None if target is None else target.index)
        self._check_sizes(own.device, prob)
        program, kernel = self._checked_kernel(spec, params, prob.dtype, own)
        queue = own.queue
        t = prob.dtype.type
        if prob.k == 0:
            a_args = b_args = (None, 0, 0)
        else:
            da = cla.to_device(queue, np.ascontiguousarray(a3, dtype=prob.dtype))
            db = cla.to_device(queue, np.ascontiguousarray(b3, dtype=prob.dtype))
            a_args = (da.data, 0, prob.m * prob.k if a3.shape[0] > 1 else 0)
            b_args = (db.data, 0, prob.k * prob.n if b3.shape[0] > 1 else 0)
        dc = cla.empty(queue, (prob.batch, prob.m, prob.n), prob.dtype)
        if poison_enabled() and dc.size:  # so the verified first launch proves every write
            pattern = np.array([poison_value(prob.dtype)], dtype=prob.dtype)
            _cl().enqueue_fill_buffer(queue, dc.data, pattern, 0, dc.nbytes)

        def enqueue() -> tuple[Any, Any] | None:
            """(first event, last event) of one product, the packing of A and B included."""
            if dc.size == 0:
                return None
            used, used_kernel, used_a, used_b, first = program, kernel, a_args, b_args, None
            if prob.k != 0:
                used, used_kernel, used_a, used_b, first = self._panels(
                    own, program, kernel, prob, a_args, b_args)
            last = self._launch(used_kernel, used, queue, prob, used_a, used_b, (dc.data, 0),
                                t(1), t(0))
            return (last if first is None else first, last)

        def launch() -> None:
            enqueue()

        def fetch() -> np.ndarray:
            return dc.get(queue)

        def elapsed(n: int) -> list[float]:
            spans = [enqueue() for _ in range(n)]
            queue.finish()
            return [(s[1].profile.end - s[0].profile.start) * 1e-9 if s is not None else 0.0
                    for s in spans]

        self._used[queue.int_ptr] = queue
        return Prepared(launch=launch, fetch=fetch, elapsed=elapsed)

    def synchronize(self) -> None:
        used, self._used = self._used, {}
        for queue in used.values():
            queue.finish()



def _cla() -> Any:
    import pyopencl.array

    return pyopencl.array


# (shape, dtype) -> a queue-less array of that shape with no buffer (see _empty_array)
_SHAPED: dict[tuple[tuple[int, ...], np.dtype], Any] = {}


def _empty_array(queue: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """``pyopencl.array.empty(queue, shape, dtype)``, for a shape seen before at an eighth
    of the cost. PyOpenCL's constructor checks the shape with NumPy (about 24 µs on a Xeon
    VM, a quarter of a small call on pyopencl arrays); ``empty_like`` of an array of that
    shape takes its fast constructor (3 µs) and allocates a buffer of the right size in
    ``queue``'s context. The arrays it copies have no queue, context or memory (a
    placeholder stands for their data, which ``empty_like`` never reads), so keeping them
    keeps no caller's context alive."""
    if not shape or 0 in shape:
        return _cla().empty(queue, shape, dtype)  # no buffer to allocate, no context to take
    key = (shape, dtype)
    like = _SHAPED.get(key)
    if like is None:
        if len(_SHAPED) >= 64:
            _SHAPED.clear()
        like = _SHAPED[key] = _cla().Array(None, shape, dtype, data=_NO_DATA)
    return _cla().empty_like(like, queue=queue)


_NO_DATA = object()


_LAUNCH_LOCK = threading.Lock()  # see _enqueue
# callers' contexts whose kernels and queues stay cached (OpenCLBackend._keep)
CONTEXTS_KEPT = 8
_CACHE_LOCK = threading.Lock()


def _enqueue(kernel: Any, queue: Any, global_size: Any, local_size: Any, *args: Any) -> Any:
    """Enqueue ``kernel`` over ``global_size`` with ``args`` (buffers, None and NumPy
    scalars) and return its event.

    The kernel's first launch tells PyOpenCL the types of its scalar arguments (those of
    the NumPy scalars given; every call site passes the same types each time), which
    makes later launches pack them in one step. Without the types PyOpenCL sets each
    scalar separately, at about 6 µs each: 80 µs of a GEMM launch's 87 on PoCL, where the
    typed launch takes 3 µs.

    Setting a kernel's arguments and enqueueing it is one step under a lock: a kernel
    object holds one set of arguments, and OpenCL does not make ``clSetKernelArg`` safe
    for one kernel from several threads. Calls from several Python threads at once set
    each other's arguments, or crashed the process in PoCL. PyOpenCL's own array
    operations (``fill``, ``astype``) share their kernels the same way, so tilegemm makes
    them under this lock too."""
    with _LAUNCH_LOCK:
        if not kernel.__dict__.get("tilegemm_typed"):
            kernel.set_scalar_arg_dtypes(
                [x.dtype if isinstance(x, np.generic) else None for x in args])
            kernel.tilegemm_typed = True
        return kernel(queue, global_size, local_size, *args)


def _host_operand_args(queue: Any, x3: np.ndarray) -> tuple[Any, int, int]:
    """A kernel's (buffer, offset, batch stride) arguments for the C-contiguous host operand
    ``x3`` of shape (batch or 1, rows, cols): its copy on the device, from its start, and
    stride 0 for one matrix shared by every product of the batch."""
    return _host_buffer(queue, x3), 0, (x3[0].size if x3.shape[0] > 1 else 0)


def _host_buffer(queue: Any, host: np.ndarray) -> Any:
    """A read-only device buffer holding a copy of the non-empty, C-contiguous ``host``.

    The driver copies the data when it creates the buffer, so the host array may go at
    once and nothing waits on the queue. ``pyopencl.array.to_device`` enqueues a blocking
    write instead: a round trip through the queue per operand, which on PoCL (about 0.1 ms
    each) was a third of a small product's time."""
    cl = _cl()
    return cl.Buffer(queue.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                     hostbuf=host)


def _is_out(c: Any, out: Any, prob: GemmProblem) -> bool:
    """Whether device array ``c`` is ``out`` itself (the same elements in the same order),
    so C0 is in place already."""
    return (_same(c.base_data, out.base_data) and c.offset == out.offset
            and c.flags.c_contiguous and c.shape == prob.out_shape)


def _one_context(arrays: Sequence[Any]) -> None:
    """Refuse device arrays of one call that live in different contexts."""
    for x in arrays[1:]:
        if not _same(x.context, arrays[0].context):
            raise InvalidValueError(
                "pyopencl arrays from different OpenCL contexts were passed together; "
                "all device arrays of one call must live in the same context (copy them "
                "into one with pyopencl.array.to_device)")


def _out_of_order(queue: Any) -> bool:
    """Whether ``queue`` may run its commands out of order (the call's own steps, a
    conversion then the product, must not)."""
    cl = _cl()
    return bool(queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)


def _elem_strides(x: Any) -> tuple[int, ...]:
    return tuple(s // x.dtype.itemsize for s in x.strides)


def _strided_view(x: Any, prob: GemmProblem, which: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, element strides) of operand ``which`` after 1-D promotion and transpose."""
    shape, strides = tuple(x.shape), _elem_strides(x)
    if which == "a":
        if prob.squeeze_m:
            shape, strides = (1,) + shape, (0,) + strides
        if prob.trans_a:
            shape = shape[:-2] + (shape[-1], shape[-2])
            strides = strides[:-2] + (strides[-1], strides[-2])
    else:
        if prob.squeeze_n:
            shape, strides = shape + (1,), strides + (0,)
        if prob.trans_b:
            shape = shape[:-2] + (shape[-1], shape[-2])
            strides = strides[:-2] + (strides[-1], strides[-2])
    return shape, strides


def _batch_offsets(view: tuple[tuple[int, ...], tuple[int, ...]], own_lead: tuple[int, ...],
                   batch_shape: tuple[int, ...], base: int) -> tuple[np.ndarray, int, int]:
    """Element offset of each matrix of the (broadcast) batch, and row/column strides."""
    shape, strides = view
    lead_strides = strides[:-2]
    pad = len(batch_shape) - len(lead_strides)
    lead_strides = (0,) * pad + lead_strides
    if math.prod(own_lead) <= 1:
        # One matrix serves the whole batch.
        return np.array([base], dtype=np.int64), strides[-2], strides[-1]
    eff = tuple(0 if own == 1 else s for own, s in zip(own_lead, lead_strides))
    return _offsets(batch_shape, eff, base), strides[-2], strides[-1]


def _offsets(shape: tuple[int, ...], strides: Sequence[int], base: int) -> np.ndarray:
    off = np.array([base], dtype=np.int64)
    for n, s in zip(shape, strides):
        off = (off[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).ravel()
    return off


def _broadcast_strides(x: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of ``x`` broadcast to ``shape`` (0 along broadcast axes)."""
    own, strides = tuple(x.shape), _elem_strides(x)
    pad = len(shape) - len(own)
    own, strides = (1,) * pad + own, (0,) * pad + strides
    return tuple(0 if o == 1 and n != 1 else s for o, n, s in zip(own, shape, strides))


BACKEND = OpenCLBackend()
