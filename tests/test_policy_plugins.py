"""Policies from another package (issue 34): an entry point, and nothing else, makes a
policy run everywhere a built-in runs.

A scratch package is written to a temporary folder with its distribution metadata
(``*.dist-info/entry_points.txt``, which ``importlib.metadata`` reads from any folder on
the path), declaring two eviction policies in the group
``vllm_admission.eviction_policies``: ``scratch_mru`` (most recently freed first) and
``scratch_lru``, a subclass of ``LRUEviction`` under a new name. With that folder on
``PYTHONPATH``, in subprocesses: both are registered, the plugin's
``VLLM_ADMISSION_EVICTION`` accepts them, ``simulate`` runs them, vLLM's own order and
``auto``'s candidates stay the built-in ones (declarations are not inherited), and the
registry-wide eviction tests collect and pass for ``scratch_mru``. Nothing of the package is
edited or copied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scratch_policy import SCRATCH_MRU_SOURCE

from vllm_admission.core.admission import ADMISSION_POLICIES

REPO = Path(__file__).resolve().parent.parent

POLICIES = (
    "from vllm_admission.core.eviction.base import EvictionPolicy\n"
    "from vllm_admission.core.eviction.lru import LRUEviction\n\n\n"
    + SCRATCH_MRU_SOURCE + '''


class ScratchLRUEviction(LRUEviction):
    """vLLM's order under another name: it declares neither vllm_order nor auto_candidate."""

    name = "scratch_lru"
    summary = "lru under another name (from another package)"
''')

ENTRY_POINTS = '''
[vllm_admission.eviction_policies]
scratch_mru = scratch_policies:ScratchMRUEviction
scratch_lru = scratch_policies:ScratchLRUEviction
'''

CHECKS = '''
import json
from vllm_admission.core.adaptive import AUTO_EVICTIONS, auto_evictions
from vllm_admission.core.eviction import (EVICTION_POLICIES, engine_eviction_policies,
                                          eviction_class, stock_eviction)
from vllm_admission.core.policies import load_policy_plugins
from vllm_admission.plugin.env import Settings

at_import = [n for n in EVICTION_POLICIES if n.startswith("scratch")]
loaded = load_policy_plugins()
print(json.dumps({"at_import": at_import, "loaded": loaded,
    "registered": [n for n in EVICTION_POLICIES if n.startswith("scratch")],
    "engine": [n for n in engine_eviction_policies() if n.startswith("scratch")],
    "stock": stock_eviction(),
    "auto": list(auto_evictions()), "AUTO": list(AUTO_EVICTIONS),
    "declared": [eviction_class("scratch_lru").vllm_order,
                 eviction_class("scratch_lru").auto_candidate],
    "accepted": Settings.from_env({"VLLM_ADMISSION_EVICTION": "scratch_mru"}).eviction,
}))
'''


@pytest.fixture(scope="module")
def scratch_path(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("scratch_site")
    (root / "scratch_policies.py").write_text(textwrap.dedent(POLICIES))
    info = root / "scratch_policies-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: scratch-policies\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    return str(root)


def _run(args, scratch_path, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([scratch_path, str(REPO)]))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_an_entry_point_registers_a_policy_everywhere(scratch_path):
    out = _run(["-c", CHECKS], scratch_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # Importing registers the built-ins only; the front end's call adds the package's.
    assert got["at_import"] == [] and got["loaded"] == ["scratch_mru", "scratch_lru"]
    assert got["registered"] == ["scratch_mru", "scratch_lru"]
    assert got["engine"] == ["scratch_mru", "scratch_lru"]     # VLLM_ADMISSION_EVICTION values
    assert got["accepted"] == "scratch_mru"
    # A subclass of lru under a new name: vLLM's order and auto's candidates are unchanged.
    assert got["stock"] == "lru" and got["declared"] == [False, False]
    assert got["auto"] == got["AUTO"] == ["lru", "reuse"]


def test_simulate_runs_a_policy_from_another_package(scratch_path, tmp_path):
    out = _run(["-m", "vllm_admission.cli", "simulate", "--trace", "synthetic",
                "--max-requests", "80", "--capacity", "2GiB", "--admission", "vllm",
                "--eviction", "lru,scratch_lru,scratch_mru", "--no-progress",
                "--out", str(tmp_path)], scratch_path)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {r["eviction"]: r for r in json.loads((tmp_path / "results.json").read_text())["runs"]}
    assert set(runs) == {"lru", "scratch_lru", "scratch_mru"}
    assert runs["scratch_mru"]["evictions"] > 0
    for key in ("hit_tokens", "evictions", "state_checkpoints"):   # lru's code, lru's results
        assert runs["scratch_lru"][key] == runs["lru"][key]
    assert runs["scratch_mru"]["hit_tokens"] != runs["lru"]["hit_tokens"]


@pytest.mark.slow   # about 20 s: a pytest subprocess over two modules
def test_the_registry_wide_tests_run_the_plugged_in_policy(scratch_path):
    """The eviction tests, and the scheduler harness under vLLM's async scheduling (every
    request's hit, evictions and checkpoints equal to the core model's, one request after
    another and in overlapping waves), collect ``scratch_mru`` and pass."""
    out = _run(["-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests/test_eviction.py",
                "tests/test_async_scheduler.py", "-k", "scratch_mru"], scratch_path,
               timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    passed = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("PASSED ")}
    assert sum("test_eviction.py" in t for t in passed) >= 2, out.stdout[-2000:]
    for policy in ADMISSION_POLICIES:
        assert ("tests/test_async_scheduler.py::test_requests_one_after_another_get_the_"
                f"simulators_hits[{policy}-scratch_mru-None]") in passed, out.stdout[-2000:]


def test_a_broken_entry_point_is_left_out_with_one_warning(tmp_path):
    (tmp_path / "broken_policies.py").write_text("raise ImportError('no such thing')\n")
    info = tmp_path / "broken_policies-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-policies\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[vllm_admission.eviction_policies]\nbroken = broken_policies:Broken\n")
    out = _run(["-c", "from vllm_admission.core.eviction import EVICTION_POLICIES; "
                      "from vllm_admission.core.policies import load_policy_plugins; "
                      "load_policy_plugins(); print('broken' in EVICTION_POLICIES)"], str(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == "False"
    assert ("policy entry point broken = broken_policies:Broken (broken-policies) left out: "
            "ImportError: no such thing") in out.stderr


def test_an_unknown_name_loads_the_entry_points_before_it_is_refused(scratch_path):
    """Through the Python API, with no front end having loaded anything: a lookup of a name
    the built-ins lack loads the entry points once and finds the package's policy; a name
    nobody declares is refused with the valid names, the package's among them."""
    code = ("from vllm_admission.core.eviction import EVICTION_POLICIES, get_eviction\n"
            "before = 'scratch_mru' in EVICTION_POLICIES\n"
            "policy = get_eviction('scratch_mru')\n"
            "try:\n    get_eviction('nope')\nexcept ValueError as exc:\n    message = str(exc)\n"
            "print(before, type(policy).__name__, '|', message)")
    out = _run(["-c", code], scratch_path)
    assert out.returncode == 0, out.stderr[-3000:]
    before, name, _, message = out.stdout.strip().splitlines()[-1].split(" ", 3)
    assert (before, name) == ("False", "ScratchMRUEviction")
    assert message.startswith("unknown eviction policy 'nope'; valid: lru,")
    assert "scratch_mru" in message
