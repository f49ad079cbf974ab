"""The persistent compile cache: reuse across processes, corrupt and stale entries, an
unwritable directory, and the ``tilegemm cache`` command. Compilations are counted (Numba's
own cache hit counters), never timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from tilegemm import compile_cache
from tilegemm.compile_cache import CompileCacheWarning, fill_template, load_module

# A one-function template in the shape of the real ones (a header and a replaceable block);
# compiles in well under a second.
TEMPLATE = '''
import numba
from numba import njit

# @header
SCALE = 1
CACHE = False
# @end-header


# @body
def twice(x):
    return x
# @end-body


twice = njit(numba.float64(numba.float64), cache=CACHE)(twice)
COMPILED = (twice,)
'''

LOAD = """
import json, sys
from tilegemm import compile_cache
m = compile_cache.load_module("probe", sys.argv[1], {"kernel": "probe"})
print(json.dumps({"stats": compile_cache.STATS, "value": m.twice(2.0)}))
"""


def _source(scale: int = 3) -> str:
    return fill_template(TEMPLATE, {"SCALE": scale, "CACHE": False},
                         {"body": "def twice(x):\n    return SCALE * x\n"})


def _in_subprocess(cache: Path, source: str) -> dict:
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(cache))
    out = subprocess.run([sys.executable, "-c", LOAD, source], env=env, capture_output=True,
                         text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _counts() -> tuple[int, int]:
    return compile_cache.STATS["compiled"], compile_cache.STATS["loaded"]


def test_second_process_loads_instead_of_compiling(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    before = _counts()
    m = load_module("probe", _source(), {"kernel": "probe"})
    assert m.twice(2.0) == 6.0
    assert _counts() == (before[0] + 1, before[1])  # compiled here, and saved
    again = _in_subprocess(tmp_path, _source())
    assert again["value"] == 6.0
    assert again["stats"] == {"compiled": 0, "loaded": 1}
    # other constants are another entry: compiled, not loaded from the first one
    assert _in_subprocess(tmp_path, _source(5)) == {"stats": {"compiled": 1, "loaded": 0},
                                                    "value": 10.0}


SOURCE_COMPILES = """
import importlib._bootstrap_external as be, json, sys
from tilegemm import compile_cache
compiled = []
plain = be.SourceLoader.source_to_code
def spy(self, data, path, **kw):
    compiled.append(str(path))
    return plain(self, data, path, **kw)
be.SourceLoader.source_to_code = spy
m = compile_cache.load_module("probe", sys.argv[1], {"kernel": "probe"})
print(json.dumps({"value": m.twice(2.0), "compiled": [p for p in compiled if "probe" in p]}))
"""


def test_an_entrys_bytecode_is_kept_where_python_would_not_write_it(tmp_path, monkeypatch):
    """Under PYTHONDONTWRITEBYTECODE (container images set it) the entry's bytecode is
    written by the cache, so a later process loads it rather than compiling the source; a
    bytecode file that no longer matches its source is written again."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    m = load_module("probe", _source(31), {"kernel": "probe"})
    assert m.twice(1.0) == 31.0
    entry = next((tmp_path / "cpu").glob("probe-*.py"))
    cached = Path(compile_cache.importlib.util.cache_from_source(str(entry)))
    assert cached.is_file() and compile_cache._bytecode_current(str(cached), entry)
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")

    def later_process() -> dict:
        out = subprocess.run([sys.executable, "-c", SOURCE_COMPILES, _source(31)], env=env,
                             capture_output=True, text=True, check=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert later_process() == {"value": 62.0, "compiled": []}
    cached.write_bytes(cached.read_bytes()[:8] + b"\0" * 8 + cached.read_bytes()[16:])
    assert not compile_cache._bytecode_current(str(cached), entry)
    first = later_process()  # Python compiles the source, the cache writes it again
    assert first["value"] == 62.0 and [Path(p).name for p in first["compiled"]] == [entry.name]
    assert compile_cache._bytecode_current(str(cached), entry)
    assert later_process()["compiled"] == []


# The module's body (what compiles, on a cold cache) first waits for the other process to
# reach load_module and then, for at most two seconds, for it to enter the body as well:
# without a lock both are inside at once and both compile; with one, the second waits at
# the lock until the first has saved the entry.
MEET = """
import os, pathlib, time
_here = pathlib.Path(os.environ["MEET_DIR"])
_me = os.environ["MEET_ME"]
(_here / f"inside-{_me}").touch()
_until = time.monotonic() + 60
while not (_here / f"calling-{1 - int(_me)}").exists() and time.monotonic() < _until:
    time.sleep(0.01)
_until = time.monotonic() + 2
while not (_here / f"inside-{1 - int(_me)}").exists() and time.monotonic() < _until:
    time.sleep(0.01)
"""

CALL_AT_ONCE = """
import json, os, pathlib, sys
from tilegemm import compile_cache
(pathlib.Path(os.environ["MEET_DIR"]) / f"calling-{os.environ['MEET_ME']}").touch()
m = compile_cache.load_module("probe", sys.argv[1], {"kernel": "probe"})
print(json.dumps({"stats": compile_cache.STATS, "value": m.twice(2.0)}))
"""


def test_processes_needing_one_entry_at_once_compile_it_once(tmp_path):
    """Two processes (a pool's workers, two test workers) that need the same cold entry at
    the same moment: the first compiles it, the other waits and loads what it saved,
    instead of both compiling (15-20 s a tile of the CPU rung on two cores)."""
    meet = tmp_path / "meet"
    meet.mkdir()
    source = fill_template(TEMPLATE.replace("# @header", MEET + "\n# @header", 1),
                           {"SCALE": 4, "CACHE": False},
                           {"body": "def twice(x):\n    return SCALE * x\n"})
    procs = [subprocess.Popen(
        [sys.executable, "-c", CALL_AT_ONCE, source], stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path / "cache"),
                 MEET_DIR=str(meet), MEET_ME=str(i))) for i in range(2)]
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert [o["value"] for o in outs] == [8.0, 8.0]
    assert sorted((o["stats"]["compiled"], o["stats"]["loaded"]) for o in outs) == [
        (0, 1), (1, 0)], outs


