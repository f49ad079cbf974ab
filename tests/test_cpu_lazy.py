"""Helpers compiled on first use (``kernels/cpu/_lazy``): nothing compiled at declaration,
exactly the declared signature once something needs it, under the settings it was declared
with; with a warm disk cache, a new process loads only the functions Python calls.
Compilations are counted (Numba's own counters), never timed."""

from __future__ import annotations

import os
from contextlib import contextmanager

import numba
import numpy as np
import pytest

from conftest import BY_NAME_TEMPLATE, script_json
from tilegemm.compile_cache import fill_template, load_module
from tilegemm.kernels.cpu import _slp
from tilegemm.kernels.cpu._lazy import called_by_name, load_compiled, njit_when_called

f8 = numba.float64


def test_compiled_on_first_call_from_python_with_the_declared_signature_only():
    @njit_when_called(f8(f8))
    def half(x):
        return x / 2

    assert half.signatures == []  # nothing compiled at declaration
    assert half(3) == 1.5  # an int converts to the declared float64, as with njit(sig)
    assert half.signatures == [(f8,)]
    with pytest.raises(TypeError):  # no other signature is compiled afterwards
        half(np.arange(3.0))
    assert half.signatures == [(f8,)]


def test_compiled_when_a_caller_compiles_under_the_declared_settings():
    from numba.core import event

    entered: list[str] = []
    active: list[bool] = []

    @contextmanager
    def setting():
        entered.append("in")
        active.append(True)
        yield
        active.pop()
        entered.append("out")

    @njit_when_called(f8(f8), settings=(setting,))
    def inner(x):
        return x + 1

    in_force: dict[str, bool] = {}

    class Listener(event.Listener):
        def on_start(self, ev):  # noqa: ANN001 - Numba's protocol
            in_force[ev.data["dispatcher"].py_func.__name__] = bool(active)

        def on_end(self, ev):  # noqa: ANN001
            pass

    with event.install_listener("numba:compile", Listener()):
        @numba.njit(f8(f8))
        def outer(x):
            return inner(x) * 2

    assert inner.signatures == [(f8,)] and entered == ["in", "out"]
    assert in_force == {"outer": False, "inner": True}  # in force for the helper alone
    assert outer(1.0) == 4.0


def test_vector_width_is_the_one_in_force_at_declaration():
    with _slp.vector_width(512):
        assert _slp.current_vector_width() == 512

        @njit_when_called(f8(f8))
        def plus(x):
            return x + 1

        with _slp.vector_width(None):  # nested blocks: the innermost width applies
            assert _slp.current_vector_width() is None
        assert _slp.current_vector_width() == 512
    assert _slp.current_vector_width() is None

    seen = []
    real = _slp._width_adder

    def spy(bits):
        seen.append(bits)
        return real(bits)

    _slp._width_adder = spy
    try:
        assert plus(1.0) == 2.0  # compiled outside any block: re-enters 512 for itself
    finally:
        _slp._width_adder = real
    assert seen == [512]


def test_vector_width_none_inside_a_width_restores_numbas_own_code():
    from numba.core import codegen

    lib = codegen.CPUCodeLibrary
    before = lib.add_ir_module
    with _slp.vector_width(256):
        patched = lib.add_ir_module
        assert patched is not before
        with _slp.vector_width(None):
            assert lib.add_ir_module is before
        assert lib.add_ir_module is patched
    assert lib.add_ir_module is before


# A module in the shape of the blocked rung's: helpers on first use, a probe that calls
# nothing compiled, and an entry point that calls the helpers.
TEMPLATE = '''
import numba
from tilegemm.kernels.cpu._lazy import load_compiled, njit_when_called

# @header
SCALE = 1
CACHE = False
# @end-header

f8 = numba.float64


@njit_when_called(f8(f8), cache=CACHE)
def helper(x):
    return SCALE * x


@njit_when_called(f8(f8), cache=CACHE)
def entry(x):
    return helper(x) + 1


@njit_when_called(numba.boolean(f8), cache=CACHE)
def probe(x):
    return x > 0


COMPILED = (helper, entry, probe)
CALLED_FROM_PYTHON = (probe, entry)
load_compiled(COMPILED, CALLED_FROM_PYTHON)
'''

