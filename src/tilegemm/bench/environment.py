"""Where a run happened: devices, driver, library versions, git commit, file-name slugs.

A benchmark number without the device, the driver and the code version is not
reproducible; every results file carries these.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from tilegemm.backends.base import Backend, Target
from tilegemm.backends.cpu import cpu_family_model, cpu_name, usable_cpus

__all__ = ["backend_info", "cpu_family_model", "cpu_name", "cpu_results_stem", "git_commit",
           "host_info", "numpy_blas", "slug", "versions", "write_cpu_results", "write_results"]


# The checkout tilegemm runs from, when it runs from one: <checkout>/src/tilegemm/bench/
_CHECKOUT = Path(__file__).resolve().parents[3]


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str:
    """The commit of the checkout tilegemm runs from (``-dirty`` if modified), or "unknown"
    (``cwd``: the repository to ask instead).

    Installed (not from a checkout), the package's folder may lie inside another
    repository, a project whose virtual environment or ``--target`` folder holds it: that
    project's commit was recorded as tilegemm's. So the repository's top level must be
    tilegemm's own checkout, the folder above ``src/tilegemm``."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        if cwd is None:
            top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where,
                                 capture_output=True, text=True, timeout=5,
                                 check=True).stdout.strip()
            if not top or Path(top).resolve() != _CHECKOUT:
                return "unknown"
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "") if sha else "unknown"


# (NVRTC compiles the CUDA C rungs and nvdisasm reads every SASS figure: their versions
# decide register counts and instruction mixes as the numba-cuda packages do)
PACKAGES = ("tilegemm", "numpy", "numba", "numba-cuda", "pyopencl", "pocl-binary-distribution",
            "cuda-bindings", "cuda-core", "nvidia-nvjitlink", "nvidia-cuda-nvrtc",
            "nvidia-cuda-nvdisasm", "cupy-cuda12x", "cupy-cuda13x", "torch")


def versions() -> dict[str, str]:
    """Python's and every installed package's version that changes what a number means."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return found


# Settings that change what a number means (thread counts, TF32); recorded when set.
ENV_VARS = ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "NUMBA_NUM_THREADS", "CUPY_TF32", "NVIDIA_TF32_OVERRIDE", "NUMBA_ENABLE_CUDASIM",
            "POCL_MAX_PTHREAD_COUNT", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_ENABLE_AVX")


def numpy_blas() -> dict[str, str]:
    """NumPy's BLAS and, for OpenBLAS, the kernels it picked for this CPU ("Haswell",
    "SkylakeX", "Zen"...).

    OpenBLAS chooses its kernels from the CPUID it recognises; a CPU newer than the library
    (a Zen 5 EPYC under OpenBLAS 0.3.31, say) gets an older generation's kernels, AVX2
    instead of AVX-512, and NumPy's speed there is not what the hardware can do. A ratio
    to NumPy means little without this; ``OPENBLAS_CORETYPE`` overrides the choice.
    """
    import ctypes

    import numpy as np

    from tilegemm.bench.host_blas import openblas_library

    found: dict[str, str] = {}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        found.update(name=str(blas.get("name", "")), version=str(blas.get("version", "")))
    except Exception:  # the config layout differs across NumPy versions; nice to have only
        pass
    lib = openblas_library()
    if lib is None:
        return found
    for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                   "openblas_get_corename64_", "openblas_get_corename"):
        fn = getattr(lib, symbol, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            found["openblas_kernels"] = fn().decode()
            return found
    return found


def host_info() -> dict[str, Any]:
    env = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
    # the CPUs this process may use (a container's or taskset's set), not the machine's
    return {"cpu": cpu_name(), "cores": usable_cpus(), "machine": platform.machine(),
            "system": f"{platform.system()} {platform.release()}", "env": env,
            "numpy_blas": numpy_blas()}


def backend_info(backend: Backend, target: Target | None = None) -> dict[str, Any]:
    """What a results file records about the device: the status, then the Target's name,
    kind and architecture and the backend's own details (driver, compute capability...)."""
    status = backend.status()
    info: dict[str, Any] = {"usable": status.usable, "reason": status.reason,
                            "simulated": status.simulated, "devices": list(status.devices),
                            "device": status.devices[0] if status.devices else ""}
    if not status.usable:
        return info
    try:
        target = target or backend.target()
        info.update(device=target.name, kind=target.kind, arch=target.arch, key=target.key)
        info.update(backend.device_details(target))
    except Exception as exc:  # details are nice to have; never fail a run on them
        info["device_info_error"] = str(exc)
    return info