def test_a_process_holding_an_entry_too_long_is_not_waited_for_ever(tmp_path, monkeypatch):
    """A process stopped while it builds an entry (suspended, in a debugger) keeps its
    lock: another waits ``LOCK_WAIT_SECONDS`` for it, then warns and builds the entry
    itself instead of waiting for ever."""
    import fcntl

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(compile_cache, "LOCK_WAIT_SECONDS", 0.3)
    load_module("probe", _source(23), {"kernel": "probe"})
    (lock_file,) = (tmp_path / "cpu").glob(".probe-*.lock")
    with open(lock_file, "a") as held:  # its own open file: the lock is another's
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.warns(CompileCacheWarning, match=r"waited 0.3 s .*probe-.* as well"):
            again = load_module("probe", _source(23), {"kernel": "probe"})
    assert again.twice(1.0) == 23.0


def test_where_no_lock_file_can_be_made_an_entry_is_read_without_one(tmp_path):
    """An entry in a folder this user cannot write (a shared, read-only cache) is still
    loaded, without the lock; a build that must write the entry needs it."""
    nowhere = tmp_path / "missing" / ".entry.lock"
    ran = []
    with compile_cache.locked(nowhere, required=False):
        ran.append(1)
    assert ran == [1] and not nowhere.exists()
    with pytest.raises(OSError), compile_cache.locked(nowhere):
        ran.append(2)
    assert ran == [1]


def test_corrupt_entry_warns_and_rebuilds(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    load_module("probe", _source(7), {"kernel": "probe"})
    index = list((tmp_path / "cpu" / "__pycache__").glob("*.nbi"))
    assert index
    for f in index:
        f.write_bytes(f.read_bytes()[:12] + b"\x00garbage")
    before = _counts()
    with pytest.warns(CompileCacheWarning, match="could not be loaded"):
        m = load_module("probe", _source(7), {"kernel": "probe"})
    assert m.twice(1.5) == 10.5
    assert _counts()[0] == before[0] + 1  # rebuilt
    assert _in_subprocess(tmp_path, _source(7))["stats"] == {"compiled": 0, "loaded": 1}


def test_other_version_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    load_module("probe", _source(11), {"kernel": "probe"})
    real = compile_cache._versions()
    monkeypatch.setattr(compile_cache, "_versions", lambda: {**real, "tilegemm": "0.0.0-other"})
    before = _counts()
    assert load_module("probe", _source(11), {"kernel": "probe"}).twice(1.0) == 11.0
    assert _counts() == (before[0] + 1, before[1])
    monkeypatch.setattr(compile_cache, "_versions", lambda: real)
    listed = compile_cache.entries()
    assert len(listed) == 2 and sorted(e.current for e in listed) == [False, True]


def test_other_cpu_kernel_helpers_are_not_loaded(tmp_path, monkeypatch):
    """A written-out CPU module compiles the private helpers' intrinsics into its code
    (kernels/cpu/_*.py): built from other versions of them, an entry is compiled again,
    as for another tilegemm version, not loaded."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    load_module("probe", _source(17), {"kernel": "probe"})
    real = compile_cache._installed_cpu_digest()
    monkeypatch.setattr(compile_cache, "_installed_cpu_digest", lambda: "0" * len(real))
    before = _counts()
    assert load_module("probe", _source(17), {"kernel": "probe"}).twice(1.0) == 17.0
    assert _counts() == (before[0] + 1, before[1])
    assert len(compile_cache.entries()) == 2


def test_unwritable_cache_dir_warns_and_runs_uncached(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(blocker / "cache"))
    with pytest.warns(CompileCacheWarning, match="cannot be used"):
        m = load_module("probe", _source(13), {"kernel": "probe"})
    assert m.twice(1.0) == 13.0
    # once per folder and process: each later kernel would repeat it ('explain' compiles
    # for two architectures, the tuner many candidates)
    import warnings
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert load_module("probe", _source(14), {"kernel": "probe"}).twice(1.0) == 14.0
        assert compile_cache.cached_texts("cpu", "probe", {"describe": {}},
                                          lambda: {"a": "b"}) == {"a": "b"}
    assert not [w for w in seen if issubclass(w.category, CompileCacheWarning)]
    assert str(blocker / "cache" / "cpu") in compile_cache.unusable_folders()


def test_an_entry_that_is_not_a_file_is_replaced_and_the_folder_stays_in_use(tmp_path,
                                                                              monkeypatch):
    """A directory where an entry's file belongs (left by hand or by another tool) is a
    damaged entry: warned about, replaced and cached; it made the whole folder count as
    unusable, with every later problem there silenced."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    load_module("probe", _source(23), {"kernel": "probe"})
    (entry,) = (tmp_path / "cpu").glob("probe-*.py")
    entry.unlink()
    entry.mkdir()
    (entry / "inside").write_text("x")
    with pytest.warns(CompileCacheWarning, match="is not a file"):
        assert load_module("probe", _source(23), {"kernel": "probe"}).twice(1.0) == 23.0
    assert entry.is_file()
    assert str(tmp_path / "cpu") not in compile_cache.unusable_folders()
    before = _counts()
    assert load_module("probe", _source(23), {"kernel": "probe"}).twice(2.0) == 46.0
    assert _counts() == (before[0], before[1] + 1)  # loaded from the cache, not compiled


def test_a_file_in_place_of_the_pycache_is_replaced(tmp_path, monkeypatch):
    """A file where Numba keeps the compiled code (``cpu/__pycache__``) made Numba keep it
    in a directory of its own, outside this cache, or fail with 'no locator available';
    then the cache was turned off with a warning in every process, for good (``tilegemm
    cache --clear`` did not remove the file). Now the file is replaced, once, with a
    warning, and the code is kept and loaded by the next process."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "__pycache__").write_text("not a directory")
    with pytest.warns(CompileCacheWarning, match="is not a folder; replacing it"):
        m = load_module("probe", _source(19), {"kernel": "probe"})
    assert m.twice(1.0) == 19.0
    assert (tmp_path / "cpu" / "__pycache__").is_dir()
    assert _in_subprocess(tmp_path, _source(19))["stats"] == {"compiled": 0, "loaded": 1}


def test_cache_off_and_template_errors(monkeypatch):
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", "off")
    assert compile_cache.cache_root() is None and compile_cache.entries() == []
    assert load_module("probe", _source(17), {"kernel": "probe"}).twice(1.0) == 17.0
    with pytest.raises(RuntimeError, match="no '# @missing' block"):
        fill_template(TEMPLATE, {}, {"missing": "x = 1\n"})


def test_cache_off_turns_pocls_own_cache_off(monkeypatch):
    """With the kernel cache off, PoCL kept every program in its own default folder
    (a second process loaded it in 0.26 s instead of building for 3.3 s); a
    POCL_KERNEL_CACHE the user set is left as it is."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", "off")
    monkeypatch.setenv("POCL_KERNEL_CACHE", "")  # so that the test's value is undone after
    monkeypatch.delenv("POCL_KERNEL_CACHE")
    compile_cache.use_pocl_cache()
    assert os.environ["POCL_KERNEL_CACHE"] == "0"
    monkeypatch.setenv("POCL_KERNEL_CACHE", "1")
    compile_cache.use_pocl_cache()
    assert os.environ["POCL_KERNEL_CACHE"] == "1"


