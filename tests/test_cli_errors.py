"""Which errors the command line turns into one line, and which keep their traceback.

A mistake in the input (``UserError`` and its subclasses, a missing path) is one
``vllm-admission: error: ...`` line and exit status 2. Anything else, a plain
``ValueError`` from an internal invariant above all, is a bug: ``main`` lets it
through, so the process ends with the traceback and exit status 1 (issue 34).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_admission.sim.simulator as simulator
from vllm_admission.cli import USER_ERRORS, main
from vllm_admission.core.admission import UnknownPolicyError
from vllm_admission.core.costs import ModelConfigError
from vllm_admission.core.errors import UserError
from vllm_admission.core.geometry import CapacityError
from vllm_admission.core.traces import TraceError
from vllm_admission.fidelity.spec import FidelityError
from vllm_admission.plugin.env import SettingsError
from vllm_admission.sim.report import OutputDirError, check_writable
from vllm_admission.sim.sweep import RayUnavailableError

CLI_DIR = Path(__file__).resolve().parents[1] / "vllm_admission" / "cli"

#: The OS errors of a path the user named: printed as one line, though not UserErrors.
PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)

SIMULATE = ["simulate", "--trace", "synthetic", "--max-requests", "20", "--capacity", "2GiB",
            "--admission", "last", "--eviction", "lru", "--no-progress"]


def _broken(*args, **kwargs):
    raise ValueError("broken invariant")


# -- the classes ---------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [UnknownPolicyError, ModelConfigError, CapacityError, TraceError,
                                 FidelityError, SettingsError, OutputDirError])
def test_user_facing_errors_are_user_errors_and_still_value_errors(cls):
    assert issubclass(cls, UserError) and issubclass(cls, ValueError)


def test_user_errors_holds_user_errors_ray_and_path_errors_only():
    assert UserError in USER_ERRORS and RayUnavailableError in USER_ERRORS
    for cls in USER_ERRORS:
        if cls in PATH_ERRORS or cls is RayUnavailableError:
            continue
        assert issubclass(cls, UserError), cls
    # Neither catch-all: they would print a broken invariant as the user's mistake.
    assert ValueError not in USER_ERRORS and OSError not in USER_ERRORS
    assert not issubclass(ValueError, USER_ERRORS) and not issubclass(OSError, USER_ERRORS)


def test_an_unwritable_out_is_a_user_error_and_an_os_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(OSError, match="cannot write there") as exc:
        check_writable(blocked / "out")
    assert isinstance(exc.value, UserError)


def test_the_cli_raises_no_bare_value_error():
    """Every ``raise ValueError`` the command-line modules had was about a flag: a
    UserError now (the grep would find a new one)."""
    bare = []
    for path in sorted(CLI_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                call = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(call, ast.Name) and call.id in ("ValueError", "OSError"):
                    bare.append(f"{path.name}:{node.lineno}")
    assert bare == []


# -- user errors: one line, exit status 2 ---------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--admission", "nope"], "unknown admission policy 'nope'"),
    (["--capacity", "1KiB"], "too small"),
    (["--capacity", "4K"], "ambiguous unit 'K'"),
    (["--chunk-size", "0"], "--chunk-size must be >= 1 token, got 0"),
    (["--alpha", "inf", "--eviction", "flop"], "--alpha='inf' is invalid; valid: a finite number >= 0"),
    (["--host-capacity", "1KiB"], "--host-capacity 1024 bytes holds no block"),
    (["--host-bandwidth", "0"], "--host-bandwidth must be > 0 bytes per second"),
    (["--host-capacity", "1TiB", "--num-speculative-tokens", "1"],
     "a host tier is modelled without speculative decoding"),
    (["--auto-margin", "-0.5"], "auto's margin over stock's pair must be a finite number >= 0"),
    (["--auto-margin", "nan"], "auto's margin over stock's pair must be a finite number >= 0"),
    (["--admission", "auto", "--auto-admissions", "vllm,nope"], "unknown admission policy 'nope'"),
    (["--admission", "auto", "--auto-admissions", "vllm,auto"], "'auto' is not one"),
    (["--admission", "auto", "--auto-admissions", "vllm,,last"], "a comma-separated list"),
    (["--admission", "auto", "--auto-admissions", "last,last"], "name a policy twice"),
    (["--admission", "vllm", "--auto-admissions", "vllm,written"], "no run here has admission 'auto'"),
])
def test_a_user_error_is_one_line_and_status_2(tmp_path, capsys, argv, message):
    rc = main([*SIMULATE, "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert rc == 2
    assert len(errors) == 1 and errors[0].startswith("vllm-admission: error: ")
    assert message in errors[0]
    assert "Traceback" not in err


def test_a_malformed_trace_line_is_one_line_and_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": [1, 2, 3], "output_len": 2}\n'
                   '{"prompt_token_ids": "abc", "output_len": 2}\n')
    rc = main(["simulate", "--trace", str(bad), "--capacity", "2GiB", "--no-progress",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert rc == 2
    assert "Traceback" not in err
    assert len(errors) == 1 and errors[0].startswith(f"vllm-admission: error: {bad}:2: "
                                                     f"field 'prompt_token_ids'")


def test_argparse_problems_still_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--out", str(tmp_path), "--chunk-size", "many"])
    assert exc.value.code == 2
    assert "invalid int value: 'many'" in capsys.readouterr().err


# -- internal errors: not swallowed ----------------------------------------------------------

def test_an_internal_value_error_propagates_from_main(tmp_path, capsys, monkeypatch):
    """A plain ValueError from inside the simulation (a broken invariant) is not printed
    as the user's mistake: ``main`` raises it."""
    monkeypatch.setattr(simulator, "replay_requests", _broken)
    with pytest.raises(ValueError, match="broken invariant") as exc:
        main([*SIMULATE, "--out", str(tmp_path / "out")])
    assert not isinstance(exc.value, UserError)
    assert "vllm-admission: error:" not in capsys.readouterr().err


def test_an_internal_os_error_propagates_from_main(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(simulator, "replay_requests", full)
    with pytest.raises(OSError, match="No space left"):
        main([*SIMULATE, "--out", str(tmp_path / "out")])


def test_an_internal_error_ends_the_process_with_a_traceback(tmp_path):
    """As a process: exit status 1 (Python's), the traceback on stderr, no error line."""
    code = ("import sys\n"
            "import vllm_admission.sim.simulator as s\n"
            "from vllm_admission.cli import main\n"
            "def broken(*a, **k):\n"
            "    raise ValueError('broken invariant')\n"
            "s.replay_requests = broken\n"
            "sys.exit(main(sys.argv[1:]))\n")
    out = subprocess.run([sys.executable, "-c", code, *SIMULATE, "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    assert "Traceback (most recent call last)" in out.stderr
    assert out.stderr.rstrip().splitlines()[-1] == "ValueError: broken invariant"
    assert "vllm-admission: error:" not in out.stderr


def test_a_user_error_ends_the_process_with_status_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "vllm_admission.cli", *SIMULATE,
                          "--admission", "nope", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith("vllm-admission: error: unknown admission")
    assert "Traceback" not in out.stderr
