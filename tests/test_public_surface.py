"""The names users and their tooling depend on: CLI options, environment variables, metrics.

Refactors must not rename these. Each list below is the published surface; changing one is
a deliberate, user-visible change that updates this file (and the user guide) with it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from vllm_admission.cli import build_parser

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_admission"

_SIMULATE = {
    "--admission", "--alpha", "--async-scheduling", "--auto-admissions", "--auto-interval", "--auto-margin",
    "--block-size",
    "--capacity",
    "--checkpoint", "--chunk-size", "--eviction", "--executor", "--help", "--hidden-states",
    "--host-admission", "--host-bandwidth", "--host-capacity", "--host-policy", "--jobs",
    "--mamba-ssm-cache-dtype", "--max-requests", "--model", "--no-progress", "--num-speculative-tokens",
    "--out", "--overlap-weight", "--outputs", "--pairs", "--prefix-cache-retention-interval", "--prefix-match-unit",
    "--ray-address", "--replica-flops", "--replicas", "--resample", "--retention-interval",
    "--router", "--seed", "--shadow-rate", "--trace", "--tune-grid", "-h",
}

CLI_OPTIONS = {
    "simulate": _SIMULATE,
    "demo": _SIMULATE,
    "make-tiny-model": {"--arch", "--help", "--max-model-len", "--mtp", "--seed", "--size", "-h"},
    "replay": {
        "--admission", "--alpha", "--eviction", "--help", "--host-admission", "--host-policy",
        "--kv-transfer-config", "--mamba-ssm-cache-dtype", "--max-model-len", "--max-num-batched-tokens",
        "--max-output-len", "--max-requests", "--model", "--mooncake-block-tokens", "--num-gpu-blocks",
        "--offload", "--out", "--prefix-cache-retention-interval", "--prefix-match-unit", "--seed",
        "--speculative-config", "--trace", "-h",
    },
    "fidelity": {
        "--admission", "--alpha", "--auto-interval", "--check", "--checkpoint", "--eviction", "--help",
        "--host-admission", "--host-policy", "--kv-transfer-config", "--mamba-ssm-cache-dtype",
        "--max-num-batched-tokens", "--max-output-len", "--max-prompt-tokens", "--max-requests", "--mode",
        "--model", "--mooncake-block-tokens", "--num-gpu-blocks", "--offload", "--out",
        "--prefix-cache-retention-interval", "--prefix-match-unit", "--seed", "--speculative-config",
        "--synthetic", "--time-scale", "--trace", "-h",
    },
}

ENV_VARS = {
    "VLLM_ADMISSION_ACTIVE", "VLLM_ADMISSION_ALPHA", "VLLM_ADMISSION_AUTO_ADMISSIONS",
    "VLLM_ADMISSION_AUTO_INTERVAL", "VLLM_ADMISSION_AUTO_MARGIN",
    "VLLM_ADMISSION_CHECKPOINT", "VLLM_ADMISSION_CPU_FIXES", "VLLM_ADMISSION_EVICTION",
    "VLLM_ADMISSION_HOST_ADMISSION", "VLLM_ADMISSION_LOG_INTERVAL", "VLLM_ADMISSION_METRICS_DIR",
    "VLLM_ADMISSION_POLICY", "VLLM_ADMISSION_SHADOW_NICE", "VLLM_ADMISSION_SHADOW_RATE", "VLLM_ADMISSION_TUNE_GRID",
    "VLLM_ADMISSION_TUNE_MULTIPLIER",
}

#: metric family -> (Prometheus type, label names of its samples)
METRICS = {
    **{f"vllm:hybrid_prefix_cache_{name}": ("counter", {"engine", "model_name"})
       for name in ("requests", "prompt_tokens", "junctions", "checkpoints", "superseded", "state_hits",
                    "tokens_saved", "host_tokens_saved", "state_miss_tokens", "prefill_steps",
                    "policy_switches")},
    "vllm:hybrid_prefix_cache_evictions": ("counter", {"engine", "model_name", "kind", "group"}),
    "vllm:hybrid_prefix_cache_policy": ("info", {"engine", "model_name", "active", "admission", "eviction",
                                                                  "auto"}),
    **{f"vllm:hybrid_prefix_cache_{name}": ("gauge", {"engine", "model_name"})
       for name in ("alpha", "free_blocks", "usable_blocks")},
}


def _subcommand_options() -> dict[str, set[str]]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: {o for action in p._actions for o in action.option_strings} for name, p in sub.choices.items()}


def test_cli_options_are_the_published_ones():
    assert _subcommand_options() == CLI_OPTIONS


def test_environment_variables_are_the_published_ones():
    """Every ``VLLM_ADMISSION_*`` name the package reads or sets, found in its source."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        found |= set(re.findall(r"[\"'](VLLM_ADMISSION_[A-Z_]+)[\"']", path.read_text()))
    assert found == ENV_VARS


def test_metric_names_and_labels_are_the_published_ones(tmp_path):
    pytest.importorskip("prometheus_client")
    from vllm_admission.plugin.metrics.prometheus import AdmissionCollector, StatsPublisher
    from vllm_admission.plugin.metrics.stats import AdmissionStats

    stats = AdmissionStats(active=True, admission="marconi", eviction="flop", alpha=0.5, adaptive=True,
                           evictions_by_group={"state0": 3, "attention1": 8})
    StatsPublisher(tmp_path, engine_index=0).publish(stats)
    got = {fam.name: (fam.type, {label for s in fam.samples for label in s.labels})
           for fam in AdmissionCollector(tmp_path, "m").collect()}
    assert got == METRICS