def test_cache_command_lists_and_clears(tmp_path, monkeypatch, capsys):
    from tilegemm.cli import main

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    load_module("probe", _source(19), {"kernel": "probe", "params": {"SCALE": 19}})
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "1 entry" in out and "SCALE=19" in out and "yes" in out
    assert list((tmp_path / "cpu").glob(".probe-*.lock"))  # taken while it compiled
    assert main(["cache", "--clear"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert compile_cache.entries() == []
    assert not (tmp_path / "cpu").exists()  # the lock file went with its entry


def test_cache_command_clears_only_stale_entries(tmp_path, monkeypatch, capsys):
    """An entry written by another tilegemm version is listed as not usable and is the only
    one ``--clear --stale`` removes; the current entry stays and still loads."""
    from tilegemm.cli import main

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    real = compile_cache._versions
    with monkeypatch.context() as m:
        m.setattr(compile_cache, "_versions", lambda: {**real(), "tilegemm": "0.0.1"})
        load_module("probe", _source(23), {"kernel": "probe", "params": {"SCALE": 23}})
    load_module("probe", _source(29), {"kernel": "probe", "params": {"SCALE": 29}})
    assert sorted(e.current for e in compile_cache.entries()) == [False, True]
    (old,) = [e for e in compile_cache.entries() if not e.current]
    assert old.files and all(p.exists() for p in old.files)
    assert main(["cache"]) == 0
    assert "1 not usable here" in capsys.readouterr().out
    assert main(["cache", "--stale"]) == 2  # --stale alone removes nothing
    assert len(compile_cache.entries()) == 2
    assert main(["cache", "--clear", "--stale"]) == 0
    assert "removed 1 stale entry" in capsys.readouterr().out
    (left,) = compile_cache.entries()
    assert left.current and left.describe["params"] == {"SCALE": 29}
    assert not any(p.exists() for p in old.files)


# The blocked rung's helpers that compiled code calls by name (``called_by_name``): loaded
# before the first function that reaches them. A small product loads them, the probe and
# ``small``.
BY_NAME = ["direct", "few_rows", "gemv_part", "macro", "pack_a", "pack_b"]
SMALL_PRODUCT_LOADS = 2 + len(BY_NAME)


# The real CPU rung's tile that the tests below damage in caches of their own (small, to
# compile faster); test_cpu_rungs multiplies with it too.
SMALL_TILE = {"MR": 4, "NR": 8, "MC": 48, "KC": 64, "NC": 256}
FILL = f"""
import numpy as np
from tilegemm import registry
spec = registry.get("blocked", "cpu")
spec.build(spec.resolve({SMALL_TILE!r}), np.dtype("float64"))
"""


def _small_tile_files(root: Path) -> list[Path]:
    return [f for e in compile_cache._module_entries(root / compile_cache.SUBDIR, {})
            if e.describe.get("dtype") == "float64"
            and {k: e.describe.get("params", {}).get(k) for k in ("MR", "NR")}
            == {"MR": 4, "NR": 8}
            for f in e.files if not f.name.endswith(".lock")]


@pytest.fixture(scope="session")
def small_tile(tmp_path_factory) -> tuple[Path, list[Path]]:
    """The kernel cache folder and the files of :data:`SMALL_TILE`'s float64 entry in it,
    compiled once per test process: in the session's cache (where other tests find it),
    else, with the cache off, in a folder of its own. Each test that damages an entry
    copies these into a cache of its own (see :func:`_holding_small_tile`) instead of
    compiling the rung again (15 s a time on two cores)."""
    root = compile_cache.cache_root() or tmp_path_factory.mktemp("kernels")
    # always through the rung's build (a second or two when the entry is there): it waits
    # at the entry's lock while another test process is still compiling the tile, whose
    # files are then on disk, but not all of them yet
    subprocess.run([sys.executable, "-c", FILL], check=True, timeout=300,
                   env=dict(os.environ, TILEGEMM_KERNEL_CACHE=str(root)))
    files = _small_tile_files(root)
    assert files, f"no float64 {SMALL_TILE} entry in {root}"
    return root, files


def _holding_small_tile(cache: Path, small_tile: tuple[Path, list[Path]]) -> dict:
    """Copy the compiled small tile into the kernel cache ``cache`` (Numba's index is keyed
    by its source file's contents, so the copy loads) and return the rung's parameters."""
    import shutil

    from tilegemm import registry

    root, files = small_tile
    for f in files:
        to = cache / f.relative_to(root)
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, to)
    return registry.get("blocked", "cpu").resolve(SMALL_TILE)


@pytest.mark.slow
def test_blocked_rung_is_loaded_by_a_second_process(tmp_path, monkeypatch, small_tile):
    """The real CPU rung (small tiles to compile faster) through the cache end to end: a
    process that finds it compiled (by the test session, copied here) loads it."""
    params = _holding_small_tile(tmp_path, small_tile)
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    code = f"""
import json, numpy as np, tilegemm
from tilegemm import compile_cache
from tilegemm.reference import assert_close

def loaded():
    (module,) = [m for n, m in sys.modules.items() if n.startswith("tilegemm_kernel_blocked")]
    return sorted(f.__name__ for f in module.COMPILED if f.signatures)

import sys
from tilegemm.kernels.cpu import _threads
rng = np.random.default_rng(3)
steps = []
for m, k, n in ((13, 7, 9), (13, 7, 9), (201, 77, 131), (1, 300, 5000)):
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    if not steps:
        b = np.asfortranarray(b)  # a small product given transposed: small too, no pool
    assert_close(tilegemm.matmul(a, b, kernel="blocked", **{params!r}), a, b)
    steps.append([loaded(), dict(compile_cache.STATS), _threads._numba_layer_started()])
# other cache blocks, the same tile: the same compiled code, loaded again, not compiled
a, b = rng.standard_normal((201, 300)), rng.standard_normal((300, 131))
other = dict({params!r}, MC=96, KC=128, NC=512)
assert_close(tilegemm.gemm(a, b, kernel="blocked", **other), a, b)
steps.append([None, dict(compile_cache.STATS), None])
print(json.dumps(steps))
"""
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=300)
    steps = json.loads(out.stdout.strip().splitlines()[-1])
    # Nothing compiled; loaded: the probe at import, then each function Python calls on its
    # first call (a small product, a threaded one, a vector-matrix one), never the helpers
    # whose code their cached code already holds, except those it calls by name, loaded
    # just before it (see kernels/cpu/_lazy).
    small = sorted(["small", "takes_gemv", *BY_NAME])
    # the threaded driver calls the parallel region by name (its own library)
    threaded = sorted([*small, "layout", "blocked_threads", "run_parallel"])
    vector = sorted([*threaded, "gemv_threads"])
    # Numba's thread pool starts with the first threaded product, not before
    assert steps[:4] == [[small, {"compiled": 0, "loaded": len(small)}, False],
                         [small, {"compiled": 0, "loaded": len(small)}, False],
                         [threaded, {"compiled": 0, "loaded": len(threaded)}, True],
                         [vector, {"compiled": 0, "loaded": len(vector)}, True]], steps
    # MC, KC and NC are arguments of the compiled code: parameter sets that differ only in
    # them share the tile's one cache entry (compiled once, 20-30 s a tile on 2 cores)
    assert steps[4][1]["compiled"] == 0, steps
    assert steps[4][1] == steps[3][1], steps  # nor loaded again: imported once per process
    assert len(list((tmp_path / "cpu").glob("blocked-float64-*.py"))) == 1