def cpu_results_stem(kind: str, isa: str) -> str:
    """The name of a CPU results file: ``<kind>-<cpu>-<isa>[-<family>-<model>]``.

    The ISA and the family/model keep two machines that report the same vendor string
    (two Xeon generations under KVM, say) from overwriting each other's results.
    """
    fm = cpu_family_model()
    return "-".join(part for part in (kind, slug(cpu_name()), isa, fm and f"m{fm}") if part)


def write_results(path: Path, doc: dict[str, Any], root: Path | None = None,
                  indent: int = 2) -> Path:
    """Write a benchmark's results document to ``path`` (folders made as needed) and say
    so, relative to ``root`` (the repository) when inside it: the one writer of the
    benchmark scripts.

    A file of the same name from an earlier run is not lost: its document (less its own
    ``history``) is appended to the new one's ``history``, oldest first. The documentation
    cites figures from these files, and a rerun on the same kind of machine used to
    replace the run a page describes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    history = _earlier_runs(path)
    if history:
        doc = {**doc, "history": history}
    path.write_text(json.dumps(doc, indent=indent) + "\n")
    shown = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
    print(f"wrote {shown}")
    return path


def _earlier_runs(path: Path) -> list[Any]:
    """The runs a results file at ``path`` holds, oldest first: its ``history`` and then
    the document itself; a file that is not a JSON object is kept as its text."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    try:
        old = json.loads(text)
    except ValueError:
        return [{"unparsed": text}]
    if not isinstance(old, dict):
        return [old]
    earlier = old.pop("history", [])
    return [*(earlier if isinstance(earlier, list) else [earlier]), old]


def write_cpu_results(root: Path, kind: str, isa: str, doc: dict[str, Any],
                      indent: int = 2, suffix: str = "") -> Path:
    """Write a CPU benchmark's results document to
    ``<root>/benchmarks/results/<stem><suffix>.json`` (``root``: the repository; the stem
    from :func:`cpu_results_stem`, ``isa`` "" for results that do not depend on it;
    ``suffix`` tells apart a second run under other settings)."""
    path = root / "benchmarks" / "results" / f"{cpu_results_stem(kind, isa)}{suffix}.json"
    return write_results(path, doc, root, indent)


def slug(text: str) -> str:
    """A file-name-safe lower-case form: ``NVIDIA H100 80GB HBM3`` → ``nvidia-h100-80gb-hbm3``."""
    s = re.sub(r"\(r\)|\(tm\)|\bcpu\b|@.*$", "", text.lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "device"


def short_slug(text: str, words: int = 4) -> str:
    """A short file-name form of a device name: list index, parenthesised details, driver
    prefixes and filler words dropped, at most ``words`` words.

    ``[0] pthread-Intel(R) Xeon(R) Platinum 8480+ (cpu, Portable Computing Language) default``
    → ``intel-xeon-platinum-8480``.
    """
    t = re.sub(r"^\s*\[\d+\]\s*", "", text)
    t = re.sub(r"\((r|tm)\)", "", t, flags=re.IGNORECASE)
    t = re.sub(r"\([^)]*\)", " ", t)
    t = re.sub(r"^pthread-|\b(default|processor|cpu|with|\d+-core)\b", " ", t.strip(),
               flags=re.IGNORECASE)
    return "-".join(slug(t).split("-")[:words]) or "device"

