"""The tuning cache: one JSON file of best parameters per device, dtype and shape bucket.

Where: ``$TILEGEMM_CACHE_DIR/tune.json`` if that variable is set (tests point it at a
temporary directory), else ``platformdirs.user_cache_dir("tilegemm")/tune.json``.

Key: backend, device name, architecture (CUDA compute capability, CPU machine type and
vector ISA), dtype, shape bucket (M, N, K each rounded up to a power of two), rung, and the
tilegemm version that measured it; :func:`tilegemm.tune.select.device_id` makes the
device's part (a host CPU's name carries its family, model and ISA). A lookup for a device
falls back from the exact device to any device of the same architecture (an entry tuned on
one H100 is a good guess for another, one tuned on an AVX-512 CPU for another AVX-512 CPU);
after that :mod:`tilegemm.tune.select` uses built-in defaults.

A cache is a convenience, never a reason to fail: an unreadable or corrupt file, or one
written by another tilegemm version, is ignored with a :class:`TuneCacheWarning`.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tilegemm.errors import user_stacklevel

FORMAT = 1
FILENAME = "tune.json"


class TuneCacheWarning(UserWarning):
    """The tuning cache could not be used (it is ignored, never fatal)."""


@dataclass(frozen=True)
class DeviceId:
    backend: str
    name: str
    arch: str  # "sm_90", "x86_64", ...; "" when unknown


@dataclass
class Entry:
    backend: str
    device: str
    arch: str
    dtype: str
    bucket: list[int]  # [M, N, K] rounded up to powers of two
    kernel: str
    params: dict[str, int]
    seconds: float
    gflops: float
    shape: list[int] = field(default_factory=list)  # the measured [M, N, K, batch]
    version: str = ""
    when: float = 0.0
    # precision= the entry computes ("ieee", "tf32", "3xtf32"): a tensor-core entry is used
    # only for calls asking for that precision, never for kernel="auto" at "ieee".
    precision: str = "ieee"
    # Measured slower than what kernel="auto" runs untuned: the entry serves calls naming
    # its rung (matmul(kernel="shared")), and kernel="auto" never switches to it.
    named_only: bool = False

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.backend, self.device, self.arch, self.dtype, tuple(self.bucket),
                self.kernel, self.precision)


def current_version() -> str:
    from tilegemm import __version__

    return __version__


def cache_dir() -> Path:
    env = os.environ.get("TILEGEMM_CACHE_DIR")
    if env:
        # "~/x" as a shell would expand it (it was a folder named "~" in each working
        # directory, while `tilegemm cache` named the expanded one)
        return absolute_once(env)
    return _user_cache_dir()


@functools.cache
def absolute_once(env: str) -> Path:
    """A directory named by an environment variable: ``~`` expanded, and a relative path
    made absolute against the working directory when the process first reads it, so one
    process keeps one cache after an ``os.chdir`` (PoCL, handed the path once, resolved a
    relative one against each new directory and failed to build)."""
    return Path(env).expanduser().absolute()


@functools.cache
def _user_cache_dir() -> Path:
    """Looked up once per process (``kernel="auto"`` reads the cache on every call)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("tilegemm"))


def cache_path() -> Path:
    return _file_in(cache_dir())


@functools.cache
def _file_in(folder: Path) -> Path:
    """The cache file in ``folder``, one Path object per folder: every full-path call
    looks it up twice, and joining the paths anew took 2.0 µs each time, the look-up
    0.9 µs (Xeon family 6 model 167)."""
    return folder / FILENAME


def bucket(x: int) -> int:
    """``x`` rounded up to a power of two (0 stays 0): 1000 → 1024, 4096 → 4096."""
    return 0 if x <= 0 else 1 << (x - 1).bit_length()


def shape_bucket(m: int, n: int, k: int) -> list[int]:
    return [bucket(m), bucket(n), bucket(k)]