def test_machine_code_damaged_in_place_is_compiled_again_not_run(tmp_path, monkeypatch,
                                                                 small_tile):
    """A cached function's data file with 256 bytes of its machine code zeroed, its size
    unchanged (a bad disk block): Numba unpickled and linked it, and every later process
    crashed with a segmentation fault and no warning. Its checksum now fails: a warning,
    the function compiled again (the rest loaded), the product right, and the next
    process loads the rewritten entry."""
    params = _holding_small_tile(tmp_path, small_tile)
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    code = f"""
import json, warnings, numpy as np, tilegemm
from tilegemm import compile_cache
from tilegemm.reference import assert_close
a = np.random.default_rng().standard_normal((13, 7))
b = np.random.default_rng().standard_normal((7, 9))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert_close(tilegemm.matmul(a, b, kernel="blocked", **{params!r}), a, b)
print(json.dumps([dict(compile_cache.STATS), [str(w.message) for w in caught]]))
"""
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))

    def run() -> list:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run() == [{"compiled": 0, "loaded": SMALL_PRODUCT_LOADS}, []]  # as copied
    (data,) = (tmp_path / "cpu" / "__pycache__").glob("*takes_gemv*.nbc")
    raw = bytearray(data.read_bytes())
    at = raw.find(b"\x7fELF") + 2000  # inside the machine code, which is linked as is
    assert 2000 < at < len(raw) - 256
    raw[at:at + 256] = bytes(256)
    data.write_bytes(raw)
    stats, messages = run()
    assert stats["compiled"] == 1, stats  # takes_gemv again, the rest loaded
    assert any("takes_gemv" in m and "checksum" in m for m in messages), messages
    assert run() == [{"compiled": 0, "loaded": SMALL_PRODUCT_LOADS}, []]


# --- keyed text entries (the PTX of CUDA rungs compiled without a GPU) ----------------------

def test_cached_texts_builds_once_then_reads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    calls = []

    def build() -> dict[str, str]:
        calls.append(1)
        return {"sm_80": "ptx 80", "sm_90": "ptx 90"}

    key = {"describe": {"kernel": "probe", "dtype": "float32"}, "sources": "abc"}
    first = compile_cache.cached_texts("cuda", "probe-float32", key, build)
    again = compile_cache.cached_texts("cuda", "probe-float32", key, build)
    assert first == again == {"sm_80": "ptx 80", "sm_90": "ptx 90"}
    assert len(calls) == 1
    # another key (changed sources) is another entry, built again
    compile_cache.cached_texts("cuda", "probe-float32", {**key, "sources": "abd"}, build)
    assert len(calls) == 2
    # the sources are now "abd": the entry keyed "abc" is stale (it was listed as usable,
    # and --clear --stale never removed it)
    monkeypatch.setattr(compile_cache, "_text_key_common", lambda sub: {"sources": "abd"})
    listed = [e for e in compile_cache.entries() if e.describe.get("kernel") == "probe"]
    assert len(listed) == 2 and all(e.bytes > 0 for e in listed)
    assert sorted(e.current for e in listed) == [False, True]
    assert compile_cache.clear(stale_only=True) == 1
    assert [e.current for e in compile_cache.entries()] == [True]
    assert compile_cache.clear() >= 1
    assert compile_cache.entries() == []
    assert not (tmp_path / "cuda").exists()  # lock files included


def test_cached_ptx_entries_are_stale_after_a_source_or_numba_cuda_change(
        tmp_path: Path, monkeypatch) -> None:
    """What the PTX entries depend on besides the versions every entry holds (the sources
    and numba-cuda's version) is compared too, as the current key would be."""
    from tilegemm.analysis.resources import ptx_key_common

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    common = ptx_key_common()
    key = {"describe": {"kernel": "probe"}, **common}
    compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "now"})
    compile_cache.cached_texts("cuda", "probe", {**key, "sources": "edited"},
                               lambda: {"sm_90": "then"})
    compile_cache.cached_texts("cuda", "probe", {**key, "versions": {"numba-cuda": "0.0"}},
                               lambda: {"sm_90": "old"})
    listed = compile_cache.entries()
    assert sorted(e.current for e in listed) == [False, False, True]
    assert compile_cache.clear(stale_only=True) == 2