LOAD = """
import json, sys, warnings
from numba.core import base

refreshes = []
real = base.BaseContext.refresh


def counted(self):
    refreshes.append(1)
    real(self)


base.BaseContext.refresh = counted
from tilegemm import compile_cache
m = compile_cache.load_module("lazyprobe", sys.argv[1], {"kernel": "lazyprobe"})
at_import = dict(compile_cache.STATS)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value = m.entry(2.0)
print(json.dumps({"at_import": at_import, "stats": compile_cache.STATS, "value": value,
                  "helper_signatures": len(m.helper.signatures), "refreshes": len(refreshes),
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                  "warned_at": [w.filename for w in caught]}))
"""


def _source(scale: int) -> str:
    return fill_template(TEMPLATE, {"SCALE": scale, "CACHE": False}, {})


def _filled_cache(tmp_path, monkeypatch, scale: int):
    """The template's module compiled into a cache at ``tmp_path``; the environment that
    points a new process at it."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    m = load_module("lazyprobe", _source(scale), {"kernel": "lazyprobe"})
    # a cold cache compiles everything, callees first (the helper included)
    assert [len(f.signatures) for f in m.COMPILED] == [1, 1, 1]
    assert m.entry(2.0) == 2.0 * scale + 1
    return dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))


def test_a_warm_cache_loads_only_what_python_calls_when_it_calls_it(tmp_path, monkeypatch):
    env = _filled_cache(tmp_path, monkeypatch, 3)
    again = script_json(LOAD, _source(3), env=env)
    # the probe at import, the entry point on its first call; its cached code holds the
    # helper's, so the helper is never loaded; and loading set up none of Numba's
    # registries (QuickLoadCache), which only compiling needs
    assert again == {"at_import": {"compiled": 0, "loaded": 1},
                     "stats": {"compiled": 0, "loaded": 2}, "value": 7.0,
                     "helper_signatures": 0, "refreshes": 0, "warnings": [],
                     "warned_at": []}


@pytest.mark.parametrize("damaged_file", ["nbc", "nbi"])  # the code, or the index
def test_a_damaged_entry_loaded_on_first_call_warns_and_is_compiled_again(tmp_path,
                                                                         monkeypatch,
                                                                         damaged_file):
    env = _filled_cache(tmp_path, monkeypatch, 5)
    damaged = list((tmp_path / "cpu" / "__pycache__").glob(f"*.entry-*.{damaged_file}"))
    assert damaged
    for f in damaged:
        f.write_bytes(f.read_bytes()[:40])  # truncated
    again = script_json(LOAD, _source(5), env=env)
    assert again["value"] == 11.0
    assert again["warned_at"] == ["<string>"]  # the caller's line, not Numba's
    [warning] = again["warnings"]
    assert warning.startswith("CompileCacheWarning: kernel cache entry of ")
    assert ".entry (in " in warning and "could not be loaded" in warning, warning
    # the entry point compiled (Numba's registries set up for it), against the helper
    # loaded from the cache; its entry rewritten, so the next process loads it
    assert again["stats"] == {"compiled": 1, "loaded": 2} and again["refreshes"] > 0
    third = script_json(LOAD, _source(5), env=env)
    assert third["stats"] == {"compiled": 0, "loaded": 2} and third["warnings"] == []


def test_a_compile_that_cannot_be_kept_warns_and_runs(tmp_path, monkeypatch):
    """A full disk (or a cache folder replaced mid-compile) failed the call that had just
    compiled its kernel: Numba's save raised ENOSPC out of the first call."""
    import errno
    import warnings

    from numba.core import caching

    from tilegemm.compile_cache import CompileCacheWarning

    def disk_full(self, sig, data):  # noqa: ANN001, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(caching.FunctionCache, "_save_overload", disk_full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = load_module("lazyprobe", _source(9), {"kernel": "lazyprobe"})  # compiles some
        assert m.entry(2.0) == 2.0 * 9 + 1
    kept = [w for w in caught if issubclass(w.category, CompileCacheWarning)]
    assert kept and all("could not be kept" in str(w.message) for w in kept)
    assert "No space left on device" in str(kept[0].message)