def load(path: Path | None = None) -> list[Entry]:
    """Current-version entries of the cache file; [] (with a warning) if it is unusable."""
    path = path or cache_path()
    try:
        raw_bytes = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        warnings.warn(f"tuning cache {path} cannot be read ({exc}); ignoring it",
                      TuneCacheWarning, stacklevel=user_stacklevel())
        return []
    try:
        data = json.loads(raw_bytes.decode("utf-8"))  # not UTF-8: a ValueError, corrupt
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} tilegemm tuning cache")
        raw = data["entries"]
        entries = [Entry(**e) for e in raw]
        for e in entries:
            if not _well_typed(e):
                raise ValueError(f"malformed entry {e}")
    except (ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"tuning cache {path} is corrupt ({exc}); ignoring it "
                      "(run 'tilegemm tune --clear' to remove it)", TuneCacheWarning,
                      stacklevel=user_stacklevel())
        return []
    version = current_version()
    stale = [e for e in entries if e.version != version]
    if stale:
        warnings.warn(f"tuning cache {path}: ignoring {len(stale)} entries measured by another "
                      f"tilegemm version (this is {version}); re-run 'tilegemm tune'",
                      TuneCacheWarning, stacklevel=user_stacklevel())
    return [e for e in entries if e.version == version]


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _well_typed(e: Entry) -> bool:
    """Whether every field has the type the lookups compare and sort by (a hand-edited
    ``"gflops": "fast"`` made the lookup raise TypeError inside every call)."""
    return (all(isinstance(v, str) for v in (e.backend, e.device, e.arch, e.dtype, e.kernel,
                                              e.version, e.precision))
            and isinstance(e.params, dict)
            and all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                    for k, v in e.params.items())
            and isinstance(e.bucket, list) and len(e.bucket) == 3
            and all(isinstance(b, int) for b in e.bucket)
            and isinstance(e.shape, list) and all(isinstance(x, int) for x in e.shape)
            and _number(e.seconds) and _number(e.gflops) and _number(e.when)
            and isinstance(e.named_only, bool))


def save(entries: list[Entry], path: Path | None = None) -> Path:
    """Write atomically (a crash mid-write never leaves a half file, nor a temporary)."""
    # imported here: reading the cache (every kernel="auto" process) needs none of it
    from tilegemm.compile_cache import write_atomic

    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "entries": [asdict(e) for e in entries]}
    # parameters in the rung's order, as shown everywhere
    write_atomic(path, json.dumps(payload, indent=1), prefix=".tune-")
    _changed()
    return path


def _changed() -> None:
    """This process changed the tuning cache file: the decisions matmul remembered for
    repeated calls are dropped at once (another process's change is seen by them within
    ``remembered.STAT_INTERVAL_NS``)."""
    from tilegemm import remembered

    remembered.forget()


def record(entry: Entry, path: Path | None = None) -> Path:
    """Add or replace the entry with the same key (keeps the other entries). Locked: two
    processes recording at once each read the file, add their entry and write it back,
    and without the lock one's entry was lost."""
    from tilegemm.compile_cache import locked

    entry.version = entry.version or current_version()
    entry.when = entry.when or time.time()
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_name(f".{path.name}.lock")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TuneCacheWarning)  # a bad file is simply replaced
            entries = [e for e in load(path) if e.key != entry.key]
        entries.append(entry)
        return save(entries, path)


def clear(path: Path | None = None) -> bool:
    """Remove the tuning cache file (a directory in its place too: every call warned that
    it could not be read, and ``tune --clear`` failed on it). Whether there was one."""
    path = path or cache_path()
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
        _changed()
        return True
    try:
        path.unlink()
    except (FileNotFoundError, NotADirectoryError):  # (a file where its folder would be)
        return False
    _changed()
    return True


def lookup(entries: list[Entry], device: DeviceId, dtype: str, m: int, n: int, k: int,
           kernel: str | None = None, precision: str = "ieee") -> Entry | None:
    """Best entry for the shape's bucket and precision: this exact device, else its
    architecture. ``kernel=None`` (what ``kernel="auto"`` runs) skips the entries kept only
    for calls naming their rung; ``kernel=X`` takes X's entry either way."""
    found = ranked(entries, device, dtype, m, n, k, kernel, precision)
    return found[0] if found else None


def ranked(entries: list[Entry], device: DeviceId, dtype: str, m: int, n: int, k: int,
           kernel: str | None = None, precision: str = "ieee") -> list[Entry]:
    """Every entry :func:`lookup` could answer with, best first (this device's by speed,
    then its architecture's): a caller whose best entry no longer fits takes the next."""
    want = shape_bucket(m, n, k)
    same = [e for e in entries if e.backend == device.backend and e.dtype == dtype
            and e.bucket == want and e.precision == precision
            and (e.kernel == kernel if kernel is not None else not e.named_only)]
    tiers = (  # (an entry of this device written with no architecture: an OpenCL CPU
        # device's, before its key named the host's)
        [e for e in same if e.device == device.name and e.arch in (device.arch, "")],
        [e for e in same if device.arch and e.arch == device.arch],
    )
    order: list[Entry] = []
    for tier in tiers:
        order += [e for e in sorted(tier, key=lambda e: -e.gflops) if e not in order]
    return order
