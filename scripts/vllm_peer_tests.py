"""Run vLLM's own scheduler tests with the AdmissionScheduler in place of vLLM's classes.

vLLM tests its async scheduler in ``tests/v1/core/test_async_scheduler.py``, building
schedulers through ``tests/v1/core/utils.py`` ``create_scheduler``, which picks
``AsyncScheduler`` or ``Scheduler`` by name. This script runs those tests unmodified
from a copy of vLLM's test tree (default: ``../shared/vllm-0.32.0-tests`` beside this
repository) with a pytest plugin that rebinds both names to
``vllm_admission.AdmissionScheduler`` (which picks its async variant itself).

Layouts (``--layout``):

* ``stock``: the tests as written (one full-attention group, ``facebook/opt-125m``): the
  plugin has nothing to do there and must behave exactly as vLLM's class;
* ``hybrid``: every scheduler gets a second KV cache group, a Mamba state group in
  vLLM's ``align`` mode, and prefix caching on, so the plugin is active
  (``VLLM_ADMISSION_POLICY`` / ``VLLM_ADMISSION_EVICTION`` choose its policies).

Usage::

    python scripts/vllm_peer_tests.py [--tests DIR] [--layout stock|hybrid]
        [--classes plugin|vllm] [-- PYTEST_ARGS]

Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = REPO.parent / "shared" / "vllm-0.32.0-tests"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=Path, default=DEFAULT_TESTS,
                        help="a folder holding vLLM's tests/ tree (and hf_home/)")
    parser.add_argument("--layout", choices=("stock", "hybrid"), default="stock")
    parser.add_argument("--classes", choices=("plugin", "vllm"), default="plugin",
                        help="plugin: the AdmissionScheduler in place of vLLM's classes; "
                             "vllm: vLLM's own (the reference for a layout)")
    parser.add_argument("--test-file", default="tests/v1/core/test_async_scheduler.py")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    root = args.tests.resolve()
    if not (root / args.test_file).is_file():
        parser.error(f"no {args.test_file} under {root}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), str(root), env.get("PYTHONPATH", "")) if p)
    env["VLLM_ADMISSION_PEER_LAYOUT"] = args.layout
    env["VLLM_ADMISSION_PEER_CLASSES"] = args.classes
    if (root / "hf_home").is_dir():
        env.setdefault("HF_HOME", str(root / "hf_home"))
        env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "vllm_admission_testing.peer_swap",
           "-p", "no:cacheprovider", "--rootdir", str(root), args.test_file, *args.pytest_args]
    return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
