"""The plugin's /metrics path without a server: snapshot files, the collector, register()."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from vllm_admission.plugin.metrics.prometheus import (  # noqa: E402
    COUNTERS,
    AdmissionCollector,
    StatsPublisher,
    read_snapshots,
)
from vllm_admission.plugin.metrics.stats import AdmissionStats  # noqa: E402


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def stats(**kw) -> AdmissionStats:
    base = dict(active=True, admission="marconi", eviction="flop", alpha=0.5, requests=7,
                prompt_tokens=9000, junctions=2, state_checkpoints=5, superseded=1, hit_requests=4,
                hit_tokens=3072, evictions=11, evictions_by_group={"state0": 3, "attention1": 8},
                free_blocks=40, usable_blocks=63, adaptive=True,
                policy_switches=[{"at": 49, "window": 50, "from": "vllm+lru", "to": "marconi+lru",
                                  "scores": {"vllm+lru": 1.0, "marconi+lru": 2.0}},
                                 {"at": 99, "window": 50, "from": "marconi+lru", "to": "marconi+lfu",
                                  "scores": {"marconi+lru": 1.0, "marconi+lfu": 2.0}}])
    base.update(kw)
    return AdmissionStats(**base)


def test_publisher_writes_atomically_and_throttles(tmp_path):
    clock = FakeClock()
    pub = StatsPublisher(tmp_path / "m", engine_index=3, interval_s=1.0, clock=clock)
    assert pub.due(idle=False)
    pub.publish(stats())
    assert json.loads((tmp_path / "m" / "engine-3.json").read_text()) == stats().to_dict()
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["engine-3.json"]  # no temp file left
    clock.t += 0.5
    assert not pub.due(idle=False)
    assert pub.due(idle=True)  # the last request ended: publish whatever the interval
    clock.t += 0.5
    assert pub.due(idle=False)
    assert read_snapshots(tmp_path / "m") == {"3": stats().to_dict()}
    pub.remove()
    assert not (tmp_path / "m").exists()
    assert read_snapshots(tmp_path / "m") == {}


def test_publisher_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv("VLLM_ADMISSION_METRICS_DIR", raising=False)
    assert StatsPublisher.from_env() is None
    monkeypatch.setenv("VLLM_ADMISSION_METRICS_DIR", str(tmp_path))
    assert StatsPublisher.from_env(engine_index=1).path == tmp_path / "engine-1.json"


def scrape(collector) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_collector_exports_every_counter_with_vllm_conventions(tmp_path):
    StatsPublisher(tmp_path, engine_index=0).publish(stats())
    StatsPublisher(tmp_path, engine_index=1).publish(stats(eviction="lru", alpha=None, requests=2,
                                                           evictions_by_group={}))
    got = scrape(AdmissionCollector(tmp_path, "my-model"))
    e0 = (("engine", "0"), ("model_name", "my-model"))
    e1 = (("engine", "1"), ("model_name", "my-model"))
    s = stats()
    for name, (field, _) in COUNTERS.items():
        want = getattr(s, field)
        want = len(want) if isinstance(want, list) else want
        assert got[(f"vllm:hybrid_prefix_cache_{name}_total", e0)] == want
    # The published names stay as dashboards know them, whatever the field is called now.
    assert got[("vllm:hybrid_prefix_cache_tokens_saved_total", e0)] == s.hit_tokens == 3072
    assert got[("vllm:hybrid_prefix_cache_state_hits_total", e0)] == s.hit_requests == 4
    assert got[("vllm:hybrid_prefix_cache_checkpoints_total", e0)] == s.state_checkpoints == 5
    assert got[("vllm:hybrid_prefix_cache_policy_switches_total", e0)] == 2
    assert got[("vllm:hybrid_prefix_cache_requests_total", e1)] == 2
    info = [k for k in got if k[0] == "vllm:hybrid_prefix_cache_policy_info"]
    assert sorted(dict(labels)["eviction"] for _, labels in info) == ["flop", "lru"]
    assert all(dict(labels)["admission"] == "marconi" for _, labels in info)
    assert all(dict(labels)["auto"] == "true" for _, labels in info)
    assert got[("vllm:hybrid_prefix_cache_evictions_total",
                tuple(sorted({"engine": "0", "model_name": "my-model", "kind": "state",
                              "group": "0"}.items())))] == 3
    assert got[("vllm:hybrid_prefix_cache_evictions_total",
                tuple(sorted({"engine": "0", "model_name": "my-model", "kind": "attention",
                              "group": "1"}.items())))] == 8
    assert got[("vllm:hybrid_prefix_cache_alpha", e0)] == 0.5
    assert ("vllm:hybrid_prefix_cache_alpha", e1) not in got  # lru has no alpha
    assert got[("vllm:hybrid_prefix_cache_free_blocks", e0)] == 40
    assert got[("vllm:hybrid_prefix_cache_usable_blocks", e0)] == 63


def test_collector_without_snapshots_exports_nothing(tmp_path):
    assert scrape(AdmissionCollector(tmp_path / "absent", "m")) == {}


@pytest.mark.parametrize("argv, named", [
    (["vllm", "serve", "M", "--scheduler-cls", "vllm_admission.AdmissionScheduler"], True),
    (["vllm", "serve", "M", "--scheduler-cls=vllm_admission.AdmissionScheduler"], True),
    (["vllm", "serve", "M", "--scheduler_cls", "vllm_admission.plugin.scheduler.X"], True),
    (["vllm", "serve", "M", "--scheduler-cls", "my.Scheduler"], False),
    (["vllm", "serve", "M", "--scheduler-cls"], False),
    (["script.py"], False),
])
def test_command_line_naming_the_scheduler(argv, named):
    from vllm_admission.plugin.boundary.register import names_admission_scheduler

    assert names_admission_scheduler(argv) is named


def test_register_sets_the_metrics_dir_and_refuses_bad_settings_for_the_server(monkeypatch, capsys):
    from vllm_admission.plugin.boundary import register as reg

    # register() sets the variable in os.environ: make monkeypatch restore it (a bare
    # delenv of an unset variable records nothing, and the value leaked into later tests).
    monkeypatch.setenv("VLLM_ADMISSION_METRICS_DIR", "")
    monkeypatch.delenv("VLLM_ADMISSION_METRICS_DIR")
    monkeypatch.setenv("VLLM_ADMISSION_POLICY", "vllm")
    reg.register()
    import os

    assert os.environ["VLLM_ADMISSION_METRICS_DIR"].endswith(f"vllm_admission-{os.getpid()}")

    monkeypatch.setenv("VLLM_ADMISSION_EVICTION", "belady")
    monkeypatch.setattr(reg.sys, "argv", ["vllm", "serve", "M", "--scheduler-cls",
                                          "vllm_admission.AdmissionScheduler"])
    with pytest.raises(SystemExit) as info:
        reg.register()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "vllm_admission: error: VLLM_ADMISSION_EVICTION='belady' is invalid; valid: ")

    # Not the server's command line: a warning only (the scheduler refuses later).
    monkeypatch.setattr(reg.sys, "argv", ["script.py"])
    reg.register()


# ---------------------------------------------------------------- nothing left behind (issue 21)
def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_snapshot_dirs_of_dead_processes_are_removed(tmp_path):
    import os

    from vllm_admission.plugin.metrics.prometheus import remove_stale_snapshot_dirs

    dead = _dead_pid()
    stale = tmp_path / f"vllm_admission-{dead}"
    StatsPublisher(stale, engine_index=0).publish(stats())
    (stale / f".engine-1.json.{dead}.tmp").write_text("{")  # a write the kill cut short
    live = tmp_path / f"vllm_admission-{os.getppid()}"   # a running process's directory
    StatsPublisher(live, engine_index=0).publish(stats())
    mine = tmp_path / f"vllm_admission-{os.getpid()}"
    StatsPublisher(mine, engine_index=0).publish(stats())
    foreign = tmp_path / f"vllm_admission-{_dead_pid()}"  # holds a file the plugin never writes
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    other = tmp_path / "vllm_admission-x"
    other.mkdir()

    assert remove_stale_snapshot_dirs(tmp_path) == [str(stale)]
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (live, mine, foreign, other))
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert remove_stale_snapshot_dirs(tmp_path / "absent") == []


_OWNER = """
import os, signal, sys, time
# Ctrl-C as in a shell: a test run started in the background without job control (bash,
# `pytest &`) hands its children SIGINT ignored, and Python then installs no handler for it.
signal.signal(signal.SIGINT, signal.default_int_handler)
from vllm_admission.plugin.boundary.register import register
from vllm_admission.plugin.metrics.prometheus import StatsPublisher
from vllm_admission.plugin.metrics.stats import AdmissionStats
register()
StatsPublisher.from_env().publish(AdmissionStats(active=True, admission="vllm", eviction="lru"))
print(os.environ["VLLM_ADMISSION_METRICS_DIR"], sorted(os.listdir(os.environ["VLLM_ADMISSION_METRICS_DIR"])),
      flush=True)
