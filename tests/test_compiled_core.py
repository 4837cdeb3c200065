"""The compiled hot path gives the pure-Python results bit for bit.

The same ``vllm-admission simulate`` sweeps run twice in subprocesses: once with the
extension modules (``setup.py``; ``vllm_admission.hotpath.COMPILED``) and once with
``VLLM_ADMISSION_PURE_PYTHON=1``; each child first checks which build it runs. The two
``results.json`` documents must be equal in every field but the run times. Skipped where
no compiled build is installed (a pure-Python install, or ``VLLM_ADMISSION_NO_COMPILE=1``).
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_admission import hotpath

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
TIMING = {"wall_seconds", "cpu_seconds"}

# Checks the build the child runs, then runs the CLI with the rest of argv.
CHILD = """
import json, sys
import vllm_admission
from vllm_admission import hotpath
want_compiled = sys.argv[1] == "compiled"
for name in hotpath.COMPILED:
    __import__(name)
live = set(vllm_admission.compiled_modules())
if want_compiled and live != set(hotpath.COMPILED):
    sys.exit(f"expected every hot-path module compiled; missing: {sorted(set(hotpath.COMPILED) - live)}")
if not want_compiled and live:
    sys.exit(f"expected pure Python; extension modules loaded: {sorted(live)}")
from vllm_admission.cli import main
sys.exit(main(sys.argv[2:]))
"""


def built_modules() -> list[str]:
    """The modules of ``COMPILED`` with an extension module beside their source."""
    return [name for name in hotpath.COMPILED
            if any((ROOT / Path(*name.split("."))).with_suffix(s).exists()
                   for s in importlib.machinery.EXTENSION_SUFFIXES)]


def compiled_build_present() -> bool:
    """Whether a compiled build is installed (some module of ``COMPILED`` built)."""
    return bool(built_modules())


pytestmark = pytest.mark.skipif(
    not compiled_build_present(),
    reason="no compiled hot path installed (pure-Python install, or VLLM_ADMISSION_NO_COMPILE=1)")


def test_every_hot_path_module_built():
    """A build that compiled some modules compiled them all (a partial build is a failure)."""
    assert built_modules() == list(hotpath.COMPILED)


def strip_times(doc):
    """``doc`` without its run-time fields, at any depth."""
    if isinstance(doc, dict):
        return {k: strip_times(v) for k, v in doc.items() if k not in TIMING}
    if isinstance(doc, list):
        return [strip_times(v) for v in doc]
    return doc


def simulate(build: str, out: Path, args: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != hotpath.PURE_ENV}
    if build == "pure":
        env[hotpath.PURE_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-c", CHILD, build, "simulate", *args,
                           "--executor", "process", "--jobs", "1", "--no-progress", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


CASES = {
    "synthetic": ["--trace", "synthetic", "--max-requests", "200", "--capacity", "1GiB,4GiB",
                  "--admission", "vllm,marconi,dense", "--eviction", "lru,flop,reuse,s3fifo,belady",
                  "--pairs", "auto+auto,auto+lru,vllm+auto"],
    "mooncake": ["--trace", str(MOONCAKE), "--max-requests", "1500", "--capacity", "16GiB",
                 "--pairs", "vllm+lru,vllm+flop,marconi+reuse,vllm+s3fifo,vllm+belady,"
                            "dense+reuse,auto+auto", "--model", "qwen3-next-80b-a3b"],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_results_equal_pure_python(case, tmp_path):
    if case == "mooncake" and not MOONCAKE.exists():
        pytest.skip(f"Mooncake trace not found at {MOONCAKE}")
    compiled = simulate("compiled", tmp_path / "compiled", CASES[case])
    pure = simulate("pure", tmp_path / "pure", CASES[case])
    assert strip_times(compiled) == strip_times(pure)
    runs = compiled["runs"]
    assert len(runs) >= 7 and all(r["requests"] > 0 for r in runs)
    assert any(r["hit_tokens"] > 0 and r["evictions"] > 0 for r in runs)


def test_pure_switch_and_report():
    """``VLLM_ADMISSION_PURE_PYTHON=1`` loads no extension module; without it, all load."""
    code = ("import vllm_admission; from vllm_admission import hotpath; "
            "print(hotpath.describe()); print(len(vllm_admission.compiled_modules()))")
    lines = {}
    for build in ("pure", "compiled"):
        env = {k: v for k, v in os.environ.items() if k != hotpath.PURE_ENV}
        if build == "pure":
            env[hotpath.PURE_ENV] = "1"
        env["PYTHONPATH"] = str(ROOT)
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                              capture_output=True, text=True, check=True)
        lines[build] = done.stdout.split("\n")
    assert lines["pure"][0].startswith("hot path: pure Python")
    assert lines["pure"][1] == "0"
    assert lines["compiled"][0].startswith("hot path: compiled")
    assert lines["compiled"][1] == str(len(hotpath.COMPILED))