def test_cached_texts_corrupt_entry_warns_and_rebuilds(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    key = {"describe": {"kernel": "probe"}, "sources": "abc"}
    compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "good"})
    [path] = (tmp_path / "cuda").glob("probe-*.json")
    path.write_text(path.read_text()[:40])  # truncated
    with pytest.warns(CompileCacheWarning, match="could not be loaded"):
        texts = compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "rebuilt"})
    assert texts == {"sm_90": "rebuilt"}
    assert json.loads(path.read_text())["texts"] == {"sm_90": "rebuilt"}


def test_cached_texts_edited_or_in_the_way_are_rebuilt(tmp_path: Path, monkeypatch) -> None:
    """A PTX entry whose text was damaged but is still JSON failed in the linker on every
    run ("internal error"); a directory in place of an entry made every run warn that it
    could not be written. Both now warn once and rebuild."""
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    key = {"describe": {"kernel": "probe"}, "sources": "abc"}
    compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "ld.global"})
    [path] = (tmp_path / "cuda").glob("probe-*.json")
    entry = json.loads(path.read_text())
    entry["texts"]["sm_90"] = "ld.glxbal"
    path.write_text(json.dumps(entry))
    with pytest.warns(CompileCacheWarning, match="checksum"):
        texts = compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "rebuilt"})
    assert texts == {"sm_90": "rebuilt"}
    path.unlink()
    path.mkdir()
    with pytest.warns(CompileCacheWarning, match="is a directory"):
        compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "again"})
    assert json.loads(path.read_text())["texts"] == {"sm_90": "again"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileCacheWarning)
        assert compile_cache.cached_texts("cuda", "probe", key, lambda: {}) == {"sm_90": "again"}


def test_cached_texts_other_version_is_not_used(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    key = {"describe": {"kernel": "probe"}}
    compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "old"})
    real = compile_cache._versions()
    monkeypatch.setattr(compile_cache, "_versions", lambda: {**real, "numba": "0.0-other"})
    assert compile_cache.cached_texts("cuda", "probe", key, lambda: {"sm_90": "new"}) == {
        "sm_90": "new"}
    monkeypatch.setattr(compile_cache, "_versions", lambda: real)
    monkeypatch.setattr(compile_cache, "_text_key_common", lambda sub: {})  # a probe's key
    assert sorted(e.current for e in compile_cache.entries()) == [False, True]


