"""The plugin's environment variables: parsing, error lines, registration with vLLM."""

from __future__ import annotations

import logging

import pytest

from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES
from vllm_admission.plugin.env import (
    ENV_VARS,
    Settings,
    SettingsError,
)


def test_defaults():
    cfg = Settings.from_env({})
    assert cfg == Settings(admission="vllm", eviction="lru", alpha=None, log_interval=10.0,
                           tune_multiplier=5, tune_grid="coarse")
    assert cfg.describe() == "admission=vllm eviction=lru"


def test_every_valid_value():
    for policy in ADMISSION_POLICIES:
        assert Settings.from_env({"VLLM_ADMISSION_POLICY": policy}).admission == policy
    cfg = Settings.from_env({
        "VLLM_ADMISSION_POLICY": " marconi ", "VLLM_ADMISSION_EVICTION": "flop",
        "VLLM_ADMISSION_ALPHA": "0.25", "VLLM_ADMISSION_LOG_INTERVAL": "0",
        "VLLM_ADMISSION_TUNE_MULTIPLIER": "3", "VLLM_ADMISSION_TUNE_GRID": "paper"})
    assert cfg == Settings(admission="marconi", eviction="flop", alpha=0.25, log_interval=0.0,
                           tune_multiplier=3, tune_grid="paper")
    assert cfg.describe() == "admission=marconi eviction=flop alpha=0.25"
    assert Settings.from_env({"VLLM_ADMISSION_EVICTION": "flop"}).describe().endswith(
        "alpha=tuned online")
    auto = Settings.from_env({"VLLM_ADMISSION_POLICY": "auto",
                                     "VLLM_ADMISSION_AUTO_INTERVAL": "8"})
    assert auto.auto.interval == 8
    assert auto.describe() == "admission=auto eviction=lru decisions every 8 requests"
    assert auto.auto.shadow_rate is None
    sampled = Settings.from_env({"VLLM_ADMISSION_POLICY": "auto",
                                        "VLLM_ADMISSION_SHADOW_RATE": "0.125"})
    assert sampled.auto.shadow_rate == 0.125 and sampled.describe().endswith("shadow rate 0.125")
    assert Settings.from_env({"VLLM_ADMISSION_SHADOW_RATE": "auto"}).auto.shadow_rate is None
    assert auto.auto.margin == 0.0
    margin = Settings.from_env({"VLLM_ADMISSION_POLICY": "auto",
                                       "VLLM_ADMISSION_AUTO_MARGIN": "0.3"})
    assert margin.auto.margin == 0.3 and margin.describe().endswith("margin 0.3")
    assert auto.auto.admissions is None
    chosen = Settings.from_env({"VLLM_ADMISSION_POLICY": "auto",
                                       "VLLM_ADMISSION_AUTO_ADMISSIONS": " vllm, written "})
    assert chosen.auto.admissions == ("vllm", "written")
    assert chosen.describe().endswith("admissions vllm,written")
    assert auto.auto.shadow_nice == 19
    niced = Settings.from_env({"VLLM_ADMISSION_POLICY": "auto",
                                      "VLLM_ADMISSION_SHADOW_NICE": "0"})
    assert niced.auto.shadow_nice == 0 and niced.describe().endswith("shadow nice 0")
    inpass = Settings.from_env({"VLLM_ADMISSION_CHECKPOINT": "inpass"})
    assert inpass.checkpoint == "inpass" and inpass.wants_changes()
    assert inpass.describe() == "admission=vllm eviction=lru checkpoint=inpass"
    assert Settings.from_env({"VLLM_ADMISSION_CHECKPOINT": "split"}) == Settings()


def test_empty_values_mean_unset():
    assert Settings.from_env({name: "" for name in ENV_VARS}) == Settings()


@pytest.mark.parametrize("name,value,valid", [
    ("VLLM_ADMISSION_POLICY", "Marconi", f"valid: {', '.join(ADMISSION_POLICIES)}"),
    ("VLLM_ADMISSION_EVICTION", "belady", f"valid: {', '.join(ENGINE_EVICTION_POLICIES)}"),
    ("VLLM_ADMISSION_ALPHA", "nan", "finite number >= 0"),
    ("VLLM_ADMISSION_ALPHA", "-0.1", "finite number >= 0"),
    ("VLLM_ADMISSION_LOG_INTERVAL", "soon", "seconds"),
    ("VLLM_ADMISSION_TUNE_MULTIPLIER", "0", "an integer >= 1"),
    ("VLLM_ADMISSION_TUNE_MULTIPLIER", "2.5", "an integer >= 1"),
    ("VLLM_ADMISSION_TUNE_GRID", "fine", "valid: coarse, paper"),
    ("VLLM_ADMISSION_AUTO_INTERVAL", "0", "an integer >= 1"),
    ("VLLM_ADMISSION_AUTO_INTERVAL", "every 10", "an integer >= 1"),
    ("VLLM_ADMISSION_CHECKPOINT", "fused", "valid: split, inpass"),
    ("VLLM_ADMISSION_SHADOW_RATE", "0", "a number in (0, 1]"),
    ("VLLM_ADMISSION_SHADOW_RATE", "half", "a number in (0, 1]"),
    ("VLLM_ADMISSION_AUTO_MARGIN", "-0.1", "a finite number >= 0"),
    ("VLLM_ADMISSION_AUTO_MARGIN", "inf", "a finite number >= 0"),
    ("VLLM_ADMISSION_AUTO_MARGIN", "30%", "a finite number >= 0"),
    ("VLLM_ADMISSION_AUTO_ADMISSIONS", "vllm,nope", f"from {', '.join(ADMISSION_POLICIES)}"),
    ("VLLM_ADMISSION_AUTO_ADMISSIONS", "vllm,vllm", "each once"),
    ("VLLM_ADMISSION_AUTO_ADMISSIONS", "auto", "admission policy names"),
    ("VLLM_ADMISSION_SHADOW_NICE", "20", "an integer from 0 to 19"),
    ("VLLM_ADMISSION_SHADOW_NICE", "-5", "an integer from 0 to 19"),
    ("VLLM_ADMISSION_SHADOW_NICE", "low", "an integer from 0 to 19"),
])
def test_invalid_values_give_one_line(name, value, valid):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{name}={value!r} is invalid; ")
    assert valid in msg
    assert isinstance(info.value, ValueError)


