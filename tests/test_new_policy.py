"""A new policy costs one class and one registry entry: the proof, in a scratch copy.

The package and the tests are copied to a temporary directory. Appended to the copy (never
matched by line, so this stays true as the code moves):

* ``core/eviction/registry.py``: one eviction class, ``scratch_mru`` (most recently freed
  first), and its ``register_eviction`` entry;
* ``core/admission/policies.py``: one admission class, ``scratch_junction`` (a state at the
  shared-prefix junction only, through the ``junction`` hook), and its
  ``register_admission`` entry.

Then, with the copy first on the path, in subprocesses: both run in the simulator on the
synthetic trace, alone and together; the plugin's settings accept them
(``VLLM_ADMISSION_EVICTION`` / ``VLLM_ADMISSION_POLICY``); they join no ``auto`` (the
candidates and an ``auto`` run are exactly the unedited package's); and the engine-against-
core random-workload test of ``tests/test_plugin_scheduler.py``, parametrised over the
registries, passes for every case that names them (``-k``). No other file is edited.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from scratch_policy import SCRATCH_MRU_SOURCE

import vllm_admission
from vllm_admission.core.adaptive import AUTO_ADMISSIONS, AUTO_EVICTIONS
from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.costs import load_model
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES
from vllm_admission.core.traces import load_trace
from vllm_admission.sim.simulator import SimulationSettings, simulate

pytestmark = pytest.mark.slow  # a copy of the package, then subprocesses: not in make test-fast

NEW_EVICTION, NEW_ADMISSION = "scratch_mru", "scratch_junction"

#: Appended to the copy's registry module: the class, then its one registry entry.
EVICTION_CLASS = "\n\n" + SCRATCH_MRU_SOURCE + "\n\nregister_eviction(ScratchMRUEviction)\n"

ADMISSION_CLASS = '''

class ScratchJunctionAdmission(AdmissionPolicy):
    """A state at the shared-prefix junction only (a test policy)."""

    name = "scratch_junction"
    summary = "a state at the shared-prefix junction only"
    admitted = frozenset({CheckpointKind.JUNCTION})

    def junction(self, probe):
        return probe.junction


register_admission(ScratchJunctionAdmission)
'''

#: Run in the copy: the registries, the plugin's settings, auto, the simulator.
CHECKS = '''
import json, sys
import vllm_admission
from vllm_admission.core.adaptive import AUTO_ADMISSIONS, AUTO_EVICTIONS, candidate_policies
from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission
from vllm_admission.core.costs import load_model
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES, EVICTION_POLICIES
from vllm_admission.core.traces import load_trace
from vllm_admission.plugin.env import Settings
from vllm_admission.sim.simulator import SimulationSettings, simulate

expected = json.loads(sys.argv[1])
assert vllm_admission.__file__.startswith(expected["copy"]), vllm_admission.__file__
new_ev, new_adm = expected["eviction"], expected["admission"]
assert new_ev in EVICTION_POLICIES and new_ev in ENGINE_EVICTION_POLICIES
assert new_adm in ADMISSION_POLICIES and get_admission(new_adm).uses_junction
cfg = Settings.from_env({"VLLM_ADMISSION_POLICY": new_adm,
                                "VLLM_ADMISSION_EVICTION": new_ev})
assert (cfg.admission, cfg.eviction) == (new_adm, new_ev) and cfg.wants_changes()
# auto: the same candidates as the unedited package, so the same run.
assert list(AUTO_ADMISSIONS) == expected["auto_admissions"]
assert list(AUTO_EVICTIONS) == expected["auto_evictions"]
assert candidate_policies("auto", "auto") == (AUTO_ADMISSIONS, AUTO_EVICTIONS)
trace, costs = load_trace("synthetic"), load_model("qwen3-next-80b-a3b")
auto = simulate(trace, costs, SimulationSettings.of("auto", "auto",
                                                 capacity_bytes=4 << 30, per_request=True)).to_record()
for key in ("per_request_hits", "policy_switches", "final_policy"):
    assert auto[key] == expected["auto"][key], key
hits = {}
for adm, ev in ((new_adm, "lru"), ("vllm", new_ev), (new_adm, new_ev), ("auto", new_ev),
                (new_adm, "auto")):
    r = simulate(trace, costs, SimulationSettings.of(adm, ev, capacity_bytes=4 << 30))
    assert r.requests > 0 and r.evictions > 0, (adm, ev)
    hits[f"{adm}+{ev}"] = r.hit_tokens
assert hits[f"{new_adm}+lru"] > 0
print(json.dumps(hits))
'''


def _scratch_copy(root: Path) -> Path:
    """The package, its test helpers, the tests and pyproject copied under ``root``, the two
    policies appended."""
    src = Path(vllm_admission.__file__).resolve().parent
    repo = root / "repo"
    shutil.copytree(src, repo / "vllm_admission",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    shutil.copytree(Path(__file__).resolve().parent, repo / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    shutil.copytree(src.parent / "vllm_admission_testing", repo / "vllm_admission_testing",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(src.parent / "pyproject.toml", repo / "pyproject.toml")
    with open(repo / "vllm_admission/core/eviction/registry.py", "a") as f:
        f.write(EVICTION_CLASS)
    with open(repo / "vllm_admission/core/admission/policies.py", "a") as f:
        f.write(ADMISSION_CLASS)
    return repo


def _run(args: list[str], repo: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_a_new_policy_is_one_class_and_one_registry_entry(tmp_path):
    repo = _scratch_copy(tmp_path)
    auto = simulate(load_trace("synthetic"), load_model("qwen3-next-80b-a3b"),
                    SimulationSettings.of("auto", "auto", capacity_bytes=4 << 30,
                                       per_request=True)).to_record()
    assert auto["policy_switches"], "the reference auto run must decide something"
    expected = {"copy": str(repo), "eviction": NEW_EVICTION, "admission": NEW_ADMISSION,
                "auto_admissions": list(AUTO_ADMISSIONS),
                "auto_evictions": list(AUTO_EVICTIONS),
                "auto": {k: auto[k] for k in ("per_request_hits", "policy_switches",
                                              "final_policy")}}
    out = _run(["-c", textwrap.dedent(CHECKS), json.dumps(expected)], repo, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]

    pytest.importorskip("vllm")
    selected = (f"test_random_workload_matches_core_model and "
                f"({NEW_EVICTION} or {NEW_ADMISSION})")
    out = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_plugin_scheduler.py",
                "-k", selected], repo, timeout=600)
    tail = out.stdout[-4000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    last = out.stdout.strip().splitlines()[-1]
    assert "passed" in last and "failed" not in last and "error" not in last, tail
    # Every admission policy with the new eviction, every eviction case with the new admission.
    assert int(last.split()[0]) >= len(ADMISSION_POLICIES) + 1 + len(ENGINE_EVICTION_POLICIES), tail