def test_cached_texts_unwritable_dir_warns_and_builds(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(compile_cache.ENV, str(blocker))
    with pytest.warns(CompileCacheWarning, match="cannot be used"):
        texts = compile_cache.cached_texts("cuda", "probe", {"describe": {}}, lambda: {"a": "b"})
    assert texts == {"a": "b"}


def test_a_failed_pocl_builds_log_is_not_damage(tmp_path: Path) -> None:
    """A failed PoCL build leaves an entry holding only ``build.log`` and rewrites it at
    every attempt (a device whose compiler cannot target this CPU is probed by every
    process): that is not a damaged program, so no warning and nothing deleted; a changed
    compiled program still is."""
    import json
    import warnings

    from tilegemm import compile_cache

    failed = tmp_path / "FB" / "DKID"
    built = tmp_path / "EB" / "KPJB"
    failed.mkdir(parents=True)
    built.mkdir(parents=True)
    (failed / "build.log").write_text("error: unknown target CPU 'generic'\n")
    (built / "program.bc").write_bytes(b"BC" * 100)
    (built / "last_accessed").write_text("")
    compile_cache._record_pocl_files(tmp_path)
    assert "FB/DKID/build.log" not in json.loads(
        (tmp_path / compile_cache.POCL_MANIFEST).read_text())["files"]
    (failed / "build.log").write_text("error: unknown target CPU 'generic' (again)\n")
    (built / "last_accessed").write_text("touched")
    with warnings.catch_warnings():
        warnings.simplefilter("error", compile_cache.CompileCacheWarning)
        compile_cache._check_pocl_entries(tmp_path)
    assert failed.exists() and built.exists()
    (built / "program.bc").write_bytes(b"BC" * 10)  # truncated: damage
    with pytest.warns(compile_cache.CompileCacheWarning, match="PoCL rebuilds it"):
        compile_cache._check_pocl_entries(tmp_path)
    assert not built.exists() and failed.exists()


def test_a_copied_pocl_cache_is_not_damage_but_changed_contents_are(tmp_path: Path) -> None:
    """``cp -r`` of a good cache gives every file a new time: each entry was deleted as
    "changed after it was written". Where only the time differs the contents are compared
    with the recorded digest: the same bytes pass; other bytes of the same size do not."""
    import os
    import warnings

    entry = tmp_path / "EB" / "KPJB"
    entry.mkdir(parents=True)
    program = entry / "program.so"
    program.write_bytes(b"ELF" * 300)
    compile_cache._record_pocl_files(tmp_path)
    st = program.stat()
    os.utime(program, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # copied: same bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileCacheWarning)
        compile_cache._check_pocl_entries(tmp_path)
    assert program.exists()
    compile_cache._record_pocl_files(tmp_path)  # the digest carried over to the new time
    program.write_bytes(b"FLE" * 300)  # damaged in place, same size, a new time
    with pytest.warns(CompileCacheWarning, match="changed after it was written"):
        compile_cache._check_pocl_entries(tmp_path)
    assert not entry.exists()


def test_a_damaged_pocl_record_rebuilds_every_entry(tmp_path: Path) -> None:
    """A damaged record turned the damage check off without a word: a truncated program
    beside it then aborted the process inside PoCL."""
    from tilegemm import compile_cache

    built = tmp_path / "EB" / "KPJB"
    built.mkdir(parents=True)
    (built / "program.bc").write_bytes(b"BC" * 100)
    (tmp_path / compile_cache.POCL_MANIFEST).write_text("{")
    with pytest.warns(compile_cache.CompileCacheWarning, match="record .* is damaged"):
        compile_cache._check_pocl_entries(tmp_path)
    assert not built.exists() and not (tmp_path / compile_cache.POCL_MANIFEST).exists()
    compile_cache._check_pocl_entries(tmp_path)  # no record at all: a new cache, no warning
    # a directory in the record's place turned the check (and the listing) off silently
    built.mkdir(parents=True)
    (built / "program.bc").write_bytes(b"BC" * 100)
    (tmp_path / compile_cache.POCL_MANIFEST).mkdir()
    with pytest.warns(compile_cache.CompileCacheWarning, match="a directory stands"):
        compile_cache._check_pocl_entries(tmp_path)
    assert not built.exists() and not (tmp_path / compile_cache.POCL_MANIFEST).exists()


def test_pocl_files_vanishing_while_listed_are_skipped(tmp_path: Path, monkeypatch) -> None:
    """Another process deleting a damaged entry while this one listed the files made the
    listing raise FileNotFoundError, and the OpenCL backend unusable."""
    from tilegemm import compile_cache

    entry = tmp_path / "EB" / "KPJB"
    entry.mkdir(parents=True)
    (entry / "program.bc").write_bytes(b"BC")
    (entry / "gone.so").write_bytes(b"SO")
    real_stat = os.stat
    seen: list[str] = []

    def stat(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(os.path.basename(path))
        if os.path.basename(path) == "gone.so":  # listed, then removed before its stat
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(compile_cache.os, "stat", stat)
    assert list(compile_cache._pocl_listing(tmp_path)[0]) == [os.path.join("EB", "KPJB",
                                                                      "program.bc")]
    assert "gone.so" in seen  # (the control: the file was listed and looked at)


def _pocl_entry(root: Path, name: str, files: dict[str, bytes]) -> Path:
    entry = root / name[:2] / name[2:]
    for rel, data in files.items():
        (entry / rel).parent.mkdir(parents=True, exist_ok=True)
        (entry / rel).write_bytes(data)
    return entry


def test_the_pocl_record_is_rewritten_only_when_something_was_added(tmp_path: Path) -> None:
    """After each first launch the record was rewritten from a walk of the whole cache
    (60-80 ms over 700 files, twice in a first OpenCL call, as the check walked it too).
    Where no directory changed since the record (PoCL found every program in its cache)
    nothing is listed or written; a file added anywhere in an entry, a new entry in a known
    folder and a new folder are each found and recorded."""
    from tilegemm import compile_cache

    manifest = tmp_path / compile_cache.POCL_MANIFEST
    _pocl_entry(tmp_path, "EBKPJB", {"program.bc": b"BC" * 50})
    compile_cache._record_pocl_files(tmp_path)
    first = manifest.read_text()
    assert "dirs" in json.loads(first)
    manifest.write_text(first.replace('"header"', '"header" ', 1))  # marks an unchanged file
    marked = manifest.read_text()
    compile_cache._record_pocl_files(tmp_path)  # nothing changed: not rewritten
    assert manifest.read_text() == marked
    # a work-group function written later into an existing entry, three levels down
    _pocl_entry(tmp_path, "EBKPJB", {"gemm/16-16-1/gemm.so": b"SO" * 50})
    (tmp_path / "tempfile_x").write_text("")  # PoCL's temporary files at the top: no entry
    compile_cache._record_pocl_files(tmp_path)
    files = json.loads(manifest.read_text())["files"]
    assert os.path.join("EB", "KPJB", "gemm", "16-16-1", "gemm.so") in files
    _pocl_entry(tmp_path, "EBQQQQ", {"program.bc": b"BD" * 50})  # a new entry, same folder
    compile_cache._record_pocl_files(tmp_path)
    assert os.path.join("EB", "QQQQ", "program.bc") in json.loads(manifest.read_text())["files"]
    _pocl_entry(tmp_path, "FARRRR", {"program.bc": b"BE" * 50})  # a new folder at the top
    compile_cache._record_pocl_files(tmp_path)
    assert os.path.join("FA", "RRRR", "program.bc") in json.loads(manifest.read_text())["files"]


def test_a_pocl_record_without_directory_times_is_walked(tmp_path: Path) -> None:
    """A record written before directory times were kept (or with them damaged) cannot say
    that nothing changed: the cache is walked and the record rewritten with them."""
    from tilegemm import compile_cache

    manifest = tmp_path / compile_cache.POCL_MANIFEST
    _pocl_entry(tmp_path, "EBKPJB", {"program.bc": b"BC" * 50})
    compile_cache._record_pocl_files(tmp_path)
    for dirs in (None, {"EB": "not a time"}):
        data = json.loads(manifest.read_text())
        if dirs is None:
            del data["dirs"]
        else:
            data["dirs"] = dirs
        manifest.write_text(json.dumps(data))
        compile_cache._record_pocl_files(tmp_path)
        assert json.loads(manifest.read_text())["dirs"][os.path.join("EB", "KPJB")] > 0


def test_cpu_digest_follows_the_private_modules_not_the_rungs(tmp_path: Path) -> None:
    """The compiled blocked rung depends on kernels/cpu/_*.py (it imports them); a rung file
    added or edited beside it must not invalidate it, an edited private module must."""
    import shutil

    from tilegemm.compile_cache import CPU_KERNELS, cpu_sources_digest

    folder = tmp_path / "cpu"
    shutil.copytree(CPU_KERNELS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = cpu_sources_digest(folder)
    assert before == cpu_sources_digest()
    (folder / "k03_mine.py").write_text("SPEC = None\n")
    (folder / "k01_triple_loop.py").write_text("# edited\n")
    assert cpu_sources_digest(folder) == before
    with (folder / "_slp.py").open("a") as f:
        f.write("# edited\n")
    assert cpu_sources_digest(folder) != before


@pytest.mark.parametrize("key", ['[1, 2]', '{"describe": "x", "versions": [1]}',
                                 '{"describe": {"params": [1]}, "versions": "v"}', 'garbage'])
def test_a_damaged_entry_is_listed_as_not_usable_and_cleared(tmp_path, monkeypatch, key,
                                                             capsys) -> None:
    """An entry whose key line is not what tilegemm writes (hand-edited, another tool's
    file): listed as not usable, removed by --clear --stale; a dangling link beside it
    counts 0 bytes. It used to stop the command with an internal error (exit 3)."""
    from tilegemm.cli import main

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    folder = tmp_path / "cpu"
    (folder / "__pycache__").mkdir(parents=True)
    stem = "blocked-float32-" + "a" * 20  # named as entries are: a damaged entry of ours
    (folder / f"{stem}.py").write_text(f"# key: {key}\n")
    (folder / "__pycache__" / f"{stem}.x.nbc").symlink_to(tmp_path / "gone")
    assert main(["cache"]) == 0
    assert "1 not usable here" in capsys.readouterr().out
    assert main(["cache", "--clear", "--stale"]) == 0
    assert "removed 1 stale entry" in capsys.readouterr().out
    assert compile_cache.entries() == []


def test_a_damaged_cuda_entry_is_listed_under_cuda(tmp_path, monkeypatch) -> None:
    """An emptied PTX entry (``cuda/naive-*.json``) has no record of its backend: it was
    listed as a CPU entry."""
    from tilegemm.commands.cache import _backend

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / f"naive-float32-{'b' * 20}.json").write_text("")
    (listed,) = compile_cache.entries()
    assert _backend(listed) == "cuda" and not listed.current


def test_files_that_are_not_entries_are_neither_listed_nor_cleared(tmp_path, monkeypatch,
                                                                    capsys) -> None:
    """A cache directory pointed at a folder holding other files: `tilegemm cache` listed
    any *.py and *.json as entries "not usable here", --clear --stale deleted them, and
    --clear removed whole cpu/, cuda/ ... folders (with TILEGEMM_KERNEL_CACHE=/usr/local,
    /usr/local/cuda)."""
    from tilegemm.cli import main

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    foreign = [tmp_path / "cpu" / "myscript.py", tmp_path / "cuda" / "settings.json",
               tmp_path / "cuda" / "notes.txt", tmp_path / "pocl" / "AB" / "x" / "program.bc"]
    for path in foreign:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mine\n")
    load_module("probe", _source(41), {"kernel": "probe"})  # one entry of ours beside them
    assert [e.name.split("-")[0] for e in compile_cache.entries()] == ["probe"]
    for args, removed in ((["cache", "--clear", "--stale"], "removed 0 stale entries"),
                          (["cache", "--clear"], "removed 1 entry")):
        assert main(args) == 0
        assert removed in " ".join(capsys.readouterr().out.split())
        assert all(path.read_text() == "mine\n" for path in foreign)
    assert compile_cache.entries() == []


def test_clear_reports_what_it_could_not_remove(tmp_path, monkeypatch) -> None:
    """--clear counted the entries before deleting and ignored failures, so it reported
    removals that had not happened."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    load_module("probe", _source(31), {"kernel": "probe"})
    real_unlink = Path.unlink

    def refuse(self, missing_ok=False):  # noqa: ANN001, ANN202 - Path.unlink's signature
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(Path, "unlink", refuse)
    monkeypatch.setattr(compile_cache.shutil, "rmtree",
                        lambda path, onerror: onerror(None, str(path),
                                                      (None, PermissionError(1, "no"), None)))
    with pytest.raises(compile_cache.CacheClearError, match="removed 0 of 1 entry; could not "
                                                            "remove: .*not permitted"):
        compile_cache.clear()
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert len(compile_cache.entries()) == 1  # still there, as the error says


def test_cache_command_says_when_the_directory_cannot_be_used(tmp_path, monkeypatch,
                                                              capsys) -> None:
    """A file where the directory should be: said, instead of "0 entries" as if all were
    well while nothing is ever kept."""
    from tilegemm.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(blocker / "kernels"))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["cache"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # however the console wrapped it
    assert "cannot be used (" in out and "a-file is not a directory)" in out
    assert main(["cache", "--stale"]) == 2
    assert "tilegemm: error: --stale only selects" in capsys.readouterr().err
    for where in (blocker / "kernels", blocker):  # under a file, or the file itself
        monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(where))
        assert main(["cache", "--clear"]) == 0  # said, not "removed 0 entries"
        out = " ".join(capsys.readouterr().out.split())
        assert "cannot be used (" in out and "removed" not in out, out
    assert blocker.read_text() == "x"


def test_cache_clear_names_what_a_read_only_folder_keeps(tmp_path, monkeypatch,
                                                         capsys) -> None:
    """--clear on a folder that cannot be written said 'cannot be used' and exited 0,
    leaving every entry in place without a word."""
    from tilegemm import compile_cache
    from tilegemm.cli import main

    folder = tmp_path / "kernels" / compile_cache.SUBDIR
    folder.mkdir(parents=True)
    (folder / f"a-{'1' * 20}.py").write_text("# x\n")
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path / "kernels"))

    def refuse(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        raise PermissionError(13, "Permission denied", str(path))

    from tilegemm.commands import cache as cache_command

    # as the folder looks without write permission (root's tests cannot take it away)
    monkeypatch.setattr(cache_command, "_unusable", lambda root: f"{root} is not writable")
    monkeypatch.setattr(compile_cache.os, "unlink", refuse)
    monkeypatch.setattr(compile_cache.os, "remove", refuse)
    monkeypatch.setattr(Path, "unlink", refuse)
    assert main(["cache", "--clear"]) == 2
    assert "could not remove" in capsys.readouterr().err


def test_pocl_temp_files_are_removed_once_old(tmp_path: Path, monkeypatch) -> None:
    """PoCL 3 leaves a few ``tempfile_*`` at the top of its cache per process that builds:
    the folder grew by thousands of files. Old ones go before PoCL starts; one young enough
    to be a build in progress elsewhere, and everything else, stays."""
    import os
    import time

    from tilegemm import compile_cache

    monkeypatch.setenv("POCL_CACHE_DIR", "")  # restored after the test, whatever it was
    monkeypatch.delenv("POCL_CACHE_DIR")
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    folder = tmp_path / compile_cache.POCL_SUBDIR
    (folder / "EB" / "KPJB").mkdir(parents=True)
    old = time.time() - 2 * compile_cache.POCL_TEMP_AGE_S
    for name in ("tempfile_3HccMc.cl", "tempfile_L5iPcB"):
        (folder / name).write_text("")
        os.utime(folder / name, (old, old))
    (folder / "tempfile_young").write_text("")
    (folder / "EB" / "KPJB" / "tempfile_inside").write_text("")
    os.utime(folder / "EB" / "KPJB" / "tempfile_inside", (old, old))
    compile_cache.use_pocl_cache()
    assert os.environ["POCL_CACHE_DIR"] == str(folder)
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == [
        "tempfile_inside", "tempfile_young"]


def test_cache_listing_takes_entries_whose_names_are_not_text(tmp_path: Path, monkeypatch,
                                                               capsys) -> None:
    """A first line with "kernel": 5 made 'tilegemm cache' exit as an internal error (the
    summary sorted numbers with names; a cell could not render a number)."""
    from tilegemm import compile_cache
    from tilegemm.cli import main

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")  # names in cells unfolded
    folder = tmp_path / compile_cache.SUBDIR
    folder.mkdir()
    for i in range(12):
        (folder / f"e{i}-abc.py").write_text(
            f'# {compile_cache._TEXT_HEADER}: {{"describe": {{"kernel": 5, "dtype": 5}}}}\n')
    (folder / "named-abc.py").write_text(
        f'# {compile_cache._TEXT_HEADER}: {{"describe": {{"kernel": "blocked"}}}}\n')
    for args in (["cache"], ["cache", "--verbose"]):
        assert main(args) == 0
        out = " ".join(capsys.readouterr().out.split())  # lines wrap at the console's width
        assert "13 entries" in out and "blocked" in out


def test_cache_files_are_readable_by_others_sharing_the_directory(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Files were written through mkstemp, mode 0600: a cache directory shared by several
    users (a group's software tree) could not be read by any but the writer."""
    import stat

    from tilegemm import compile_cache
    from tilegemm.tune import cache as tcache

    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "k"))
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path / "t"))
    load_module("probe", _source(23), {"kernel": "probe"})
    (entry,) = (tmp_path / "k" / "cpu").glob("probe-*.py")
    written = tcache.save([], tcache.cache_path())
    for path in (entry, written):
        assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_cache_command_finds_a_folder_it_cannot_write_by_writing(monkeypatch, capsys) -> None:
    """Permission bits let root write anywhere, so the command listed '0 entries' for a
    directory under /proc, where every call then warned that the cache cannot be used."""
    from tilegemm.cli import main

    monkeypatch.delenv("TILEGEMM_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", "/proc/tilegemm-test")
    assert main(["cache"]) == 0
    assert "cannot be used" in capsys.readouterr().out


