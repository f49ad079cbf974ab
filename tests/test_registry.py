"""The registry: one declaration per rung, constraints as data, clear errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tilegemm
import tilegemm.errors
from tilegemm import registry
from tilegemm.registry import Constraint, KernelSpec, Param


def _spec() -> KernelSpec:
    return KernelSpec(
        name="toy", backend="cpu", rung=99, title="toy", build=lambda p, d: None,
        params=(Param("BM", 64, (16, 32, 64, 12)), Param("TM", 4, (1, 2, 4, 3))),
        constraints=(Constraint("BM % TM == 0", lambda p: p["BM"] % p["TM"] == 0),),
    )


def test_resolve_fills_defaults_and_validates():
    s = _spec()
    assert s.resolve() == {"BM": 64, "TM": 4}
    assert s.resolve({"BM": 32}) == {"BM": 32, "TM": 4}
    with pytest.raises(ValueError, match="constraint 'BM % TM == 0' fails"):
        s.resolve({"BM": 16, "TM": 3})
    with pytest.raises(ValueError, match="choose one of 16, 32, 64, 12"):
        s.resolve({"BM": 48})
    with pytest.raises(ValueError, match="has no parameter"):
        s.resolve({"XX": 1})
    with pytest.raises(ValueError, match="must be an integer"):
        s.resolve({"BM": 16.0})


def test_space_prunes_with_the_same_predicates():
    space = list(_spec().space())
    assert {"BM": 16, "TM": 3} not in space
    assert {"BM": 12, "TM": 3} in space
    assert all(p["BM"] % p["TM"] == 0 for p in space)
    assert len(space) == sum(1 for bm in (16, 32, 64, 12) for tm in (1, 2, 4, 3) if bm % tm == 0)


def test_is_valid_agrees_with_resolve_without_writing_messages(monkeypatch) -> None:
    """A search asks is_valid of every combination (288,000 for CUDA pipelined): the
    message a refusal carries must not be written for it, and the answer must be
    resolve's."""
    s = _spec()
    cases = [{"BM": bm, "TM": tm} for bm in (16, 32, 64, 12, 48) for tm in (1, 2, 4, 3)]
    cases += [{}, {"BM": 16}, {"TM": 3}, {"XX": 1}, {"BM": 16.0}, {"BM": True}]
    want = []
    for case in cases:
        try:
            s.resolve(case)
            want.append(True)
        except ValueError:
            want.append(False)

    def no_message(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("is_valid wrote a refusal's message")

    monkeypatch.setattr(KernelSpec, "_constraint_message", no_message)
    assert [s.is_valid(case) for case in cases] == want
    assert not all(want) and any(want)


def test_every_rungs_space_is_its_valid_combinations() -> None:
    """space() checks only the constraints (its combinations are the offered values of
    every parameter): a combination is in it exactly when is_valid says so (about 2,000
    of each rung's grid checked, invalid ones among them)."""
    from itertools import product

    refused = 0
    for spec in registry.all_specs():
        names = [p.name for p in spec.params]
        grid = list(product(*(p.choices for p in spec.params)))
        if len(grid) <= 50_000:  # the whole space, as the tuner's candidates filter it
            space = {tuple(c[n] for n in names) for c in spec.space()}
        else:  # (the CPU rung's 10 million: each sampled point, held by ``fixed``)
            space = {tuple(c[n] for n in names) for values in grid[::len(grid) // 2000]
                     for c in spec.space(dict(zip(names, values)))}
        for values in grid[::max(1, len(grid) // 2000)]:
            valid = spec.is_valid(dict(zip(names, values)))
            assert (values in space) == valid, (spec.key, values)
            refused += not valid
    assert refused


def test_a_space_with_fixed_parameters_is_the_part_of_the_space_that_holds_them() -> None:
    """``space(fixed)`` (the tuner's candidates, holding the parameters it does not search)
    is exactly the combinations of ``space()`` with those values, in the same order, and
    empty for a value the parameter does not offer."""
    from itertools import product

    spec = _spec()
    for fixed in ({"TM": 3}, {"BM": 16}, {"BM": 12, "TM": 3}, {"BM": 16, "TM": 3}, {}):
        assert list(spec.space(fixed)) == [
            p for p in spec.space() if all(p[k] == v for k, v in fixed.items())], fixed
    assert list(spec.space({"BM": 48})) == []
    blocked = registry.get("blocked", "cpu")
    held = {"FEW_KB": 1024, "FEW_KC": 64, "UNPACKED_KB": 1024, "VECTOR_KB": 2048, "MR": 6}
    free = [p for p in blocked.params if p.name not in held]
    expected = [c for c in ({**held, **dict(zip((p.name for p in free), values))}
                            for values in product(*(p.choices for p in free)))
                if blocked.is_valid(c)]
    got = list(blocked.space(held))
    assert got and sorted(map(sorted, map(dict.items, got))) == sorted(
        map(sorted, map(dict.items, expected)))


def test_every_registered_rung_is_well_formed():
    specs = tilegemm.kernels()
    assert specs, "no rungs registered"
    keys = [s.key for s in specs]
    assert len(keys) == len(set(keys))
    for s in specs:
        assert s.backend in registry.BACKENDS
        assert s.summary, f"{s.key} has no docstring saying what changed and why"
        defaults = s.resolve()  # defaults satisfy the rung's own constraints
        for p in s.params:
            assert p.name.isupper(), f"{s.key}: parameter names are upper-case"
            assert p.default in p.choices
        if s.smem is not None:
            assert s.smem(defaults, 4) >= 0
        sim = s.sim_params
        if sim is not None:
            s.resolve(sim)


def test_rung_numbers_are_unique_per_backend():
    for backend in registry.BACKENDS:
        rungs = [s.rung for s in registry.specs_for(backend)]
        assert len(rungs) == len(set(rungs)), backend


def test_default_for_is_the_flagged_rung_else_the_highest(monkeypatch) -> None:
    cpu = registry.specs_for("cpu")
    best = registry.default_for("cpu", "float32")
    assert best.auto and best.rung == max(s.rung for s in cpu if s.supports("float32"))
    with pytest.raises(ValueError, match="choices"):
        registry.get("nope", "cpu")
    # without a flag, the highest rung that computes the dtype
    unflagged = [replace(s, auto=False) for s in cpu]
    monkeypatch.setattr(registry, "specs_for", lambda backend: unflagged)
    assert registry.default_for("cpu", "int32").rung == max(s.rung for s in unflagged)


@pytest.mark.parametrize("backend", registry.BACKENDS)
def test_a_rung_added_above_the_flagged_one_is_not_auto(backend, monkeypatch) -> None:
    """Adding a rung (a new file in kernels/<backend>/) must not change what kernel="auto"
    runs: each backend flags its rung for auto, so the new one runs only when named."""
    specs = registry.specs_for(backend)
    before = {d: registry.default_for(backend, d).name for d in ("float32", "float64")
              if any(s.supports(d) and not s.precisions for s in specs)}
    assert before, backend
    top = max(specs, key=lambda s: s.rung)
    added = replace(top, name="added_rung", rung=top.rung + 1, auto=False, precisions={},
                    precision_param="", dtypes=("float32", "float64", "int32", "int64"))
    monkeypatch.setattr(registry, "specs_for", lambda b: [*specs, added])
    for dtype, name in before.items():
        assert registry.default_for(backend, dtype).name == name


def test_program_is_built_once():
    spec = registry.get("triple_loop", "cpu")
    assert spec.program({}, np.float32) is spec.program({}, np.dtype("float32"))


def test_every_registration_line_names_a_known_probe_hint() -> None:
    """A backend's registration line is all a new backend adds outside its own files."""
    from tilegemm.backends import _probe
    from tilegemm.registry import REGISTERED

    assert {b.gpu_hint for b in REGISTERED} <= set(_probe.HINTS)
    assert _probe.HINTS["none"]() is False


def test_a_backend_is_named_only_in_its_own_files_and_its_registration_line() -> None:
    """Adding the cudac backend touched backends/cudac.py, kernels/cudac/ and the registry
    line (plus its dependency in pyproject.toml): no other source file names it."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "src" / "tilegemm"
    own = {src / "backends" / "cudac.py", src / "registry.py"}
    naming = [str(p.relative_to(src)) for p in src.rglob("*.py")
              if p not in own and (src / "kernels" / "cudac") not in p.parents
              and re.search(r"\bcudac\b", p.read_text())]
    assert naming == []


def test_changed_alters_one_parameter_and_refuses_an_unknown_one() -> None:
    params = (Param("BM", 128, (64, 128)), Param("BK", 16, (8, 16), "depth"))
    out = registry.changed(params, "BK", default=8)
    assert out == (params[0], Param("BK", 8, (8, 16), "depth"))
    assert params[1].default == 16  # the original is left as it was
    with pytest.raises(KeyError, match="no parameter 'TM'"):
        registry.changed(params, "TM", default=4)


def test_derived_rungs_keep_their_source_rungs_limits() -> None:
    """Rungs declared from another rung's SPEC (rung 2 from 1, 7 from 6, OpenCL 1 and 3
    from CUDA's, 9 from 8) differ from it only where they say so."""
    cases = [(("coalesced", "cuda", 2), ("naive", "cuda"), set()),
             (("smem_layout", "cuda", 7), ("vectorized", "cuda"), {"TM"}),
             (("naive", "opencl", 1), ("naive", "cuda"), set()),
             (("shared", "opencl", 3), ("shared", "cuda"), set())]
    for (name, backend, rung), source, differ in cases:
        spec, src = registry.get(name, backend), registry.get(*source)
        assert (spec.name, spec.backend, spec.rung) == (name, backend, rung)
        assert spec.doc and spec.doc != src.doc and spec.build is not src.build
        assert {p.name for p in spec.params if p not in src.params} == differ
        assert spec.constraints == src.constraints and spec.dtypes == src.dtypes
        for p in spec.space():
            assert spec.threads(p) == src.threads(p) and spec.smem(p, 4) == src.smem(p, 4)
    pipelined, warptile = registry.get("pipelined", "cuda"), registry.get("warptile", "cuda")
    assert pipelined.threads is warptile.threads
    assert pipelined.constraints[:3] == warptile.constraints[:3]


def test_repr_is_one_short_line_with_the_parameter_defaults():
    """``tilegemm.kernels()`` at the prompt: one line per rung, not the dataclass's fields
    (docstring, build function...)."""
    blocked = registry.get("blocked", "cpu")
    shown = ", ".join(f"{p.name}={p.default}" for p in blocked.params).replace(",", "")
    assert repr(blocked) == f"<KernelSpec cpu:blocked (rung 2) {shown}>"
    assert repr(registry.get("triple_loop", "cpu")) == "<KernelSpec cpu:triple_loop (rung 1)>"
    for spec in tilegemm.kernels():
        assert "\n" not in repr(spec) and len(repr(spec)) <= 128
        assert "function" not in repr(spec) and spec.doc[:20] not in repr(spec)
    # equality and hashing stay by identity (one object per rung)
    assert blocked == registry.get("blocked", "cpu") and blocked != _spec()
    assert len({blocked, registry.get("blocked", "cpu")}) == 1


def test_unknown_kernel_hint_names_a_usable_backend_first(monkeypatch):
    """A rung of several backends: the hint names the usable ones first and recommends one
    of them, never a backend this machine cannot run."""
    import importlib
    from types import SimpleNamespace

    backends = importlib.import_module("tilegemm.backends")  # the package, not the function
    usable = {"cuda": False, "opencl": True, "cpu": True, "cudac": False}
    monkeypatch.setattr(backends, "get_backend", lambda n: SimpleNamespace(
        status=lambda: SimpleNamespace(usable=usable[n])))
    with pytest.raises(ValueError) as err:
        registry.get("shared", "cpu")
    # the advice right after the usable backend, the unusable ones after it, so "not usable"
    # cannot be read as said of OpenCL
    assert ("(kernel 'shared' is a rung of backend 'opencl': pass backend='opencl'; also of "
            "backends 'cuda' and 'cudac', none of them usable here); choices: triple_loop, "
            "blocked") in str(err.value)
    usable["opencl"] = False
    with pytest.raises(ValueError) as err:
        registry.get("shared", "cpu")
    assert ("(kernel 'shared' is a rung of backends 'cuda', 'opencl' and 'cudac', none of "
            "them usable here); choices") in str(err.value)
    assert "pass backend" not in str(err.value)


def test_parameters_without_a_kernel_are_worded_for_the_caller():
    err = registry.ParametersNeedKernel(["TILE", "R"])
    assert isinstance(err, ValueError) and isinstance(err, tilegemm.errors.UsageError)
    assert str(err) == ("parameters TILE, R need an explicit kernel= (kernel='auto' chooses "
                        "its own)")
    assert err.params == ("TILE", "R")
    assert err.wording("--kernel", "--kernel auto") == (
        "parameters TILE, R need an explicit --kernel (--kernel auto chooses its own)")


def _smem_target(limit: int):
    from tilegemm.backends.base import Limits, Target

    return Target("cuda", "toy GPU", "gpu", "sm_90", Limits(threads_per_block=1024,
                  shared_per_block=limit, shared_optin_per_block=limit), timer="events")


@pytest.mark.parametrize(("kernel", "named", "absent"), [
    ("wgmma", "BM, BN or STAGES", "BK"),
    ("mma", "BM, BN, BK or STAGES", "TILE"),
    ("shared", "TILE", "STAGES"),
    ("register1d", "TILE", "STAGES"),
])
def test_shared_memory_message_names_only_the_rungs_own_parameters(kernel, named, absent):
    from tilegemm.backends.base import check_block_limits

    spec = registry.get(kernel, "cuda")
    params = spec.defaults()
    need = spec.smem(params, 4)
    with pytest.raises(ValueError) as err:
        check_block_limits(spec, params, np.dtype(np.float32), _smem_target(need - 1))
    text = str(err.value)
    assert f"needs {need} bytes of shared memory" in text
    assert text.endswith(f"; choose a smaller {named}")
    assert absent not in text.split(";")[-1]


def test_a_program_is_built_once_when_threads_ask_for_it_at_once():
    """A thread pool's first products all ask for the same program: one builds it, the
    others wait and get the same object (each used to run its own build)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    calls = []

    @registry._BuiltOnce
    def build(name):
        calls.append(name)
        time.sleep(0.2)  # long enough for every thread to arrive meanwhile
        return object()

    barrier = threading.Barrier(6)

    def ask(_):
        barrier.wait()
        return build("k")

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(ask, range(6)))
    assert calls == ["k"] and all(g is got[0] for g in got)
    build.cache_clear()
    assert build("k") is not got[0] and calls == ["k", "k"]


def test_a_child_forked_during_a_build_builds_on_its_own():
    """A build another thread was running when the process forked never ends in the child:
    the child's own call builds instead of waiting for ever."""
    import os
    import signal
    import threading

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    started, release = threading.Event(), threading.Event()

    @registry._BuiltOnce
    def build(name):
        if threading.current_thread() is not threading.main_thread():
            started.set()
            release.wait(30)
        return name

    other = threading.Thread(target=build, args=("k",))
    other.start()
    started.wait(30)
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)
        os._exit(0 if build("k") == "k" else 1)
    _, status = os.waitpid(pid, 0)
    release.set()
    other.join(30)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_failed_constraint_names_its_values_and_marks_defaults():
    """The message named only the first failed constraint, with every value, so a default
    the caller never set read as the cause; a constraint naming no parameter read 'fails
    for ' with nothing after it."""
    s = KernelSpec(name="x", backend="cpu", rung=1, title="t", build=None,
                   params=(Param("BK", 16, (4, 16), "h"), Param("TN", 4, (4, 8), "h"),
                           Param("VW", 4, (4, 8), "h")),
                   constraints=(Constraint("TN % VW == 0", lambda p: p["TN"] % p["VW"] == 0),
                                Constraint("BK % VW == 0", lambda p: p["BK"] % p["VW"] == 0),
                                Constraint("fits the device", lambda p: p["VW"] < 8)))
    with pytest.raises(ValueError) as err:
        s.resolve({"BK": 4, "VW": 8})
    text = str(err.value)
    assert text.index("'BK % VW == 0' fails for BK=4, VW=8") < text.index(
        "'TN % VW == 0' fails for TN=4 (default), VW=8")
    assert "'fits the device' fails (" in text or "'fits the device' fails;" in text
    assert "values marked (default) can be set too" in text
    with pytest.raises(ValueError) as err:
        s.resolve({"TN": 8, "VW": 8, "BK": 16})
    assert "(default)" not in str(err.value)