if sys.argv[1] == "sigint":
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: KeyboardInterrupt, then the exit handlers
    time.sleep(30)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "sigint"])
def test_the_process_that_names_the_metrics_dir_removes_it_when_it_ends(tmp_path, how):
    """The process whose general plugin named the directory (the API server of ``vllm serve``)
    removes it when it ends, also after Ctrl-C; the engine core that wrote the snapshot may
    have been killed without cleaning up (``tests/test_server.py`` stops a real server)."""
    import os
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_ADMISSION_METRICS_DIR"}
    env.update(TMPDIR=str(tmp_path), VLLM_ADMISSION_POLICY="vllm")
    proc = subprocess.run([sys.executable, "-c", _OWNER, how], env=env, capture_output=True,
                          text=True, timeout=120)
    # An uncaught KeyboardInterrupt ends Python by SIGINT again, after the exit handlers.
    assert proc.returncode == (0 if how == "exit" else -signal.SIGINT), proc.stderr[-2000:]
    directory = proc.stdout.split()[0]
    assert os.path.dirname(directory) == str(tmp_path)
    assert os.path.basename(directory).removeprefix("vllm_admission-").isdigit()
    assert "['engine-0.json']" in proc.stdout  # it was there while the process ran
    assert not os.path.exists(directory)
    assert list(tmp_path.iterdir()) == []
