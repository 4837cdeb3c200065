"""Sweeps as Ray tasks (``--executor ray``): the same results document as the process pool,
the trace put in the object store once and never re-read by the tasks, a local instance
started and stopped when none runs, the one-line error without Ray, and the CLI flags.

The Ray tests start one local instance for the module (2 CPUs, no dashboard) and shut it
down afterwards; ``test_local_instance_*`` runs first, before that instance exists. Ray is
in the ``dev`` extra, so CI (``make test``) runs them; without Ray they are skipped, except
under ``CI`` where a missing Ray is an install bug and fails.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from shared_data import MOONCAKE

from vllm_admission.cli import build_parser, main
from vllm_admission.core.costs import ModelCosts
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.core.traces import Trace
from vllm_admission.sim import sweep
from vllm_admission.sim.sweep import RayUnavailableError, SweepSpec, run_sweep

if os.environ.get("CI"):
    import ray  # noqa: F401  (CI installs .[cpu,dev], which has Ray: never skip there)
ray = pytest.importorskip("ray")

#: 2 capacities x 2 (admission, eviction) pairs.
SMALL = ["--max-requests", "200", "--capacity", "2GiB,8GiB", "--admission", "vllm,marconi",
         "--eviction", "lru", "--no-progress"]


def _without_timings(doc: dict) -> dict:
    """``doc`` less each run's ``wall_seconds`` and ``cpu_seconds`` (the only fields that
    depend on where a run executed)."""
    doc = json.loads(json.dumps(doc))
    for run in doc["runs"]:
        del run["wall_seconds"], run["cpu_seconds"]
    return doc


def test_local_instance_is_started_with_jobs_cpus_and_shut_down(tmp_path, monkeypatch):
    assert not ray.is_initialized(), "runs before the module's Ray instance starts"
    calls = []
    real_init = ray.init

    def init(*args, **kwargs):
        calls.append(kwargs)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", init)
    rc = main(["simulate", "--trace", "synthetic", *SMALL, "--executor", "ray", "--jobs", "1",
               "--out", str(tmp_path)])
    assert rc == 0
    assert len(calls) == 1
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 1
    assert calls[0]["include_dashboard"] is False
    assert not ray.is_initialized()  # the sweep started it, so the sweep stopped it
    assert len(json.loads((tmp_path / "results.json").read_text())["runs"]) == 4


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the module's Ray tests (the sweeps reuse it)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             object_store_memory=sweep.LOCAL_RAY_OBJECT_STORE_BYTES, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_cli_results_json_is_the_same_through_processes_and_ray(tmp_path, ray_instance):
    docs = {}
    for executor in ("process", "ray"):
        out = tmp_path / executor
        rc = main(["simulate", "--trace", "synthetic", *SMALL, "--executor", executor,
                   "--jobs", "2", "--out", str(out)])
        assert rc == 0
        docs[executor] = json.loads((out / "results.json").read_text())
    assert ray.is_initialized()  # an instance already running is used and left running
    process, by_ray = (_without_timings(docs[e]) for e in ("process", "ray"))
    assert process == by_ray
    assert [(r["admission"], r["eviction"], r["capacity_bytes"]) for r in by_ray["runs"]] == [
        (a, "lru", parse_bytes(c)) for a in ("vllm", "marconi") for c in ("2GiB", "8GiB")]
    assert all(r["requests"] == 200 for r in by_ray["runs"])


def test_ray_tasks_take_the_trace_from_the_object_store(tmp_path, ray_instance, monkeypatch):
    if not MOONCAKE.exists():
        pytest.fail(f"the Mooncake trace is missing: {MOONCAKE}")
    # The first 200 Mooncake requests, in a file of their own that disappears once the
    # driver has loaded it: a task that read the trace itself would fail.
    path = tmp_path / "mooncake200.jsonl"
    with MOONCAKE.open() as src:
        path.write_text("".join(next(src) for _ in range(200)))
    spec = SweepSpec(trace=str(path), model="qwen3-next-80b-a3b",
                     capacities=(parse_bytes("2GiB"), parse_bytes("8GiB")),
                     admissions=("vllm", "marconi"), evictions=("lru",), chunk_size=8192)
    by_process = run_sweep(spec, jobs=2, progress=False, executor="process")

    put = []
    real_put = ray.put

    def put_and_drop_the_file(value, *args, **kwargs):
        put.append(value)
        path.unlink(missing_ok=True)
        return real_put(value, *args, **kwargs)

    def not_here(*args):
        raise AssertionError("a run of a Ray sweep executed in the driver")

    monkeypatch.setattr(ray, "put", put_and_drop_the_file)
    monkeypatch.setattr(sweep, "_run_one", not_here)
    by_ray = run_sweep(spec, progress=False, executor="ray")

    assert not path.exists()
    assert _without_timings(by_ray) == _without_timings(by_process)
    assert len(by_ray["runs"]) == 4
    assert all(r["requests"] + r["skipped_requests"] == 200 for r in by_ray["runs"])
    # Put once each: the trace (without its block-hash memo), the costs, the cache
    # requests of the one block size both capacities have.
    kinds = [type(v) for v in put]
    assert kinds == [Trace, ModelCosts, list]
    assert put[0].name == by_process["trace"] and not put[0]._hash_memo
    assert len(put[2]) == 200
    assert {r["block_size"] for r in by_ray["runs"]} == {544}


def test_auto_run_through_ray_matches_processes(ray_instance):
    spec = SweepSpec(trace="synthetic", model="qwen3-next-80b-a3b",
                     capacities=(parse_bytes("2GiB"),), admissions=("vllm",), evictions=("lru",),
                     chunk_size=8192, max_requests=150, auto_interval=25,
                     pairs=(("auto", "auto"),))
    by_process = run_sweep(spec, jobs=2, progress=False)
    by_ray = run_sweep(spec, progress=False, executor="ray")
    assert _without_timings(by_ray) == _without_timings(by_process)
    # Finishing order does not reorder the document: the grid first, then the pair.
    assert [(r["admission"], r["eviction"]) for r in by_ray["runs"]] == [("vllm", "lru"),
                                                                          ("auto", "auto")]


def test_without_ray_the_error_is_one_line_with_the_install_command(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    rc = main(["simulate", "--trace", "synthetic", *SMALL, "--executor", "ray",
               "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("vllm-admission: error: --executor ray needs Ray")
    assert 'pip install "ray>=2.9"' in err
    assert not (tmp_path / "results.json").exists()
    spec = SweepSpec(trace="no/such/trace.jsonl", model="qwen3-next-80b-a3b",
                     capacities=(parse_bytes("2GiB"),), admissions=("vllm",),
                     evictions=("lru",), chunk_size=8192)
    with pytest.raises(RayUnavailableError, match="pip install"):
        run_sweep(spec, progress=False, executor="ray")  # before reading the trace


@pytest.mark.parametrize("argv, want", [
    ([], {"executor": "process", "ray_address": None, "jobs": 1}),
    (["--jobs", "3"], {"executor": "process", "ray_address": None, "jobs": 3}),
    (["--executor", "ray"], {"executor": "ray", "ray_address": None, "jobs": None}),
    (["--executor", "ray", "--jobs", "4"], {"executor": "ray", "ray_address": None, "jobs": 4}),
    (["--executor", "ray", "--ray-address", "auto"],
     {"executor": "ray", "ray_address": "auto", "jobs": None}),
    (["--executor", "ray", "--ray-address", "ray://head:10001"],
     {"executor": "ray", "ray_address": "ray://head:10001", "jobs": None}),
])
def test_cli_flags_reach_run_sweep(tmp_path, monkeypatch, argv, want):
    seen = {}
    real = sweep.run_sweep

    def spy(spec, **kwargs):
        seen.update(kwargs)
        return real(spec, progress=False)  # the sweep itself in this process

    monkeypatch.setattr(sweep, "run_sweep", spy)
    rc = main(["simulate", "--trace", "synthetic", "--max-requests", "40", "--capacity", "2GiB",
               "--admission", "vllm", "--eviction", "lru", "--no-progress", *argv,
               "--out", str(tmp_path)])
    assert rc == 0
    assert {k: seen[k] for k in want} == want


def test_demo_keeps_two_processes_by_default():
    args = build_parser().parse_args(["demo"])
    assert (args.executor, args.jobs, args.process_jobs) == ("process", None, 2)


def test_cli_jobs_note_and_bad_combinations(tmp_path, capsys, monkeypatch):
    # The sweep itself in this process: only the flags' handling is under test here.
    monkeypatch.setattr(sweep, "run_sweep", lambda spec, **kw: run_sweep(spec, progress=False))
    base = ["simulate", "--trace", "synthetic", "--max-requests", "40", "--capacity", "2GiB",
            "--admission", "vllm", "--eviction", "lru", "--out", str(tmp_path)]
    assert main([*base, "--executor", "ray", "--ray-address", "auto", "--jobs", "2"]) == 0
    assert "--jobs is ignored with --ray-address" in capsys.readouterr().err
    assert main([*base, "--ray-address", "auto"]) == 2
    assert "--ray-address needs --executor ray" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--executor", "dask"])
    assert "invalid choice: 'dask'" in capsys.readouterr().err


def test_unknown_executor_is_refused_before_any_run():
    spec = SweepSpec(trace="synthetic", model="qwen3-next-80b-a3b",
                     capacities=(parse_bytes("2GiB"),), admissions=("vllm",),
                     evictions=("lru",), chunk_size=8192, max_requests=10)
    with pytest.raises(ValueError, match="unknown executor 'dask'"):
        run_sweep(spec, executor="dask", progress=False)
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        run_sweep(spec, jobs=0, progress=False)


def test_ray_is_declared_where_make_install_gets_it():
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert any(d.startswith("ray") for d in extras["ray"])
    assert any(d.startswith("ray") for d in extras["dev"])
