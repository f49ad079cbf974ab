"""The autotuner without a GPU: strategies with a fake backend and timer, the cache's
round trip and failure modes, and kernel="auto" consulting it."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping

import numpy as np
import pytest

from tilegemm import registry
from tilegemm.backends.base import Backend, BackendStatus, Prepared, Target
from tilegemm.registry import Constraint, KernelSpec, Param
from tilegemm.tune import cache, select, space, strategies
from tilegemm.tune.cache import DeviceId, Entry, TuneCacheWarning


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN202
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path / "cache"))
    select._memo.clear()
    yield
    select._memo.clear()


# --- a fake rung and backend: time = f(params), some candidates compute wrong results ----

FAKE = KernelSpec(
    name="fake", backend="cpu", rung=99, title="fake", build=lambda p, d: None,
    params=(Param("X", 2, (1, 2, 4, 8, 16)), Param("Y", 1, (1, 2, 3))),
    constraints=(Constraint("X*Y <= 32", lambda p: p["X"] * p["Y"] <= 32),),
    threads=lambda p: p["X"] * 64, smem=lambda p, itemsize: p["Y"] * 1024 * itemsize,
)


class FakeBackend(Backend):
    """Times are a function of the parameters; (X=8, Y=2) would be fastest but computes a
    WRONG result; every fifth launch of a candidate is a 100 s outlier, so only the median
    can pick the right winner."""

    name = "cpu"

    def __init__(self) -> None:
        self.prepared: list[dict[str, int]] = []

    def status(self) -> BackendStatus:
        return BackendStatus("cpu", True, "fake", ("fake cpu",))

    def run(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        raise AssertionError("the tuner must use prepare()")

    def check_limits(self, spec: KernelSpec, params: Mapping[str, int], dtype, target=None) -> None:  # noqa: ANN001
        if spec.threads(params) > 512:
            raise ValueError("too many threads")

    def prepare(self, spec, params, prob, a3, b3, target=None) -> Prepared:  # noqa: ANN001
        self.prepared.append(dict(params))
        x, y = params["X"], params["Y"]
        good = np.matmul(a3.astype(np.float64), b3).astype(prob.dtype)
        wrong = (x, y) == (8, 2)
        base = 1.0 / (x * y) + 0.01 * y

        def fetch() -> np.ndarray:
            return good + 1.0 if wrong else good

        launches = [0]

        def elapsed(n: int) -> list[float]:
            times = []
            for _ in range(n):
                launches[0] += 1
                times.append(100.0 if launches[0] % 5 == 0 else base * (1 + 0.001 * launches[0]))
            return times

        return Prepared(launch=lambda: None, fetch=fetch, elapsed=elapsed)


class FakeGpu(FakeBackend):
    name = "cuda"

    def status(self) -> BackendStatus:
        return BackendStatus("cuda", True, "fake", ("NVIDIA H100 80GB HBM3 (sm_90)",),
                             accelerated=True)

    def _target(self, index: int | None) -> Target:
        from tilegemm.backends.cuda import CUDA_LIMITS

        return Target("cuda", "NVIDIA H100 80GB HBM3", "gpu", "sm_90", CUDA_LIMITS,
                      "CUDA events", accelerated=True)

    def check_limits(self, spec, params, dtype, target=None) -> None:  # noqa: ANN001
        from tilegemm.backends.cuda import CudaBackend

        CudaBackend.check_limits(self, spec, params, dtype, target)  # type: ignore[arg-type]


def _prob() -> strategies.GemmProblem:
    return strategies.problem_for(5, 7, 3, "float32")


def test_space_prunes_with_constraints_and_limits() -> None:
    limits = space.Limits(threads_per_block=512, shared_per_block=2 * 1024 * 4)
    cands = space.candidates(FAKE, "float32", limits)
    assert cands and all(p["X"] * p["Y"] <= 32 for p in cands)  # the rung's constraint
    assert all(p["X"] * 64 <= 512 and p["Y"] <= 2 for p in cands)  # device limits
    assert {"X": 8, "Y": 2} in cands and {"X": 16, "Y": 1} not in cands


def test_a_cpu_device_searches_only_the_tiles_worth_timing_there() -> None:
    """OpenCL ``vectorized`` on a CPU device: staged tiles only copy data through local
    memory there, so the tuner times one-work-item tiles, each once (BK, which they do not
    read, at its smallest valid value); the device default and the database's tiles are
    among them. Other kinds of device, and rungs without such a rule, search everything."""
    from tilegemm import registry
    from tilegemm.tune import database

    spec = registry.get("vectorized", "opencl")
    limits = space.Limits(threads_per_block=4096)
    cpu = space.candidates(spec, "float32", limits, kind="cpu")
    assert cpu and all(p["BM"] == p["TM"] and p["BN"] == p["TN"] for p in cpu)
    tiles = [(p["TM"], p["TN"], p["VW"]) for p in cpu]
    assert len(tiles) == len(set(tiles))  # no tile twice
    shipped = [dict(e["params"]) for e in database.entries() if e["kernel"] == "vectorized"]
    for params in [spec.device_defaults["cpu"], *shipped]:
        assert (params["TM"], params["TN"], params["VW"]) in tiles, params
    gpu = space.candidates(spec, "float32", limits, kind="gpu")
    assert len(gpu) > 10 * len(cpu) and spec.defaults() in gpu
    assert space.candidates(spec, "float32", limits) == gpu
    shared = registry.get("shared", "opencl")
    assert (space.candidates(shared, "float32", limits, kind="cpu")
            == space.candidates(shared, "float32", limits))


def test_register_rule() -> None:
    from tilegemm.backends.cuda import CUDA_LIMITS as lim

    assert space.register_verdict(128, 0, 256, lim) is None
    assert "spills" in space.register_verdict(128, 8, 256, lim)
    assert "65536" in space.register_verdict(168, 0, 512, lim)


def test_exhaustive_picks_fastest_verified_candidate() -> None:
    be = FakeBackend()
    cands = space.candidates(FAKE, "float32", space.Limits(threads_per_block=10**6))
    result = strategies.tune(be, FAKE, _prob(), cands, repeats=5)
    wrong = [t for t in result.trials if t.status == "wrong"]
    assert [t.params for t in wrong] == [{"X": 8, "Y": 2}]  # caught before timing
    assert wrong[0].seconds is None
    rejected = {tuple(t.params.values()) for t in result.trials if t.status == "rejected"}
    assert rejected == {(16, 1), (16, 2)}  # backend.check_limits: > 512 threads
    ok = [t for t in result.trials if t.status == "ok"]
    expect = min(ok, key=lambda t: 1.0 / (t.params["X"] * t.params["Y"]) + 0.01 * t.params["Y"])
    assert result.best is expect and result.best.params == {"X": 8, "Y": 3}
    assert result.best.seconds < 1.0  # the median, not the 100 s outlier


def test_budget_counts_candidates_that_reach_the_backend() -> None:
    be = FakeBackend()
    cands = space.candidates(FAKE, "float32", space.Limits(threads_per_block=10**6))
    result = strategies.tune(be, FAKE, _prob(), cands, strategy="random", budget=4, seed=3)
    assert len(be.prepared) == 4
    assert sum(t.status != "rejected" for t in result.trials) == 4


def test_random_is_reproducible_per_seed() -> None:
    cands = space.candidates(FAKE, "float32", space.Limits(threads_per_block=10**6))
    a = strategies.order(cands, "random", seed=7)
    assert a == strategies.order(cands, "random", seed=7)
    assert sorted(map(str, a)) == sorted(map(str, cands))
    assert any(strategies.order(cands, "random", seed=s) != a for s in range(8, 12))
    with pytest.raises(ValueError, match="strategy"):
        strategies.order(cands, "annealing")


def test_failing_candidates_are_recorded_not_fatal() -> None:
    class Broken(FakeBackend):
        def prepare(self, spec, params, prob, a3, b3, target=None) -> Prepared:  # noqa: ANN001
            if params["X"] == 1:
                raise RuntimeError("launch failed")
            return super().prepare(spec, params, prob, a3, b3)

    result = strategies.tune(Broken(), FAKE, _prob(), [{"X": 1, "Y": 1}, {"X": 2, "Y": 1}])
    assert [t.status for t in result.trials] == ["error", "ok"]
    assert "launch failed" in result.trials[0].detail
    assert result.best.params == {"X": 2, "Y": 1}


def test_a_per_call_limit_skips_candidates_predicted_too_slow() -> None:
    """tune had no time guard: every candidate ran at full size, however slow. With a limit,
    each is timed on a small problem first (here 256³: 1/8 of the arithmetic, so a
    candidate's predicted time per call is 8x its small one) and run in full only if the
    prediction fits."""
    be = FakeBackend()
    cands = [{"X": x, "Y": y} for x in (1, 2, 4, 8) for y in (1, 2)]
    prob = strategies.problem_for(512, 512, 512, "float32")
    result = strategies.tune(be, FAKE, prob, cands, max_call_s=2.5)
    status = {(t.params["X"], t.params["Y"]): t.status for t in result.trials}
    # base time 1/(X*Y) + 0.01*Y: over 2.5/8 s for (1,1), (2,1), (1,2)
    assert {p for p, s in status.items() if s == "slow"} == {(1, 1), (2, 1), (1, 2)}
    assert status[(8, 2)] == "wrong"  # caught on the small problem, never run in full
    slow = [t for t in result.trials if t.status == "slow"]
    assert all(t.seconds is None and t.predicted > 2.5 for t in slow)
    runs = {(p["X"], p["Y"]): be.prepared.count(p) for p in cands}
    assert all(runs[p] == (2 if s == "ok" else 1) for p, s in status.items())
    assert result.best.params == {"X": 8, "Y": 1}
    # A problem no larger than the small one is run as it is, whatever the limit.
    small = strategies.tune(FakeBackend(), FAKE, _prob(), cands[:2], max_call_s=1e-9)
    assert [t.status for t in small.trials] == ["ok", "ok"]


def test_a_prediction_over_the_limit_is_checked_on_a_larger_problem() -> None:
    """A fixed cost per call (threads waking, buffers) dominates a 256³ product: scaled by
    the arithmetic alone it predicted 1.5 s per call for the CPU rung at 1024³, which takes
    0.05 s. A prediction over the limit is checked at 512³ before the candidate is
    skipped, while that costs little next to the limit, from the growth between the two
    sizes."""

    class Overhead(FakeBackend):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def prepare(self, spec, params, prob, a3, b3, target=None) -> Prepared:  # noqa: ANN001
            self.sizes.append(prob.m)
            p = super().prepare(spec, params, prob, a3, b3)
            per_call = 0.02 + prob.flops * 1e-11  # 20 ms per call, plus the arithmetic
            return Prepared(p.launch, p.fetch, lambda n: [per_call] * n)

    be = Overhead()
    prob = strategies.problem_for(1024, 1024, 1024, "float32")
    result = strategies.tune(be, FAKE, prob, [{"X": 4, "Y": 1}], max_call_s=1.0)
    (trial,) = result.trials
    assert be.sizes == [256, 512, 1024]  # 256³ predicts 1.3 s, then 256³ and 512³ ...
    assert trial.status == "ok"
    assert trial.predicted == pytest.approx(0.02 + prob.flops * 1e-11)  # ... what it takes
    # Where the larger check would cost more than the limit, the first prediction stands.
    be = Overhead()
    (trial,) = strategies.tune(be, FAKE, prob, [{"X": 4, "Y": 1}], max_call_s=0.5).trials
    assert be.sizes == [256] and trial.status == "slow"


def _fake_tune(gflops: dict[str, float], params: dict[str, dict[str, int]] | None = None):  # noqa: ANN202
    """A stand-in for strategies.tune: each rung's one candidate at a given speed."""

    def tune(backend, spec, prob, cands, **kw):  # noqa: ANN001, ANN003, ANN202
        chosen = (params or {}).get(spec.name, dict(cands[0]))
        seconds = prob.flops / gflops[spec.name] / 1e9
        return strategies.TuneResult(spec, prob, [strategies.Trial(chosen, "ok", seconds)])

    return tune


@pytest.mark.parametrize("named, untuned", [
    (60.0, 100.0),  # slower than what auto runs untuned: auto must not switch to it
    (150.0, 100.0),
])
def test_tuning_one_rung_stores_only_that_rung_and_auto_takes_it_only_if_faster(
        monkeypatch, capsys, named, untuned) -> None:  # noqa: ANN001
    """'tune --kernel X' stored the untuned auto choice as an entry too, which 'tune --show'
    then listed as measured, for a rung the user had not asked to tune. Then it stored
    nothing for X when X was slower than auto's untuned choice, so matmul(kernel="X"),
    which reads X's entry, never got tuned parameters: X's entry is now stored either way,
    marked for calls naming X only when it is the slower, and kernel="auto" skips it."""
    import tilegemm
    from tilegemm.cli import main

    baseline = select.untuned_choice(registry_backend("cpu"), "float32")[0].name
    assert baseline != "triple_loop"
    monkeypatch.setattr(strategies, "tune", _fake_tune({"triple_loop": named,
                                                        baseline: untuned}))
    assert main(["tune", "--backend", "cpu", "--kernel", "triple_loop", "--m", "64",
                 "--n", "64", "--k", "64"]) == 0
    (entry,) = cache.load()
    slower = named < untuned
    assert entry.kernel == "triple_loop" and entry.named_only == slower
    out = capsys.readouterr().out
    assert ("triple_loop is for kernel='triple_loop' only" in out) == slower
    assert "(1 entry written)" in out
    a = np.ones((64, 64), np.float32)
    named_plan = tilegemm.plan(a, a, backend="cpu", kernel="triple_loop")
    assert named_plan.kernel == "triple_loop" and named_plan.source == "tuned"
    auto = tilegemm.plan(a, a, backend="cpu")
    assert (auto.kernel, auto.source == "tuned") == (
        (baseline, False) if slower else ("triple_loop", True))
    assert main(["tune", "--show"]) == 0
    shown = capsys.readouterr().out
    assert ("; for kernel='triple_loop' only" in shown) == slower


def test_an_older_cache_file_loads_entries_for_kernel_auto_too() -> None:
    """Files written before entries could be kept for calls naming their rung only have no
    such field: their entries serve kernel="auto" as before."""
    path = cache.cache_path()
    path.parent.mkdir(parents=True)
    old = {k: v for k, v in vars(_entry(version=cache.current_version())).items()
           if k != "named_only"}
    path.write_text(json.dumps({"format": cache.FORMAT, "entries": [old]}))
    (entry,) = cache.load()
    assert entry.named_only is False
    dev = DeviceId("cuda", "NVIDIA H100", "sm_90")
    assert cache.lookup([entry], dev, "float32", 4096, 4096, 4096) is not None
    entry.named_only = True
    assert cache.lookup([entry], dev, "float32", 4096, 4096, 4096) is None
    assert cache.lookup([entry], dev, "float32", 4096, 4096, 4096, kernel="pipelined") is entry


def test_a_rungs_entry_is_never_slower_than_its_untuned_choice(monkeypatch) -> None:  # noqa: ANN001
    """The untuned choice and the rung's search share one cache key; the search's best
    (a random sample) replaced the faster untuned entry."""
    from tilegemm.cli import main

    spec, params = select.untuned_choice(registry_backend("cpu"), "float32")
    other = {k: v for k, v in params.items()}
    calls = []

    def tune(backend, spec_, prob, cands, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(spec_.name)
        first = len(calls) == 1  # the untuned choice is timed first
        seconds = prob.flops / (100.0 if first else 80.0) / 1e9
        chosen = dict(cands[0]) if first else {**other, "KC": 1}
        return strategies.TuneResult(spec_, prob, [strategies.Trial(chosen, "ok", seconds)])

    monkeypatch.setattr(strategies, "tune", tune)
    assert main(["tune", "--backend", "cpu", "--kernel", spec.name, "--m", "64", "--n", "64",
                 "--k", "64"]) == 0
    (entry,) = cache.load()
    assert entry.kernel == spec.name and entry.params == dict(params)
    assert round(entry.gflops) == 100


@pytest.mark.parametrize(("status", "code"), [("rejected", 2), ("wrong", 1)])
def test_a_tune_in_which_no_candidate_ran_says_why_and_fails(monkeypatch, capsys, status,
                                                             code) -> None:  # noqa: ANN001
    """Every candidate rejected (a result larger than the device allows, say): the table
    showed '1 rejected' and the command exited 0 with no reason. Now the reason is a note,
    and the exit status is 2 (refused), or 1 where a kernel computed a wrong result."""
    from tilegemm.cli import main

    why = "the result is larger than the largest buffer the device can allocate"

    def tune(backend, spec_, prob, cands, **kw):  # noqa: ANN001, ANN003, ANN202
        return strategies.TuneResult(spec_, prob, [strategies.Trial(dict(c), status,
                                                                    detail=why)
                                                   for c in cands[:2]])

    monkeypatch.setattr(strategies, "tune", tune)
    assert main(["tune", "--backend", "cpu", "--kernel", "triple_loop", "--m", "16"]) == code
    captured = capsys.readouterr()
    assert f"no candidate ran: {why}" in " ".join(captured.out.split())  # (folded lines)
    if code == 2:
        assert f"no candidate could run at this size: {why}" in captured.err
    assert cache.load() == []


def test_a_second_tune_times_the_cached_entry_again_and_keeps_the_faster(
        monkeypatch, capsys) -> None:  # noqa: ANN001
    """A second, shorter tune replaced a faster cached entry with whatever it found, never
    timing the two against each other; and the summary's row for the rung was not what was
    stored when another row (the untuned choice) won. The cached entry is now a candidate
    of its own, timed in the same run, and a note names the row whose parameters were kept."""
    from tilegemm.cli import main

    spec, params = select.untuned_choice(registry_backend("cpu"), "float32")
    rates = {"untuned": 50.0}

    def tune(backend, spec_, prob, cands, **kw):  # noqa: ANN001, ANN003, ANN202
        chosen = dict(cands[0])
        if chosen == dict(params):
            rate = rates["untuned"]
        elif len(cands) == 1:  # the entry cached before
            rate = rates["held"]
        else:
            chosen = {**chosen, "KC": rates["search_kc"]}
            rate = rates["search"]
        return strategies.TuneResult(spec_, prob,
                                     [strategies.Trial(chosen, "ok", prob.flops / rate / 1e9)])

    monkeypatch.setattr(strategies, "tune", tune)
    argv = ["tune", "--backend", "cpu", "--kernel", spec.name, "--m", "64", "--n", "64",
            "--k", "64"]
    rates.update(search=120.0, search_kc=256)
    assert main(argv) == 0
    (first,) = cache.load()
    assert first.params["KC"] == 256 and round(first.gflops) == 120
    assert list(first.params) == [p.name for p in spec.params]  # stored in the rung's order
    capsys.readouterr()
    rates.update(held=110.0, search=105.0, search_kc=128)  # a shorter search finds less
    assert main(argv) == 0
    (second,) = cache.load()
    assert second.params == first.params and round(second.gflops) == 110
    out = capsys.readouterr().out
    assert "(cached before)" in out and "kept the parameters of row" in out


def test_an_unwritable_tuning_cache_is_refused_before_any_timing(tmp_path, monkeypatch,
                                                                 capsys) -> None:  # noqa: ANN001
    """The whole search ran, then '[Errno 17] File exists' and nothing of the results."""
    from tilegemm.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(blocker))

    def tune(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("nothing may be timed")

    monkeypatch.setattr(strategies, "tune", tune)
    assert main(["tune", "--backend", "cpu", "--kernel", "blocked", "--m", "64", "--n", "64",
                 "--k", "64"]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and "TILEGEMM_CACHE_DIR" in err and "--dry-run" in err


def registry_backend(name: str) -> Backend:
    from tilegemm.backends import get_backend

    return get_backend(name)


# --- cache ------------------------------------------------------------------------------

def _entry(**kw) -> Entry:  # noqa: ANN003
    base = dict(backend="cuda", device="NVIDIA H100", arch="sm_90", dtype="float32",
                bucket=cache.shape_bucket(4096, 4096, 4096), kernel="pipelined",
                params={"BM": 128}, seconds=0.01, gflops=13000.0)
    base.update(kw)
    return Entry(**base)


def test_a_device_without_an_architecture_takes_only_its_own_entries() -> None:
    """An OpenCL GPU's arch is "": its entries serve that device, never another device
    whose arch is also "" (the architecture tier would otherwise match every such GPU)."""
    mine = _entry(backend="opencl", device="GPU A", arch="", kernel="vectorized")
    assert cache.ranked([mine], DeviceId("opencl", "GPU A", ""), "float32", 4096, 4096,
                        4096) == [mine]
    assert cache.ranked([mine], DeviceId("opencl", "GPU B", ""), "float32", 4096, 4096,
                        4096) == []


def test_bucket() -> None:
    assert [cache.bucket(x) for x in (0, 1, 2, 3, 1000, 1024, 1025, 4097)] == [
        0, 1, 2, 4, 1024, 1024, 2048, 8192]


def test_round_trip_replaces_same_key(tmp_path) -> None:  # noqa: ANN001
    cache.record(_entry())
    cache.record(_entry(kernel="warptile", gflops=12000.0))
    cache.record(_entry(gflops=14000.0, params={"BM": 64}))  # same key: replaces
    entries = cache.load()
    assert len(entries) == 2
    best = cache.lookup(entries, DeviceId("cuda", "NVIDIA H100", "sm_90"), "float32",
                        4000, 4096, 3000)
    assert best.kernel == "pipelined" and best.params == {"BM": 64} and best.gflops == 14000
    assert cache.clear() and not cache.cache_path().exists() and not cache.clear()


def test_clear_removes_a_directory_in_place_of_the_file() -> None:
    """A directory where the tuning cache file goes: every call warned that it could not
    be read, and ``tune --clear`` failed with "Is a directory"."""
    (cache.cache_path() / "inside").mkdir(parents=True)
    assert cache.clear() and not cache.cache_path().exists()
    cache.record(_entry())
    assert len(cache.load()) == 1


def test_clear_with_a_file_in_place_of_the_cache_directory(tmp_path, monkeypatch) -> None:
    """TILEGEMM_CACHE_DIR naming a file: ``tune --clear`` failed with "[Errno 20] Not a
    directory"; there is no tuning cache there to clear."""
    (tmp_path / "a-file").write_text("not a directory")
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path / "a-file"))
    assert cache.clear() is False
    assert (tmp_path / "a-file").read_text() == "not a directory"


def test_lookup_falls_back_device_then_arch_then_nothing() -> None:
    entries = [_entry(device="NVIDIA H100 PCIe", gflops=1.0),
               _entry(device="NVIDIA H100 SXM", gflops=2.0, kernel="warptile")]
    exact = cache.lookup(entries, DeviceId("cuda", "NVIDIA H100 PCIe", "sm_90"), "float32",
                         4096, 4096, 4096)
    assert exact.device == "NVIDIA H100 PCIe"  # exact device beats a faster sibling
    sibling = cache.lookup(entries, DeviceId("cuda", "NVIDIA H800", "sm_90"), "float32",
                           4096, 4096, 4096)
    assert sibling.kernel == "warptile"  # same arch: the best of them
    assert cache.lookup(entries, DeviceId("cuda", "NVIDIA A100", "sm_80"), "float32",
                        4096, 4096, 4096) is None
    assert cache.lookup(entries, DeviceId("cuda", "NVIDIA H800", "sm_90"), "float64",
                        4096, 4096, 4096) is None
    assert cache.lookup(entries, DeviceId("cuda", "NVIDIA H800", "sm_90"), "float32",
                        512, 512, 8192) is None


@pytest.mark.parametrize("text", ["{not json", "[]", '{"format": 1}',
                                  '{"format": 1, "entries": [{"backend": "cuda"}]}',
                                  '{"format": 99, "entries": []}',
                                  # not UTF-8 (was a UnicodeDecodeError out of every call)
                                  b"\xff\xfe", b'{"format": 1, "entries": []}\xff'])
def test_corrupt_cache_warns_and_is_ignored(text: str | bytes) -> None:
    cache.cache_path().parent.mkdir(parents=True)
    if isinstance(text, bytes):
        cache.cache_path().write_bytes(text)
    else:
        cache.cache_path().write_text(text)
    with pytest.warns(TuneCacheWarning, match="corrupt"):
        assert cache.load() == []
    cache.record(_entry())  # and it is replaced, not crashed on
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(cache.load()) == 1


def test_a_corrupt_cache_warning_names_the_callers_line() -> None:
    """The warning of a damaged tuning cache, met inside ``matmul`` (or ``plan``, which
    decides the same way), named a line of tilegemm's (api.py) instead of the call that
    met it, as NumPy's warnings name."""
    import tilegemm

    cache.cache_path().parent.mkdir(parents=True)
    cache.cache_path().write_text("{not json")
    a = np.ones((5, 3), np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tilegemm.plan(a, a.T, backend="cpu")
    corrupt = [w for w in seen if issubclass(w.category, TuneCacheWarning)]
    assert corrupt and all(w.filename == __file__ for w in corrupt), [
        (w.filename, w.lineno) for w in corrupt]


def test_stale_version_warns_and_is_ignored() -> None:
    cache.save([_entry(version="0.0.1"),
                _entry(kernel="warptile", version=cache.current_version())])
    with pytest.warns(TuneCacheWarning, match="another tilegemm version"):
        entries = cache.load()
    assert [e.kernel for e in entries] == ["warptile"]
    raw = json.loads(cache.cache_path().read_text())
    assert len(raw["entries"]) == 2  # loading never rewrites the file


# --- kernel="auto" ----------------------------------------------------------------------

def test_auto_uses_cached_choice_for_this_cpu() -> None:
    """A cache entry for this CPU and shape bucket is what choose_kernel('auto') returns."""
    from tilegemm.api import choose_kernel
    from tilegemm.backends import get_backend

    be = get_backend("cpu")
    dev = select.device_id(be)
    spec = registry.default_for("cpu", "float32")
    if not spec.params:
        pytest.skip("no CPU rung with parameters on this branch")
    p = spec.params[0]
    other = next(c for c in p.choices if c != p.default)
    cache.record(Entry(backend="cpu", device=dev.name, arch=dev.arch, dtype="float32",
                       bucket=cache.shape_bucket(100, 100, 100), kernel=spec.name,
                       params={p.name: other}, seconds=1.0, gflops=1.0))
    prob = strategies.problem_for(100, 90, 70, "float32")
    chosen, params = choose_kernel("auto", be, prob, {})
    assert chosen is spec and params[p.name] == other


def test_auto_ignores_unusable_entry_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm.api import choose_kernel
    from tilegemm.backends import get_backend

    be = get_backend("cpu")
    dev = select.device_id(be)
    cache.record(Entry(backend="cpu", device=dev.name, arch=dev.arch, dtype="float32",
                       bucket=cache.shape_bucket(8, 8, 8), kernel="no_such_rung",
                       params={}, seconds=1.0, gflops=1.0))
    prob = strategies.problem_for(8, 8, 8, "float32")
    with pytest.warns(TuneCacheWarning, match="does not fit"):
        spec, _ = choose_kernel("auto", be, prob, {})
    assert spec is registry.default_for("cpu", "float32")


def test_tuned_choice_is_memoised(monkeypatch: pytest.MonkeyPatch) -> None:
    from tilegemm.backends import get_backend

    calls = []
    real = select._choose
    monkeypatch.setattr(select, "_choose", lambda *a: calls.append(1) or real(*a))
    be = get_backend("cpu")
    for m in (100, 120, 128):  # one bucket
        select.tuned_choice(be, strategies.problem_for(m, 64, 64, "float32"))
    assert len(calls) == 1


def test_builtin_default_for_cuda_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a (pretend) H100 with no cache entry, float32 auto is the top fast rung."""
    if not any(s.name == "pipelined" for s in registry.specs_for("cuda")):
        pytest.skip("pipelined not registered")

    be = FakeGpu()
    target = be.target()
    assert select.device_id(target) == DeviceId("cuda", "NVIDIA H100 80GB HBM3", "sm_90")
    prob = strategies.problem_for(4096, 4096, 4096, "float32")
    assert select.tuned_choice(be, prob, target) is None  # nothing tuned yet
    spec, params = select.auto_choice(be, target, prob)
    assert spec.name == "pipelined" and params == spec.defaults()
    assert spec is registry.default_for("cuda", "float64")  # the rung flagged auto=True
    # pipelined has no int32: auto takes the highest rung that has
    ints, _ = select.auto_choice(be, target, strategies.problem_for(64, 64, 64, "int32"))
    assert ints.supports("int32") and ints.rung == max(
        s.rung for s in registry.specs_for("cuda") if s.supports("int32"))


def test_auto_uses_cached_choice_for_a_gpu() -> None:
    """kernel="auto" through api.choose_kernel returns the cached rung and parameters."""
    from tilegemm.api import choose_kernel

    if not any(s.name == "warptile" for s in registry.specs_for("cuda")):
        pytest.skip("warptile not registered")
    be = FakeGpu()
    tuned = {"BM": 64, "BN": 128, "WM": 32, "WN": 64}
    cache.record(Entry(backend="cuda", device="NVIDIA H100 80GB HBM3", arch="sm_90",
                       dtype="float32", bucket=cache.shape_bucket(2048, 2048, 2048),
                       kernel="warptile", params=tuned, seconds=1e-3, gflops=17000.0))
    spec, params = choose_kernel("auto", be, strategies.problem_for(2000, 1500, 2048,
                                                                    "float32"), {})
    assert spec.name == "warptile" and params == spec.resolve(tuned)
    # another shape bucket: the built-in default
    spec, params = choose_kernel("auto", be, strategies.problem_for(100, 100, 100,
                                                                    "float32"), {})
    assert spec.name == "pipelined"


@pytest.mark.opencl
def test_tuning_one_rung_never_makes_auto_slower(tmp_path, monkeypatch):
    """Tuning a slower rung must not make kernel="auto" slower: the untuned choice is timed
    too, and the tuned rung serves kernel="auto" only if it is faster (else it is kept for
    calls naming it)."""
    from tilegemm.api import choose_backend, choose_kernel
    from tilegemm.cli import main
    from tilegemm.problem import describe, make_problem
    from tilegemm.tune import cache
    from tilegemm.tune.select import untuned_choice

    monkeypatch.setenv("TILEGEMM_CACHE_DIR", str(tmp_path))
    assert main(["tune", "--backend", "opencl", "--kernel", "coalesced", "--m", "64", "--n",
                 "64", "--k", "64", "--budget", "1", "--repeat", "2"]) == 0
    a = np.ones((64, 64), np.float32)
    ops = [describe(a, "a"), describe(a, "b")]
    backend = choose_backend("opencl", ops)
    baseline = untuned_choice(backend, "float32")
    entries = cache.load()
    assert {e.kernel for e in entries} <= {"coalesced"}  # never the untuned choice itself
    spec, params = choose_kernel("auto", backend, make_problem(*ops), {})
    if entries and not entries[0].named_only:
        assert (spec.name, params) == (entries[0].kernel, entries[0].params)
    else:
        assert (spec.name, params) == (baseline[0].name, baseline[1])


@pytest.mark.opencl
def test_opencl_tuner_prunes_by_the_devices_own_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidates 'tilegemm tune' hands to the search are those the device itself admits
    (PoCL: 4096 work-items, hundreds of KiB of local memory), not a guessed 256 / 32 KiB."""
    from tilegemm.backends import get_backend
    from tilegemm.cli import main

    target = get_backend("opencl").target()
    device = target.handle
    assert target.limits.threads_per_block == device.max_work_group_size
    assert target.limits.shared_per_block == device.local_mem_size
    assert target.limits.max_allocation == device.max_mem_alloc_size
    spec = registry.get("register2d", "opencl")
    handed: list[list[dict[str, int]]] = []

    def record(backend, spec, prob, cands, **kw):  # noqa: ANN001, ANN003, ANN202
        handed.append(list(cands))
        return strategies.TuneResult(spec, prob, [])

    monkeypatch.setattr(strategies, "tune", record)
    assert main(["tune", "--backend", "opencl", "--kernel", "register2d", "--m", "8", "--n",
                 "8", "--k", "8", "--dry-run"]) == 0
    expected = space.candidates(spec, "float32", target.limits)
    assert handed[-1] == expected
    if device.max_work_group_size > 256:  # PoCL on a CPU: 4096
        assert any(spec.threads(p) > 256 for p in expected)
    if device.local_mem_size > 32 * 1024:
        assert any(spec.smem(p, 4) > 32 * 1024 for p in expected)


# --- tensor-core rungs: searched per precision, cached per precision ----------------------

def test_tensor_core_space_pins_the_precision_parameter() -> None:
    from tilegemm.backends.cuda import CUDA_LIMITS

    mma = registry.get("mma", "cuda")
    tf32 = space.candidates(mma, "float32", CUDA_LIMITS, "tf32")
    x3 = space.candidates(mma, "float32", CUDA_LIMITS, "3xtf32")
    assert tf32 and x3 and {p["PASSES"] for p in tf32} == {1} and {p["PASSES"] for p in x3} == {3}
    # dynamic shared memory: up to the opt-in maximum, beyond the 48 KB of static memory
    assert all(mma.smem(p, 4) <= CUDA_LIMITS.shared_optin_per_block for p in tf32)
    assert any(mma.smem(p, 4) > CUDA_LIMITS.shared_per_block for p in tf32)
    assert space.candidates(mma, "float32", CUDA_LIMITS) == []  # never tuned for IEEE
    for half in ("float16", "bfloat16"):  # one mode: PASSES ignored, BK whole k16 steps
        cands = space.candidates(mma, half, CUDA_LIMITS)
        assert cands and {p["PASSES"] for p in cands} == {1}
        assert all(p["BK"] % 16 == 0 for p in cands)
        assert space.candidates(mma, half, CUDA_LIMITS, "tf32") == []
    # an IEEE rung is never tuned for a reduced precision
    assert space.candidates(registry.get("pipelined", "cuda"), "float32", CUDA_LIMITS,
                            "tf32") == []


def test_tuning_specs_choose_rungs_by_precision_and_refuse_mismatches() -> None:
    from tilegemm.commands.tune import tuning_specs
    from tilegemm.errors import InvalidValueError

    f32 = np.dtype(np.float32)
    assert [s.name for s in tuning_specs("cuda", f32, "tf32")] == ["mma", "wgmma"]
    assert [s.name for s in tuning_specs("cuda", f32, "3xtf32")] == ["mma", "wgmma"]
    assert [s.name for s in tuning_specs("cuda", np.dtype("bfloat16"), "ieee")] == [
        "mma", "wgmma"]
    assert "mma" not in [s.name for s in tuning_specs("cuda", f32, "ieee")]
    with pytest.raises(InvalidValueError, match="pass --precision one of tf32, 3xtf32"):
        tuning_specs("cuda", f32, "ieee", ["mma"])
    with pytest.raises(InvalidValueError, match="cannot compute float32 at precision tf32"):
        tuning_specs("cuda", f32, "tf32", ["pipelined"])


def test_tensor_core_baseline_is_the_rung_at_its_defaults_with_the_precision() -> None:
    from tilegemm.commands.tune import baseline_choice

    be = FakeGpu()
    mma = registry.get("mma", "cuda")
    spec, params = baseline_choice(be, be.target(), np.dtype(np.float32), "3xtf32", [mma],
                                   select.untuned_choice)
    assert spec is mma and params == {**mma.defaults(), "PASSES": 3}


def test_cache_entries_serve_only_their_precision() -> None:
    be = FakeGpu()
    target = be.target()
    tuned = {"BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 32, "STAGES": 3, "GROUP_M": 8,
             "PASSES": 3}
    cache.record(_entry(device=target.name, kernel="mma", params=tuned, precision="3xtf32",
                        bucket=cache.shape_bucket(2048, 2048, 2048)))
    cache.record(_entry(device=target.name, kernel="mma", precision="tf32", gflops=1.0,
                        params={**tuned, "PASSES": 1, "BM": 128},
                        bucket=cache.shape_bucket(2048, 2048, 2048)))
    assert len(cache.load()) == 2  # same rung and shape, two precisions: two entries
    prob = strategies.problem_for(2048, 2048, 2048, "float32")
    got = select.tuned_precision_params(be, target, prob, "mma", "3xtf32")
    assert got == registry.get("mma", "cuda").resolve(tuned)
    assert select.tuned_precision_params(be, target, prob, "mma", "tf32")["BM"] == 128
    assert select.tuned_precision_params(
        be, target, strategies.problem_for(64, 64, 64, "float32"), "mma", "tf32") is None
    # kernel="auto" at IEEE never sees them
    assert select.tuned_choice(be, prob, target) is None


def test_reduced_precision_results_are_checked_at_their_own_precision() -> None:
    from tilegemm.precision import precision_of, tolerance_eps
    from tilegemm.reference import assert_close, random_operands

    mma = registry.get("mma", "cuda")
    assert precision_of(mma, {"PASSES": 3}, "float32") == "3xtf32"
    assert precision_of(mma, {"PASSES": 1}, "float16") == "ieee"
    assert tolerance_eps(mma, {"PASSES": 1}, "float32") == 2.0**-10
    assert tolerance_eps(registry.get("pipelined", "cuda"), {}, "float32") is None
    a, b = random_operands((1, 8, 64), (1, 64, 8), np.float32, seed=1)
    from tilegemm.kernels.cuda._tensorcore import tf32_round

    tf32 = np.matmul(tf32_round(a), tf32_round(b))  # what a TF32 pass computes
    with pytest.raises(AssertionError):
        assert_close(tf32, a, b)  # too coarse for float32's own bound...
    assert_close(tf32, a, b, eps=2.0**-10)  # ...within TF32's
    ha, hb = random_operands((3, 5), (5, 2), "bfloat16", seed=2)
    assert ha.dtype.name == "bfloat16" and np.all(np.abs(ha.astype(np.float32)) >= 0.5)
    assert_close(np.matmul(ha.astype(np.float32), hb.astype(np.float32)).astype(ha.dtype),
                 ha, hb)


def test_tune_cli_refuses_what_no_rung_here_computes(capsys) -> None:  # noqa: ANN001
    from tilegemm.cli import main

    assert main(["tune", "--backend", "cpu", "--dtype", "float64", "--precision", "tf32"]) != 0
    assert "applies to --dtype float32, not float64" in capsys.readouterr().err
    assert main(["tune", "--backend", "cpu", "--dtype", "bfloat16"]) != 0
    assert "backends with one: cuda" in capsys.readouterr().err


def test_candidates_whose_accumulators_cannot_fit_are_dropped_before_compiling() -> None:
    """On the H100 the tuner spent 110 s compiling one candidate: tiles whose accumulators
    alone exceed 255 registers per thread must spill and take minutes to compile."""
    from tilegemm.backends.cuda import CUDA_LIMITS

    spec = registry.get("smem_layout", "cuda")
    bomb = {"BM": 256, "BN": 64, "BK": 32, "TM": 16, "TN": 16}  # 256 outputs per thread
    assert spec.is_valid(bomb) and spec.outputs_per_thread(bomb) == 256
    assert "256 accumulators" in space.accumulator_verdict(spec, bomb, "float32", CUDA_LIMITS)
    default = spec.resolve({})
    assert spec.outputs_per_thread(default) == 64
    assert space.accumulator_verdict(spec, default, "float32", CUDA_LIMITS) is None
    # float64 needs two registers per accumulator: 128 outputs fit in float32 only
    half = next(p for p in spec.space() if spec.outputs_per_thread(p) == 128)
    assert space.accumulator_verdict(spec, half, "float32", CUDA_LIMITS) is None
    assert "256 registers" in space.accumulator_verdict(spec, half, "float64", CUDA_LIMITS)
    found = space.candidates(spec, "float32", CUDA_LIMITS)
    assert bomb not in found and default in found
    assert all(spec.outputs_per_thread(p) < 255 for p in found)
    # where the device reports no register limit (CPU, PoCL) nothing is dropped
    assert space.accumulator_verdict(spec, bomb, "float32", space.Limits(1024)) is None


def test_outputs_per_thread_follows_each_rungs_tile() -> None:
    cuda = {n: registry.get(n, "cuda") for n in ("naive", "register1d", "pipelined")}
    assert cuda["naive"].outputs_per_thread({"BLOCK": 16}) == 1
    assert cuda["register1d"].outputs_per_thread({"TILE": 32, "R": 4}) == 4
    assert cuda["pipelined"].outputs_per_thread(cuda["pipelined"].resolve({})) == 64


@pytest.mark.parametrize("bad", [{"gflops": "fast"}, {"shape": 5}, {"params": {"BM": "128"}},
                                 {"bucket": [1, 2, "3"]}, {"named_only": "no"}])
def test_a_wrongly_typed_entry_makes_the_file_ignored_with_a_warning(bad) -> None:  # noqa: ANN001
    """'"gflops": "fast"' made every kernel="auto" lookup raise TypeError; 'tune --show'
    exited as an internal error."""
    from dataclasses import asdict

    path = cache.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    good = asdict(_entry(version=cache.current_version()))
    path.write_text(json.dumps({"format": cache.FORMAT, "entries": [good, {**good, **bad}]}))
    with pytest.warns(cache.TuneCacheWarning, match="is corrupt"):
        assert cache.load() == []


def test_an_entry_that_no_longer_fits_gives_way_to_the_next(monkeypatch) -> None:  # noqa: ANN001
    """The fastest entry was the only one looked at: when its parameters no longer fitted,
    a valid tuned entry of the same bucket was never used."""
    from tilegemm.tune import select

    dev = cache.DeviceId("cuda", "NVIDIA H100", "sm_90")
    stale = _entry(kernel="shared", params={"TILE": 7}, gflops=100.0)
    fine = _entry(kernel="warptile", params={}, gflops=10.0)
    other_arch = _entry(device="other", kernel="naive", params={}, gflops=1000.0)
    ranked = cache.ranked([fine, other_arch, stale], dev, "float32", 4096, 4096, 4096)
    assert ranked == [stale, fine, other_arch]  # this device by speed, then the arch's
    seen: list[str] = []

    def usable(backend, target, kernel, params, dtype):  # noqa: ANN001, ANN202
        seen.append(kernel)
        return None if kernel == "shared" else (kernel, params)

    monkeypatch.setattr(select, "_usable", usable)
    prob = strategies.problem_for(4096, 4096, 4096, "float32")
    with pytest.warns(cache.TuneCacheWarning, match="shared .* does not fit"):
        assert select._choose(None, None, dev, "float32", prob, ranked) == ("warptile", {})
    assert seen == ["shared", "warptile"]


def test_processes_recording_at_once_keep_every_entry(tmp_path) -> None:  # noqa: ANN001
    """record() read the file, added its entry and wrote it back without a lock: of 12
    processes recording at once, 3-5 entries survived."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=cache.record,
                         args=(_entry(bucket=[2**i, 64, 64], version=cache.current_version()),))
             for i in range(12)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 12
    assert sorted(e.bucket[0] for e in cache.load()) == [2**i for i in range(12)]
    assert not list(cache.cache_path().parent.glob(".tune-*"))  # no temporary left


def test_a_tilde_in_the_cache_directory_is_the_home_folder(tmp_path, monkeypatch):
    """TILEGEMM_CACHE_DIR='~/x' made a folder named '~' in every working directory (the
    tuning cache and the kernel cache went there), while `tilegemm cache` named ~/x."""
    from tilegemm import compile_cache

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILEGEMM_CACHE_DIR", "~/x")
    assert cache.cache_dir() == tmp_path / "home" / "x"
    assert cache.cache_path().parent == tmp_path / "home" / "x"
    monkeypatch.delenv("TILEGEMM_KERNEL_CACHE", raising=False)
    assert compile_cache.cache_root() == tmp_path / "home" / "x" / "kernels"


def test_a_tune_beyond_memory_is_refused_before_any_timing(capsys) -> None:
    """Its smaller probes, each checked against float64 NumPy, grew until the system
    killed the process (out of memory); run refused the same product in one line."""
    from tilegemm.cli import main

    assert main(["tune", "--backend", "cpu", "--kernel", "triple_loop", "--m", "3000000",
                 "--n", "3000000", "--k", "2"]) == 2
    assert "cannot allocate the result" in capsys.readouterr().err