def test_auto_admissions_need_auto_admission():
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"VLLM_ADMISSION_AUTO_ADMISSIONS": "vllm,written"})
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("VLLM_ADMISSION_AUTO_ADMISSIONS=vllm,written names")
    assert "VLLM_ADMISSION_POLICY=vllm" in msg and "VLLM_ADMISSION_POLICY=auto" in msg


def test_long_values_are_shortened_in_the_message():
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"VLLM_ADMISSION_POLICY": "x" * 500})
    assert len(str(info.value)) < 200


def test_register_makes_vllm_accept_the_variables(monkeypatch):
    pytest.importorskip("vllm")
    import vllm.envs as envs
    from vllm.platforms import current_platform

    from vllm_admission.plugin.boundary.register import register

    for name in ENV_VARS:
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("VLLM_ADMISSION_POLICY", "marconi")
    register()
    register()  # idempotent
    for name in ENV_VARS:
        assert name in envs.environment_variables
        assert envs.environment_variables[name]() is None  # never in the compile cache key
    current_platform.validate_environ(hard_fail=True)  # strict validation: no error
    monkeypatch.setenv("VLLM_ADMISSION_TYPO", "1")      # an unknown one still fails
    with pytest.raises(ValueError, match="VLLM_ADMISSION_TYPO"):
        current_platform.validate_environ(hard_fail=True)


def test_register_warns_once_about_an_invalid_value(monkeypatch, caplog):
    pytest.importorskip("vllm")
    from vllm_admission.plugin.boundary.register import register

    monkeypatch.setenv("VLLM_ADMISSION_EVICTION", "belady")
    monkeypatch.setenv("VLLM_ADMISSION_METRICS_DIR", "")  # register() names it: restored after
    logger = logging.getLogger("vllm_admission")
    logger.addHandler(caplog.handler)  # the plugin may route its lines through vLLM's handler
    try:
        with caplog.at_level(logging.WARNING, logger="vllm_admission"):
            register()
    finally:
        logger.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records if r.name == "vllm_admission"}  # (seen twice)
    lines = [r.getMessage() for r in records.values()]
    assert len(lines) == 1 and "VLLM_ADMISSION_EVICTION='belady' is invalid" in lines[0]


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("vllm_admission") == "vllm_admission.plugin.boundary.register:register"


def test_scheduler_is_exported_lazily():
    import vllm_admission

    assert "AdmissionScheduler" in vllm_admission.__all__
    pytest.importorskip("vllm")
    from vllm_admission.plugin.scheduler import AdmissionScheduler

    assert vllm_admission.AdmissionScheduler is AdmissionScheduler


_PROBE = """
import json, os
import vllm.plugins
vllm.plugins.load_general_plugins()
import vllm.envs as envs
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.v1.worker.mamba_utils import MambaSpecDecodeGPUContext
from vllm.v1.worker import gpu_model_runner
print(json.dumps({
    "create_engine_config": hasattr(EngineArgs.create_engine_config, "_admission_original"),
    "mamba2_spec": hasattr(MambaMixer2.get_kv_cache_spec, "_admission_original"),
    "spec_decode": hasattr(MambaSpecDecodeGPUContext.run_fused_precopy, "_admission_original"),
    "block_copy": hasattr(gpu_model_runner.copy_kv_cache_blocks_inplace, "_admission_original"),
    "env_vars": "VLLM_ADMISSION_POLICY" in envs.environment_variables,
    "environ": sorted(k for k in os.environ if k.startswith("VLLM_ADMISSION_")),
}))
"""


@pytest.mark.parametrize("setting, expected", [
    ({}, {"create_engine_config": False, "mamba2_spec": False, "spec_decode": False,
          "block_copy": False, "env_vars": False, "environ": []}),
    ({"VLLM_ADMISSION_CPU_FIXES": "1"},
     {"create_engine_config": False, "mamba2_spec": True, "spec_decode": True,
      "block_copy": True, "env_vars": True, "environ": ["VLLM_ADMISSION_CPU_FIXES"]}),
    ({"VLLM_ADMISSION_POLICY": "vllm"},
     {"create_engine_config": True, "mamba2_spec": True, "spec_decode": True,
      "block_copy": True, "env_vars": True,
      "environ": ["VLLM_ADMISSION_ACTIVE", "VLLM_ADMISSION_METRICS_DIR",
                  "VLLM_ADMISSION_POLICY"]}),
], ids=["not-asked", "cpu-fixes-only", "asked"])
@pytest.mark.slow
def test_installing_the_package_changes_no_vllm_behaviour_until_asked(setting, expected):
    """vLLM loads the general plugin in every process. Without the AdmissionScheduler on the
    command line and without a plugin setting, vLLM's classes and methods stay its own and
    nothing is written to the environment (issue 34); vLLM's fixes alone on request; all
    of it where the plugin is asked for (on vLLM's CPU platform, where this suite runs)."""
    pytest.importorskip("vllm")
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_ADMISSION_")}
    env.pop("VLLM_PLUGINS", None)
    env.update(setting)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected
