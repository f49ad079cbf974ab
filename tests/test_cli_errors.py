"""Exit codes and messages of the command line for refused input, internal errors, pipes.

0 success, 1 wrong result, 2 refused input (one line), 3 internal error (one line, or the
traceback with --debug / TILEGEMM_DEBUG=1).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tilegemm
from tilegemm.cli import main
from tilegemm.errors import InvalidTypeError, InvalidValueError, UnavailableError, UsageError


def test_validation_errors_are_usage_errors_and_builtin_types():
    """Callers catching ValueError/TypeError keep working; the CLI can tell them apart."""
    with pytest.raises(InvalidValueError) as exc:
        tilegemm.matmul(np.ones((2, 3)), np.ones((4, 2)), backend="cpu")
    assert isinstance(exc.value, ValueError) and isinstance(exc.value, UsageError)
    with pytest.raises(InvalidTypeError) as exc:
        tilegemm.matmul(np.ones((2, 3), np.complex64), np.ones((3, 2)), backend="cpu")
    assert isinstance(exc.value, TypeError)
    with pytest.raises(InvalidValueError):
        tilegemm.matmul(np.ones((2, 3)), np.ones((3, 2)), backend="cpu", kernel="nope")
    assert issubclass(UnavailableError, RuntimeError)


def _raise(exc: BaseException):
    def run(args):
        raise exc
    return run


@pytest.mark.parametrize("exc", [KeyError("x"), ValueError("a library's own check"),
                                 TypeError("unsupported format string")])
def test_internal_errors_exit_3_with_one_line(monkeypatch, capsys, exc):
    """A plain ValueError/TypeError from deep inside is a bug, not the user's mistake: it
    printed as 'error: ...' with exit 2 (a crash on an empty OpenCL product looked like a
    refused input)."""
    import tilegemm.commands.info as info

    monkeypatch.setattr(info, "run", _raise(exc))
    monkeypatch.delenv("TILEGEMM_DEBUG", raising=False)
    assert main(["info"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("tilegemm: internal error:") and err.count("\n") == 1
    assert "--debug" in err and "Traceback" not in err


def test_debug_shows_the_traceback(monkeypatch, capsys):
    import tilegemm.commands.info as info

    monkeypatch.setattr(info, "run", _raise(KeyError("x")))
    assert main(["info", "--debug"]) == 3
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.setenv("TILEGEMM_DEBUG", "1")
    assert main(["info"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_usage_errors_exit_2(monkeypatch, capsys):
    import tilegemm.commands.info as info

    monkeypatch.setattr(info, "run", _raise(InvalidValueError("bad --m")))
    assert main(["info"]) == 2
    err = capsys.readouterr().err
    assert err == "tilegemm: error: bad --m\n"


@pytest.mark.opencl
@pytest.mark.parametrize("extra", [["--m", "0"], ["--n", "0"], ["--batch", "2", "--m", "0"]])
def test_run_empty_product_on_opencl(capsys, extra):
    """It printed 'verified: yes' then crashed formatting a missing GFLOP/s figure (exit 2)."""
    assert main(["run", "--backend", "opencl", "--kernel", "naive", "--k", "3",
                 "--repeat", "2", *extra]) == 0
    out = capsys.readouterr().out
    assert "verified: yes" in out and "steady:" in out


@pytest.mark.opencl
def test_opencl_buffer_over_the_device_limit_is_refused_before_launch(capsys):
    """It leaked pyopencl's LogicError (INVALID_BUFFER_SIZE), reported by the CLI as a
    wrong result (exit 1)."""
    from tilegemm.backends import get_backend
    from tilegemm.backends.opencl import all_devices, default_device_index

    device = all_devices()[default_device_index()]
    limit = device.max_mem_alloc_size
    side = int((limit / 4) ** 0.5) + 64  # a float32 side x side result just over the limit
    a = np.ones((side, 1), np.float32)
    b = np.ones((1, side), np.float32)
    with pytest.raises(InvalidValueError, match="max_mem_alloc_size"):
        tilegemm.matmul(a, b, backend="opencl", kernel="naive")
    assert get_backend("opencl").status().usable
    assert main(["run", "--backend", "opencl", "--kernel", "naive", "--m", str(side),
                 "--n", str(side), "--k", "1"]) == 2
    err = capsys.readouterr().err
    assert "max_mem_alloc_size" in err and err.count("\n") == 1


def test_run_names_the_requested_dtype_when_memory_runs_out(capsys):
    """A float32 request failed while drawing float64 random data, naming float64."""
    assert main(["run", "--backend", "cpu", "--m", "2000000", "--k", "2000000",
                 "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert "float32" in err and "float64" not in err and err.count("\n") == 1


def test_output_cut_by_the_reader_is_quiet():
    """``tilegemm ... | head`` printed 'error: [Errno 32] Broken pipe' (exit 2)."""
    script = ("import tilegemm.commands.info as info, tilegemm.cli as cli\n"
              "info.run = lambda args: [print('x' * 99) for _ in range(20000)] and 0\n"
              "raise SystemExit(cli.main(['info']))\n")
    cmd = (f"{sys.executable} -c \"{script}\" | head -n 1 >/dev/null; "
           "echo \"status=${PIPESTATUS[0]}\" >&2")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "Broken pipe" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "error" not in r.stderr and "status=141" in r.stderr, r.stderr


def test_output_cut_by_the_reader_is_141_through_rich_too():
    """Tables go through rich, which exits with status 1 on a closed pipe ('info | head',
    'explain | head'): 1 means 'verification failed' for run and bench."""
    script = ("import tilegemm.commands.info as info, tilegemm.cli as cli\n"
              "from tilegemm.console import console\n"
              "info.run = lambda args: [console().print('x' * 99) for _ in range(20000)] "
              "and 0\n"
              "raise SystemExit(cli.main(['info']))\n")
    cmd = (f"{sys.executable} -c \"{script}\" | head -n 1 >/dev/null; "
           "echo \"status=${PIPESTATUS[0]}\" >&2")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr and "status=141" in r.stderr, r.stderr


def test_a_lower_case_parameter_is_refused_in_the_command_lines_words(capsys):
    """Not the API's "unexpected keyword argument ... see tilegemm.kernels()": a shell user
    gets the spelling to use and the command that lists parameters."""
    assert main(["run", "--kernel", "blocked", "--backend", "cpu", "mr=8"]) == 2
    err = capsys.readouterr().err
    assert "rung parameters are UPPER-CASE (e.g. MR=8)" in err and "tilegemm kernels" in err
    assert "keyword argument" not in err


def test_two_output_formats_at_once_are_refused():
    with pytest.raises(SystemExit) as done:
        main(["kernels", "--json", "--markdown"])
    assert done.value.code == 2


def test_an_unknown_word_after_a_subcommand_shows_that_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as done:
        main(["info", "--nope"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tilegemm info" in err and "unrecognized arguments: --nope" in err


@pytest.mark.parametrize("flag", ["--m", "--k", "--batch"])
def test_sizes_beyond_any_array_are_refused_not_reported_as_bugs(flag, capsys):
    """NumPy raises ValueError (not MemoryError) for a shape beyond any array it can
    describe; that was reported as an internal error (exit 3)."""
    assert main(["explain", "naive", flag, "99999999999999999999"]) == 2
    assert "cannot allocate" in capsys.readouterr().err


def test_the_tracers_refusals_are_the_librarys_errors():
    """explain(dtype="float16") on an FFMA rung came back from the tracer's child process as
    a plain ValueError, not the library's UsageError that a refusal is."""
    import pytest

    from tilegemm.analysis.report import explain
    from tilegemm.errors import InvalidTypeError

    with pytest.raises(InvalidTypeError, match="not float16"):
        explain("shared", 16, 16, 16, dtype="float16", resources=False)


@pytest.mark.parametrize("batch", [0, 3])
def test_a_run_whose_check_cannot_fit_in_memory_is_refused(monkeypatch, capsys, batch):
    """run checks its result against float64 NumPy, about seven float64 arrays the size of
    the result: a 32768 x 32768 float32 run (a 4 GiB result) was killed by the system,
    out of memory, where NumPy's allocation of the arrays alone succeeded. Here the
    machine is said to have 0.5 GiB available: a 4096^2 float32 result needs about 1 GiB."""
    from tilegemm.backends import cpu

    monkeypatch.setattr(cpu, "available_memory", lambda: 2**29)
    argv = ["run", "--backend", "cpu", "--m", "4096", "--n", "4096", "--k", "8"]
    if batch:
        argv += ["--batch", str(batch)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "against float64 NumPy needs about" in err and "0.5 GiB available" in err
    assert ("3 products of 4096x4096x8" in err) == bool(batch)
    monkeypatch.setattr(cpu, "available_memory", lambda: 64 * 2**30)
    assert main(["run", "--backend", "cpu", "--m", "64", "--n", "48", "--k", "8",
                 "--repeat", "0"]) == 0


def test_a_run_too_large_to_hold_is_refused_before_its_operands_are_made(monkeypatch,
                                                                        capsys):
    """``run --m 2 --n 2 --k 3000000000``: 45 GiB of operands, each small enough for NumPy
    to promise its memory on its own. They were filled before the check of what the run
    needs, and the system killed the process, out of memory, with no message."""
    import importlib

    from tilegemm.backends import cpu

    reference = importlib.import_module("tilegemm.reference")  # the module, not its function

    def made(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("the operands were made before the memory check")

    monkeypatch.setattr(reference, "random_operands", made)
    monkeypatch.setattr(cpu, "available_memory", lambda: 2**29)
    assert main(["run", "--backend", "cpu", "--m", "2", "--n", "2", "--k",
                 str(2**26)]) == 2
    assert "0.5 GiB available" in capsys.readouterr().err


@pytest.mark.opencl
def test_warnings_are_one_line_on_the_command_line(tmp_path):
    """A warning printed as Python shows it named the tilegemm script's line and repeated
    its source ('.../bin/tilegemm:6: CompileCacheWarning: ... sys.exit(main())')."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TILEGEMM_CACHE_DIR": str(tmp_path / "file" / "x")}
    env.pop("TILEGEMM_KERNEL_CACHE", None)
    env.pop("POCL_CACHE_DIR", None)
    (tmp_path / "file").write_text("")  # a file where the cache's folder would be
    done = subprocess.run([sys.executable, "-m", "tilegemm.cli", "run", "--backend", "opencl",
                           "--kernel", "naive", "--m", "8", "--n", "8", "--k", "8",
                           "--repeat", "0"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "Warning" in line]
    assert lines and all(line.startswith("tilegemm: warning: ") and
                         line.endswith("(CompileCacheWarning)") for line in lines), lines
