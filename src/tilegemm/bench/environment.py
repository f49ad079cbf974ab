"""Where a run happened: devices, driver, library versions, git commit, file-name slugs.

A benchmark number without the device, the driver and the code version is not
reproducible; every results file carries these.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from tilegemm.backends.base import Backend


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str:
    """The commit of the checkout tilegemm runs from (``-dirty`` if modified), or "unknown"."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "") if sha else "unknown"


@cache
def cpu_name() -> str:
    """The CPU model (from /proc/cpuinfo on Linux), else what ``platform`` knows; the one
    reader used by results files, benchmark scripts and the tuning cache's device key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


# Settings that change what a number means (thread counts, TF32); recorded when set.
ENV_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS",
            "CUPY_TF32", "NVIDIA_TF32_OVERRIDE", "NUMBA_ENABLE_CUDASIM", "POCL_MAX_PTHREAD_COUNT")


def host_info() -> dict[str, Any]:
    env = {k: os.environ[k] for k in ENV_VARS if k in os.environ}
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "machine": platform.machine(),
            "system": f"{platform.system()} {platform.release()}", "env": env}


def backend_info(backend: Backend) -> dict[str, Any]:
    """Device name, compute capability and driver of the backend's (first) device."""
    status = backend.status()
    info: dict[str, Any] = {"usable": status.usable, "reason": status.reason,
                            "simulated": status.simulated, "devices": list(status.devices),
                            "device": status.devices[0] if status.devices else ""}
    if backend.name == "cpu":
        info["device"] = cpu_name()
    if backend.name == "cuda" and status.usable and not status.simulated:
        info.update(_cuda_details())
    describe = getattr(backend, "device_info", None)  # a backend may add its own details
    if callable(describe):
        try:
            info.update(describe())
        except Exception as exc:  # details are nice to have; never fail a run on them
            info["device_info_error"] = str(exc)
    return info


def _cuda_details() -> dict[str, Any]:
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    details: dict[str, Any] = {"device": name,
                               "compute_capability": "{}.{}".format(*dev.compute_capability)}
    try:
        major, minor = cuda.cudadrv.driver.driver.get_version()
        details["driver_cuda_version"] = f"{major}.{minor}"
    except Exception:
        pass
    try:
        major, minor = cuda.runtime.get_version()
        details["runtime_cuda_version"] = f"{major}.{minor}"
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            details["driver"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        details["l2_bytes"] = int(dev.L2_CACHE_SIZE)
        details["sm_count"] = int(dev.MULTIPROCESSOR_COUNT)
    except Exception:
        pass
    return details


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