def test_a_cache_file_that_is_not_text_is_rewritten(tmp_path, monkeypatch):
    """A cache .py holding bytes that are not UTF-8 raised UnicodeDecodeError from every
    later call (and every process): it is damaged, and rewritten like any changed file."""
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    load_module("lazyprobe", _source(11), {"kernel": "lazyprobe"})
    (entry,) = (tmp_path / "cpu").glob("lazyprobe-*.py")
    entry.write_bytes(b"\xff\xfe not text")
    m = load_module("lazyprobe", _source(11), {"kernel": "lazyprobe"})
    assert m.entry(2.0) == 2.0 * 11 + 1
    assert entry.read_text().startswith("# ")


# A rung-like module whose entry point allocates (np.empty: its code refers to Numba's
# runtime and to an environment of numba.np.arrayobj).
ALLOCATING_TEMPLATE = '''
import numba
import numpy as np
from tilegemm.kernels.cpu._lazy import load_compiled, njit_when_called

# @header
SCALE = 1
CACHE = False
# @end-header


@njit_when_called(numba.float64(numba.float64[:, ::1]), cache=CACHE)
def entry(x):
    y = np.empty(x.shape[1])
    y[:] = SCALE
    return (x.sum(axis=0) * y).sum()


@njit_when_called(numba.boolean(numba.float64), cache=CACHE)
def probe(x):
    return x > 0


COMPILED = (entry, probe)
CALLED_FROM_PYTHON = (probe, entry)
load_compiled(COMPILED, CALLED_FROM_PYTHON)
'''

