"""The simulator against what vLLM's GPU engine did, from the recorded H200 run.

``benchmarks/results/gpu/engine-h200-all.json`` is ``benchmarks/gpu/engine_check.py``'s
report from an H200 (vLLM 0.32, async scheduling): for both tiny models and five policy
pairs, every request's hit tokens and prefill steps as the engine served them. These tests
rebuild the engine's geometry from the record, replay the same synthetic workload through
:func:`~vllm_admission.fidelity.twin.simulate_like_engine` here, on the CPU, and ask
for the engine's numbers request for request. No GPU is needed: the record is the GPU's.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from vllm_admission.engine.engine_geometry import EngineGeometry, KVCacheGroupInfo
from vllm_admission.engine.tiny_model import make_tiny_model
from vllm_admission.fidelity.runner import load_trace_of
from vllm_admission.fidelity.spec import FidelitySpec
from vllm_admission.fidelity.twin import costs_like_engine, simulate_like_engine

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "gpu" / "engine-h200-all.json"
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
import engine_check  # noqa: E402  (the check script's own workload and pairs)

#: vLLM 0.32 declares a prefill-checkpoint export on Mamba2 layers
#: (``mamba_mixer2.py``, ``num_prefill_checkpoint_blocks=1``) and on no Gated DeltaNet
#: layer with the Triton prefill backend, and the GPU platform keeps the declaration.
#: The record predates the geometry's ``prompt_end_export`` field, so it is stated here.
EXPORTS_ON_GPU = {"nemotron-h": True, "qwen3-next": False}


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_model(root / arch, arch=arch) / "config.json"
            for arch in engine_check.MODELS}


def _geometry(record: dict, arch: str, pair: dict, prompt_end_export: bool) -> EngineGeometry:
    stock = dict(record["steps"][f"{arch}/stock"]["result"]["geometry"])
    groups = tuple(KVCacheGroupInfo(kind=g["kind"], num_layers=g["num_layers"],
                                    block_size=g["block_size"],
                                    page_size_bytes=g["page_size_bytes"],
                                    layers=tuple(g["layers"]))
                   for g in stock.pop("kv_cache_groups"))
    geometry = EngineGeometry(**stock, kv_cache_groups=groups)
    return dataclasses.replace(
        geometry, num_gpu_blocks=pair["num_blocks"], max_model_len=pair["max_model_len"],
        mamba_ssm_cache_dtype=pair["mamba_ssm_cache_dtype"], dtype="bfloat16",
        prompt_end_export=prompt_end_export)


def _replay(record: dict, configs: dict[str, Path], arch: str, pair: dict,
            prompt_end_export: bool):
    geometry = _geometry(record, arch, pair, prompt_end_export)
    costs = costs_like_engine(configs[arch], geometry)
    spec = FidelitySpec(model=str(configs[arch].parent), trace="synthetic",
                        pairs=((pair["admission"], pair["eviction"]),),
                        max_output_len=engine_check.MAX_OUTPUT_LEN,
                        synthetic=dict(record["settings"]["workload"]))
    trace = load_trace_of(spec)
    return simulate_like_engine(trace, costs, geometry, admission=pair["admission"],
                                eviction=pair["eviction"], alpha=None)


CASES = [(arch, a, e) for arch in engine_check.MODELS for a, e in engine_check.PAIRS]


@pytest.mark.parametrize(("arch", "admission", "eviction"), CASES,
                         ids=[f"{c[0]}-{c[1]}+{c[2]}" for c in CASES])
def test_the_simulator_predicts_the_gpu_engine_request_for_request(record, configs, arch,
                                                                   admission, eviction):
    pair = record["steps"][f"{arch}/{admission}+{eviction}"]["result"]
    engine = pair["per_request"]
    assert pair["engine"]["evictions"] > 0        # the workload evicts
    sim = _replay(record, configs, arch, pair, EXPORTS_ON_GPU[arch])
    assert list(sim.per_request_hits) == engine["engine"]
    assert list(sim.per_request_prefill_steps) == engine["engine_prefill_steps"]
    assert sim.evictions == pair["engine"]["evictions"]
    assert sim.state_checkpoints == pair["engine"]["state_checkpoints"]


def test_without_the_export_mamba2_prefills_are_mispredicted(record, configs):
    """What the recorded run showed before the setting: the same hits, but a prompt-end
    chunk stop the GPU engine never made."""
    pair = record["steps"]["nemotron-h/vllm+lru"]["result"]
    engine = pair["per_request"]
    sim = _replay(record, configs, "nemotron-h", pair, prompt_end_export=False)
    assert list(sim.per_request_hits) == engine["engine"]
    assert sum(sim.per_request_prefill_steps) > sum(engine["engine_prefill_steps"])
