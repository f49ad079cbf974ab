"""tools/fuzz_calls.py, the random search for calls that disagree with NumPy or whose
repeats disagree with the first call: a fixed seed's cases all agree, and a repeated call
that differs, or a wrong first answer, is reported."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import tilegemm

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_calls", ROOT / "tools" / "fuzz_calls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _failures(fuzz, seed: int, cases: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    found = [fuzz.one_case(rng, "cpu", 0.4) for _ in range(cases)]
    return [(desc, failure) for desc, failure in found if failure]


def test_a_fixed_seed_finds_nothing(fuzz):
    """400 matmul and gemm calls of every dtype, layout and ``dtype=``: each first call
    agrees with NumPy and each repeat with the first."""
    assert _failures(fuzz, 20261129, 400) == []


def test_a_repeat_that_differs_is_reported(fuzz, monkeypatch):
    """The search's negative control: a matmul whose every second call is off by one in
    its first element is found."""
    real, calls = tilegemm.matmul, [0]

    def off_by_one_on_repeats(*args, **kwargs):
        result = real(*args, **kwargs)
        calls[0] += 1
        if calls[0] % 3 == 2 and np.ndim(result) and np.size(result):
            result = np.array(result, copy=True)
            result.flat[0] = result.flat[0] + 1 if result.dtype.kind != "b" else ~result.flat[0]
        return result

    monkeypatch.setattr(tilegemm, "matmul", off_by_one_on_repeats)
    found = _failures(fuzz, 20261129, 100)
    assert found and all("repeated call" in failure for _, failure in found)


def test_a_wrong_first_answer_is_reported(fuzz, monkeypatch):
    """A first call that disagrees with NumPy (every result doubled) is found too."""
    real = tilegemm.matmul

    def doubled(*args, **kwargs):
        result = real(*args, **kwargs)
        if np.ndim(result) and np.asarray(result).dtype.kind in "fiu":
            return np.asarray(result) * 2
        return result

    monkeypatch.setattr(tilegemm, "matmul", doubled)
    found = _failures(fuzz, 20261129, 100)
    assert any("disagrees with NumPy" in failure for _, failure in found)
