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

``--connector-tests`` runs vLLM 0.32.0's scheduler-level KV connector unit tests
instead (:data:`CONNECTOR_TESTS`, from ``tests/v1/kv_connector/unit/``): the shared
checkout has their helpers only, so the test files come from vLLM's source distribution
on PyPI (downloaded once into ``out/peer/``, checked against PyPI's sha256) and are laid
over a copy of the shared tree. They build schedulers through
``tests/v1/kv_connector/unit/utils.py`` ``create_scheduler``, rebound like the core one.

Usage::

    python scripts/vllm_peer_tests.py [--tests DIR] [--layout stock|hybrid]
        [--classes plugin|vllm] [--connector-tests] [-- PYTEST_ARGS]

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
PEER_OUT = REPO / "out" / "peer"

#: vLLM 0.32.0's KV connector unit tests that drive the scheduler (with its mock, NIXL,
#: decode-bench and failure-injecting connectors) and run on a CPU.
CONNECTOR_TESTS = tuple(f"tests/v1/kv_connector/unit/{name}.py" for name in (
    "test_remote_prefill_lifecycle", "test_remote_decode_lifecycle",
    "test_kv_connector_lifecycle", "test_scheduler_kv_connector_override",
    "test_cache_pollution_prevention", "test_invalid_blocks_correctness",
    "test_kv_load_failure_recovery", "test_error_propagation"))


def connector_tree(shared: Path, version: str = "0.32.0") -> Path:
    """A copy of the ``shared`` test tree with vLLM ``version``'s connector unit tests
    (every ``tests/v1/kv_connector/unit/`` file the tree lacks) from its sdist."""
    import shutil
    import tarfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compat import download_sdist

    tree = PEER_OUT / f"vllm-{version}-tests"
    stamp = tree / ".complete"
    if stamp.exists():
        return tree
    sdist = download_sdist(version, PEER_OUT / "dl")
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(shared, tree)
    prefix = f"vllm-{version}/"
    unit = "tests/v1/kv_connector/unit/"
    with tarfile.open(sdist) as tf:
        for member in tf.getmembers():
            rel = member.name.removeprefix(prefix)
            if member.isfile() and rel.startswith(unit) and "/" not in rel[len(unit):] \
                    and not (tree / rel).exists():
                (tree / rel).write_bytes(tf.extractfile(member).read())
    stamp.write_text(version + "\n")
    return tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=Path, default=DEFAULT_TESTS,
                        help="a folder holding vLLM's tests/ tree (and hf_home/)")
    parser.add_argument("--layout", choices=("stock", "hybrid"), default="stock")
    parser.add_argument("--classes", choices=("plugin", "vllm"), default="plugin",
                        help="plugin: the AdmissionScheduler in place of vLLM's classes; "
                             "vllm: vLLM's own (the reference for a layout)")
    parser.add_argument("--test-file", default="tests/v1/core/test_async_scheduler.py")
    parser.add_argument("--connector-tests", action="store_true",
                        help="run vLLM 0.32.0's scheduler-level KV connector unit tests "
                             "(fetched once from its PyPI sdist) instead of --test-file")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    root = args.tests.resolve()
    test_files = [args.test_file]
    if args.connector_tests:
        if not (root / "tests" / "v1" / "kv_connector" / "unit" / "utils.py").is_file():
            parser.error(f"no vLLM connector test helpers under {root}")
        root = connector_tree(root)
        test_files = list(CONNECTOR_TESTS)
    missing = [f for f in test_files if not (root / f).is_file()]
    if missing:
        parser.error(f"no {missing[0]} under {root}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), str(root), env.get("PYTHONPATH", "")) if p)
    env["VLLM_ADMISSION_PEER_LAYOUT"] = args.layout
    env["VLLM_ADMISSION_PEER_CLASSES"] = args.classes
    if (root / "hf_home").is_dir():
        env.setdefault("HF_HOME", str(root / "hf_home"))
        env.setdefault("HF_HUB_OFFLINE", "1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "vllm_admission_testing.peer_swap",
           "-p", "no:cacheprovider", "--rootdir", str(root), *test_files, *args.pytest_args]
    return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
