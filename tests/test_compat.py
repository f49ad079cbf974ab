"""The NumPy alias numba-cuda still uses is restored where a newer NumPy removed it."""

import numpy as np

from tilegemm._compat import restore_numpy_aliases


def test_row_stack_is_restored_when_numpy_removed_it(monkeypatch) -> None:
    if hasattr(np, "row_stack"):
        monkeypatch.delattr(np, "row_stack")
    assert not hasattr(np, "row_stack")
    restore_numpy_aliases()
    a, b = np.arange(3.0), np.arange(3.0, 6.0)
    np.testing.assert_array_equal(np.row_stack((a, b)), np.vstack((a, b)))


def test_an_existing_row_stack_is_left_alone(monkeypatch) -> None:
    def mine(x):  # noqa: ANN001, ANN202
        return x

    monkeypatch.setattr(np, "row_stack", mine, raising=False)
    restore_numpy_aliases()
    assert np.row_stack is mine