def test_a_relative_cache_directory_stays_where_it_was_first_read(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """TILEGEMM_KERNEL_CACHE=relk, then os.chdir: PoCL, handed the relative path once,
    resolved it against the new directory and every later OpenCL build failed; CPU entries
    went under each new directory. The path is made absolute when first read."""
    from tilegemm.tune import cache as tcache

    tcache.absolute_once.cache_clear()
    try:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        monkeypatch.chdir(tmp_path / "a")
        for env in ("TILEGEMM_KERNEL_CACHE", "TILEGEMM_CACHE_DIR"):
            monkeypatch.delenv("TILEGEMM_KERNEL_CACHE", raising=False)
            monkeypatch.setenv(env, "rel")
            first = compile_cache.cache_root()
            assert first is not None and first.is_absolute()
            assert str(first).startswith(str(tmp_path / "a" / "rel")), first
            monkeypatch.chdir(tmp_path / "b")
            assert compile_cache.cache_root() == first
            monkeypatch.chdir(tmp_path / "a")
    finally:
        tcache.absolute_once.cache_clear()


@pytest.mark.slow
def test_a_directory_in_place_of_an_entry_file_is_removed_once(tmp_path, monkeypatch,
                                                               small_tile):
    """A directory where a function's index file goes was never repaired: Numba can
    neither read nor replace it, so every process warned and compiled again, for ever
    (and the probe counting as cold made every process load every function eagerly)."""
    params = _holding_small_tile(tmp_path, small_tile)
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    code = f"""
import json, warnings, numpy as np, tilegemm
from tilegemm import compile_cache
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    a = np.ones((8, 8))
    assert (tilegemm.matmul(a, a, kernel="blocked", **{params!r}) == 8).all()
print(json.dumps([compile_cache.STATS, [str(w.message) for w in seen]]))
"""
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))

    def run() -> list:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])

    (index,) = (tmp_path / "cpu" / "__pycache__").glob("*.takes_gemv-*.nbi")
    index.unlink()
    index.mkdir()
    (index / "x").write_text("")
    stats, warned = run()
    assert stats["compiled"] == 1 and any("could not be loaded" in w for w in warned), warned
    assert index.is_file()  # the directory is gone and the index written again
    assert run() == [{"compiled": 0, "loaded": SMALL_PRODUCT_LOADS}, []]