LOAD_ALLOCATING = """
import json, sys, warnings
import numpy as np
from llvmlite import binding
from numba.core.runtime import nrtdynmod

parsed, nrt_compiled = [], []
real_parse, real_nrt = binding.parse_bitcode, nrtdynmod.create_nrt_module
binding.parse_bitcode = lambda *a: parsed.append(1) or real_parse(*a)
nrtdynmod.create_nrt_module = lambda *a: nrt_compiled.append(1) or real_nrt(*a)
from tilegemm import compile_cache
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = compile_cache.load_module("allocating", sys.argv[1], {"kernel": "allocating"})
    value = m.entry(np.arange(6.0).reshape(2, 3))
print(json.dumps({"stats": compile_cache.STATS, "value": value,
                  "bitcode_parsed": len(parsed), "runtime_compiled": len(nrt_compiled),
                  "imported": [n for n in ("numba.np.arrayobj", "numpy.ma")
                               if n in sys.modules],
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""


def test_a_warm_cache_loads_machine_code_and_nothing_else(tmp_path, monkeypatch):
    """What a fresh process's first call does with a warm cache: load machine code. Numba
    itself would also parse each library's LLVM IR (kept for linking it into code compiled
    later), compile its runtime's functions again, import the module an allocation's
    environment belongs to (numba.np.arrayobj) and, to type a NumPy array, numpy.ma:
    together a sixth of that call on a 2-vCPU AMD EPYC family 25 model 1."""
    source = fill_template(ALLOCATING_TEMPLATE, {"SCALE": 2, "CACHE": False}, {})
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))
    first = script_json(LOAD_ALLOCATING, source, env=env)  # cold: compiles, keeps the runtime
    assert first["value"] == 30.0 and first["stats"]["compiled"] == 2
    assert first["runtime_compiled"] == 1 and first["warnings"] == []
    assert len(list((tmp_path / "cpu" / "__pycache__").glob("allocating-*.nrt.bin"))) == 1
    again = script_json(LOAD_ALLOCATING, source, env=env)
    # (the one IR parsed: the runtime's, a few functions, which every compile links)
    assert again == {"stats": {"compiled": 0, "loaded": 2}, "value": 30.0,
                     "bitcode_parsed": 1, "runtime_compiled": 0, "imported": [],
                     "warnings": []}


def test_a_damaged_runtime_file_warns_and_is_compiled_again(tmp_path):
    source = fill_template(ALLOCATING_TEMPLATE, {"SCALE": 3, "CACHE": False}, {})
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))
    script_json(LOAD_ALLOCATING, source, env=env)
    (kept,) = (tmp_path / "cpu" / "__pycache__").glob("allocating-*.nrt.bin")
    raw = bytearray(kept.read_bytes())
    raw[-5] ^= 0xFF  # one byte of the code changed, the size the same
    kept.write_bytes(bytes(raw))
    again = script_json(LOAD_ALLOCATING, source, env=env)
    assert again["value"] == 45.0 and again["runtime_compiled"] == 1
    [warning] = again["warnings"]
    assert warning.startswith("CompileCacheWarning: kernel cache entry ")
    assert ".nrt.bin could not be loaded" in warning and "checksum" in warning
    third = script_json(LOAD_ALLOCATING, source, env=env)  # rewritten whole
    assert third["runtime_compiled"] == 0 and third["warnings"] == []


@pytest.mark.parametrize("array", [
    np.zeros((3, 4)), np.zeros((3, 4), order="F"), np.zeros((3, 4))[:, ::2],
    np.zeros(5, np.float32), np.zeros((2, 3, 4), np.int64)[::2], np.zeros(()),
    np.zeros((2, 2), np.complex64)])
@pytest.mark.parametrize("writeable", [True, False])
def test_an_argument_is_typed_as_numbas_own_typeof_types_it(array, writeable):
    from numba.core.typing.typeof import Purpose, typeof

    array = array.copy() if array.flags.owndata else array
    array.flags.writeable = writeable

    @njit_when_called(f8(f8))
    def unused(x):
        return x

    assert unused.typeof_pyval(array) == typeof(array, Purpose.argument)


@pytest.mark.parametrize("value", [np.ma.zeros(3), np.zeros(3, "U3"), np.zeros(3, object),
                                   [1.0, 2.0], 2.5])
def test_a_masked_or_unsupported_argument_gets_numbas_own_answer(value):
    from numba.core.registry import CPUDispatcher

    @njit_when_called(f8(f8))
    def unused(x):
        return x

    try:
        expected = CPUDispatcher.typeof_pyval(unused, value)
    except Exception as exc:  # noqa: BLE001 - a masked array: Numba refuses it
        with pytest.raises(type(exc), match="MaskedArray"):
            unused.typeof_pyval(value)
    else:
        assert unused.typeof_pyval(value) == expected


def test_a_call_that_lost_the_race_to_compile_runs_the_compiled_signature():
    """Two threads call a helper that nothing compiled yet: both find no compiled
    signature, one compiles it; the other must then run it (Numba refuses to compile
    once compiling is disabled, which njit(signature) semantics require)."""
    @njit_when_called(f8(f8))
    def inc(x):
        return x + 1

    assert inc(1.0) == 2.0
    # the late thread's view: the dispatcher asks for a compilation it no longer needs
    assert inc._compile_for_args(1.0) is inc  # handed back to the dispatcher, which runs it
    assert inc.signatures == [(f8,)]


def test_threads_calling_a_helper_first_at_once_all_get_the_result():
    import threading
    from concurrent.futures import ThreadPoolExecutor

    @njit_when_called(f8(f8))
    def square(x):
        return x * x

    barrier = threading.Barrier(8)

    def call(i: int) -> float:
        barrier.wait()
        return square(float(i))

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(call, range(8))) == [float(i * i) for i in range(8)]
    assert square.signatures == [(f8,)]


def test_load_compiled_without_a_cache_compiles_everything_in_order():
    order: list[str] = []

    def declared(name):
        @njit_when_called(f8(f8))
        def f(x):
            return x

        real = f.ensure

        def ensure():
            if f.pending:
                order.append(name)
            real()

        f.ensure = ensure
        return f

    a, b, c = declared("a"), declared("b"), declared("c")
    load_compiled((a, b, c), (c, b))
    assert order == ["c", "a", "b"]  # the probe, then everything in the order given
    assert all(len(f.signatures) == 1 for f in (a, b, c))


UNPICKLE = """
import json, pickle, sys
f = pickle.loads(open(sys.argv[1], "rb").read())
pending = f.pending
print(json.dumps({"pending": pending, "width": f.declaration[2], "value": f(2.0),
                  "signatures": len(f.signatures)}))