def _function_in_a_file(source: Path):  # noqa: ANN202 - (the path, its module)
    """A module file holding ``f``, imported: a function a cache can locate by its file."""
    import importlib.util

    source.parent.mkdir(parents=True)
    source.write_text("def f(x):\n    return x\n")
    name = "probe_" + source.parent.name.replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return source, module


def test_entries_stay_beside_their_source_whatever_numba_cache_dir_says(tmp_path,
                                                                        monkeypatch) -> None:
    """With NUMBA_CACHE_DIR set, Numba kept the compiled code there: `tilegemm cache`
    counted 0 MB, --clear left it, and the next process loaded the cleared kernel."""
    from numba.core import config

    from tilegemm.kernels.cpu._lazy import QuickLoadCache

    source, module = _function_in_a_file(tmp_path / "cpu" / f"probe-{'b' * 20}.py")
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path / "elsewhere"))
    cache = QuickLoadCache(module.f)
    assert Path(cache._cache_path) == source.parent / "__pycache__"


@pytest.mark.ptx
def test_cuda_entries_stay_beside_their_source_whatever_numba_cache_dir_says(
        tmp_path, monkeypatch) -> None:
    from numba.cuda.core import config as cuda_config

    from tilegemm.kernels.cuda._jit import guarded_cache_class

    source, module = _function_in_a_file(tmp_path / "cuda-jit" / f"probe-{'c' * 20}.py")
    monkeypatch.setattr(cuda_config, "CACHE_DIR", str(tmp_path / "elsewhere"), raising=False)
    cache = guarded_cache_class()(module.f)
    assert Path(cache._cache_path) == source.parent / "__pycache__"