"""


@pytest.mark.parametrize("used_first", [False, True])
def test_a_pickled_helper_comes_back_pending_with_its_declaration(tmp_path, used_first):
    """In another process (in this one, Numba hands back the same object): still the
    declared signature only, compiled there under the declared settings."""
    import pickle

    with _slp.vector_width(256):
        @njit_when_called(f8(f8))
        def triple(x):
            return 3 * x

    if used_first:
        assert triple(2.0) == 6.0
    path = tmp_path / "f.pickle"
    path.write_bytes(pickle.dumps(triple))
    assert script_json(UNPICKLE, str(path)) == {"pending": True, "width": 256, "value": 6.0,
                                                "signatures": 1}


def test_a_helper_without_its_declaration_compiles_like_numbas_own():
    """Built as Numba builds one (e.g. by a tool that copies dispatchers): no declaration,
    so a call compiles for the arguments given, instead of asking itself again forever."""
    from tilegemm.kernels.cpu._lazy import WhenCalledDispatcher

    def double(x):
        return 2 * x

    plain = WhenCalledDispatcher(double, targetoptions={"nopython": True})
    assert plain(2.5) == 5.0 and plain.signatures == [(f8,)]


PARALLEL_TEMPLATE = '''
import numba
import numpy as np
from numba import prange
from tilegemm.kernels.cpu._lazy import load_compiled, njit_when_called

# @header
CACHE = False
# @end-header


@njit_when_called(numba.void(numba.float64[::1]), parallel=True, cache=CACHE)
def fill(x):
    for i in prange(x.shape[0]):
        x[i] = 2.0 * i


@njit_when_called(numba.float64(numba.int64), cache=CACHE)
def total(n):
    x = np.empty(n)
    fill(x)
    return x.sum()


@njit_when_called(numba.boolean(numba.int64), cache=CACHE)
def probe(n):
    return n > 0


COMPILED = (fill, total, probe)
CALLED_FROM_PYTHON = (probe, total)
load_compiled(COMPILED, CALLED_FROM_PYTHON)
'''

LOAD_PARALLEL = """
import json, sys
from tilegemm import compile_cache
m = compile_cache.load_module("lazypar", sys.argv[1], {"kernel": "lazypar"})
print(json.dumps({"stats": compile_cache.STATS, "value": m.total(10)}))
"""


def test_a_caller_compiled_against_a_cached_parallel_helper_loads_alone(tmp_path):
    """A partial cache (here the caller's entry removed; also two processes filling one
    entry at once): the caller is compiled against the parallel helper loaded from the
    cache, and cached. A later process loads only the caller; it must start the threading
    layer the helper needs (it aborted in LLVM, "Symbol not found: allocate_sched")."""
    source = fill_template(PARALLEL_TEMPLATE, {"CACHE": False}, {})
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))

    def run() -> dict:
        return script_json(LOAD_PARALLEL, source, env=env)

    assert run() == {"stats": {"compiled": 3, "loaded": 0}, "value": 90.0}
    removed = list((tmp_path / "cpu" / "__pycache__").glob("*.total-*"))
    assert removed
    for f in removed:
        f.unlink()
    assert run() == {"stats": {"compiled": 1, "loaded": 2}, "value": 90.0}  # fill loaded
    assert run() == {"stats": {"compiled": 0, "loaded": 2}, "value": 90.0}


LOAD_BY_NAME = """
import json, sys, warnings
import numpy as np
from tilegemm import compile_cache
m = compile_cache.load_module("byname", sys.argv[1], {"kernel": "byname"})
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value = m.second(np.arange(4.0))
print(json.dumps({"stats": compile_cache.STATS, "value": value,
                  "signatures": [len(f.signatures) for f in m.COMPILED],
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""


@njit_when_called(f8(f8))
def _twice(x):
    return 2 * x


_call_twice = called_by_name(_twice)


@njit_when_called(f8(f8))
def _reaches_twice(x):
    return sum([_call_twice(x) for _ in range(2)])


def test_the_helpers_a_function_reaches_by_name_are_found_in_nested_code_too():
    """What must be loaded before a function: the by-name helpers its code calls, also
    from a comprehension (a code object of its own), and those of the functions it calls."""
    from tilegemm.kernels.cpu._lazy import _reached_by_name

    def outer(x):
        return _reaches_twice(x)

    assert [c.callee for c in _reached_by_name(outer)] == [_twice]
    assert _twice.pending  # finding it compiled nothing


def _by_name_module(tmp_path, monkeypatch, scale: int):
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    source = fill_template(BY_NAME_TEMPLATE, {"SCALE": scale, "CACHE": False}, {})
    return load_module("byname", source, {"kernel": "byname"}), source


def test_a_helper_called_by_name_is_compiled_once_and_its_callers_only_call_it(
        tmp_path, monkeypatch):
    """The callers' code declares the helper's symbol and calls it; the helper's own code
    (here its error message) is in its library only, not linked into theirs."""
    m, _ = _by_name_module(tmp_path, monkeypatch, 3)
    x = np.arange(4.0)
    assert m.first(x) == 3 * 6.0 + 1 and m.second(x) == 2 * (3 * 6.0 + 1)
    symbol = m.call_heavy.by_name.symbol
    assert symbol == f"tilegemm.{m.__name__}.heavy"
    for caller in (m.first, m.second):
        ir = caller.inspect_llvm(caller.signatures[0])
        assert f"declare i32 @{symbol}(" in ir and f"call i32 @{symbol}(" in ir
        assert "heavy needs a value" not in ir
    assert "heavy needs a value" in m.heavy.inspect_llvm(m.heavy.signatures[0])
    # an exception raised in the helper reaches Python through both callers
    for caller in (m.first, m.second):
        with pytest.raises(ValueError, match="heavy needs a value"):
            caller(np.empty(0))


def test_a_new_process_loads_a_helper_called_by_name_before_its_caller(tmp_path,
                                                                      monkeypatch):
    """A caller from the disk cache refers to the helper by name: the helper is loaded and
    named first (else LLVM stops the process: the symbol cannot be resolved), and nothing
    the caller does not reach is loaded (``first`` is inside ``second``'s code)."""
    _, source = _by_name_module(tmp_path, monkeypatch, 5)
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))
    again = script_json(LOAD_BY_NAME, source, env=env)
    assert again == {"stats": {"compiled": 0, "loaded": 3}, "value": 2 * (5 * 6.0 + 1),
                     "signatures": [1, 0, 1, 1], "warnings": []}


def test_a_damaged_helper_called_by_name_is_compiled_again_under_the_same_name(
        tmp_path, monkeypatch):
    """The helper's cached code damaged: it is compiled again in the next process, and the
    caller loaded from the cache finds it under the name it was compiled against."""
    _, source = _by_name_module(tmp_path, monkeypatch, 7)
    damaged = list((tmp_path / "cpu" / "__pycache__").glob("*.heavy-*.nbc"))
    assert damaged
    for f in damaged:
        f.write_bytes(f.read_bytes()[:40])
    env = dict(os.environ, TILEGEMM_KERNEL_CACHE=str(tmp_path))
    again = script_json(LOAD_BY_NAME, source, env=env)
    assert again["value"] == 2 * (7 * 6.0 + 1)
    assert again["stats"] == {"compiled": 1, "loaded": 2}, again
    [warning] = again["warnings"]
    assert ".heavy (in " in warning and "could not be loaded" in warning


def _instructions(asm: str) -> list[str]:
    """The instructions of an assembly listing, with Numba's mangled names (which carry the
    module's name and a counter) and local labels blanked."""
    import re

    out = []
    for line in asm.splitlines():
        line = line.split("#")[0].rstrip()
        if not line.startswith("\t") or line.lstrip().startswith("."):
            continue
        line = re.sub(r"_ZN\w+", "SYM", line.strip())
        out.append(re.sub(r"\.L\w+", "LABEL", line))
    return out


@pytest.mark.slow
def test_the_rungs_micro_kernel_compiles_as_the_eager_one_and_only_once(tmp_path,
                                                                       monkeypatch):
    """The rung's micro-kernel, compiled on first use under its declared settings (the SLP
    vectoriser, the vector width), is the same machine code as the one compiled eagerly
    inside those settings (``k02_blocked.micro_kernel``), which the vectorisation tests
    read. Its code, and that of the tile loop, packing and the unpacked tiles, is generated
    in one or two code libraries (its own, and the tile loop's, which inlines it), not in
    every function that reaches it (``called_by_name``; about ten before); so is the
    calling thread's path (``small``, seven before) and the parallel region (two before:
    its own and the threaded driver's). A small int32 tile, compiled here from an empty
    cache."""
    import re

    from numba.core import codegen

    from tilegemm import registry
    from tilegemm.kernels.cpu import k02_blocked

    # the libraries whose code each helper's is linked into, to be optimised and compiled
    linked: dict[str, list[str]] = {"ukernel": [], "macro": [], "pack_a": [], "pack_b": [],
                                    "direct": [], "few_rows": [], "small": [],
                                    "run_parallel": []}
    real = codegen.CPUCodeLibrary._optimize_final_module

    def optimize(self):  # noqa: ANN001, ANN202 - after linking, before inlining
        names = [f.name for f in self._final_module.functions if not f.is_declaration]
        for helper, libraries in linked.items():  # mangled: the name's length, the name
            if any(re.search(rf"{len(helper)}{helper}B", n) for n in names):
                libraries.append(self.name)
        real(self)

    monkeypatch.setattr(codegen.CPUCodeLibrary, "_optimize_final_module", optimize)
    monkeypatch.setenv("TILEGEMM_KERNEL_CACHE", str(tmp_path))
    dtype = np.dtype("int32")
    spec = registry.get("blocked", "cpu")
    params = spec.resolve({"MR": 4, "NR": 8, "MC": 48, "KC": 64, "NC": 256})
    program = spec.program(params, dtype)
    assert linked == {"ukernel": ["ukernel", "macro"], "macro": ["macro"],
                      "pack_a": ["pack_a"], "pack_b": ["pack_b"],
                      "direct": ["direct"], "few_rows": ["few_rows"], "small": ["small"],
                      "run_parallel": ["run_parallel"]}, linked
    ukernel = program.__globals__["ukernel"]
    lazy = _instructions(ukernel.inspect_asm(ukernel.signatures[0]))
    eager_fn = k02_blocked.micro_kernel(4, 8, dtype)
    eager = _instructions(eager_fn.inspect_asm(eager_fn.signatures[0]))
    assert lazy and lazy == eager


FORK_WHILE_HELD = """
import json, os, signal, sys, threading
import numba
from numba.core.compiler_lock import global_compiler_lock
from tilegemm.kernels.cpu import _slp
from tilegemm.kernels.cpu._lazy import njit_when_called

with _slp.vector_width(256):
    @njit_when_called(numba.float64(numba.float64))
    def plus(x):
        return x + 1

# Another thread inside a settings block and Numba's compiler lock (as a rung function
# loading on its first call is) when the main thread forks.
held, done = threading.Event(), threading.Event()

def holder():
    with _slp.slp_enabled(), _slp.vector_width(512), global_compiler_lock:
        held.set()
        done.wait(60)

threading.Thread(target=holder, daemon=True).start()
held.wait(60)
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang ends the child with SIGALRM instead of the test run
    from numba.core import config
    ok = plus(1.0) == 2.0 and not _slp._WIDTHS and config.SLP_VECTORIZE == 0
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
done.set()
print(json.dumps({"child": os.waitstatus_to_exitcode(status)}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_another_thread_compiles_does_not_hang():
    """The other thread does not exist in the child: the Python-level locks it held (the
    settings lock, Numba's compiler lock), and the settings it had in force, are released
    there (they used to hang the child's first compile). A thread caught inside LLVM itself
    holds LLVM's own mutexes, which no fork handler can free: forking a process whose
    other threads compile remains unsafe, as POSIX says of any multi-threaded fork."""
    assert script_json(FORK_WHILE_HELD, timeout=120) == {"child": 0}


def test_ctrl_c_during_a_compile_stops_it_between_compiler_passes():
    """Python's handler raised KeyboardInterrupt wherever Python was: inside llvmlite's
    callbacks it was printed and dropped (Ctrl-C ignored for the rest of the compile), and
    between two llvmlite calls it could leave a module owned twice (a crash at exit). While
    a rung compiles, Ctrl-C is noted and raised at the next compiler pass; a second one
    raises at once; outside a compile nothing changes."""
    import signal

    import numba

    from tilegemm.kernels.cpu import _lazy

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own
    try:
        _interrupting_a_compile(signal, numba, _lazy)
    finally:
        signal.signal(signal.SIGINT, before)


def _interrupting_a_compile(signal, numba, _lazy):  # noqa: ANN001, ANN202
    fresh = numba.njit(lambda x: x + 1)
    with pytest.raises(KeyboardInterrupt), _lazy.interruptible():
        assert signal.getsignal(signal.SIGINT) is _lazy._note_interrupt
        signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # noted, not raised here
        fresh(1)  # the first compiler pass raises it
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not _lazy._stop_requested
    with pytest.raises(KeyboardInterrupt), _lazy.interruptible():
        _lazy._note_interrupt(signal.SIGINT, None)
        _lazy._note_interrupt(signal.SIGINT, None)  # the second: at once
    with pytest.raises(KeyboardInterrupt), _lazy.interruptible():
        _lazy._note_interrupt(signal.SIGINT, None)  # after the last pass: still raised
    assert fresh(2) == 3  # nothing left pending: compiles and runs
