"""The prepared GPU run (``benchmarks/gpu/engine_check.py``) rehearsed on vLLM's CPU engine:
every step it takes on the GPU machine but ``vllm serve`` (which ``tests/test_server.py``
covers here) runs here first, on the tiny Qwen3-Next, so GPU minutes are not spent on its
bugs. The report must show what the GPU run is to show: per-request hits and prefill steps
equal to the simulator's in a pool that evicts, the check prompts' output equal to stock
vLLM's, in-pass checkpoints with split mode's hits and outputs in fewer passes, and TTFT
figures for every case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "engine_check.py"


@pytest.mark.engine
def test_the_gpu_check_runs_on_the_cpu_engine(tmp_path):
    out = tmp_path / "check.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu",
                          "--models", "qwen3-next", "--pairs", "vllm+lru,dense+lru",
                          "--no-serve"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, check=False)
    assert out.exists(), run.stderr[-3000:]
    doc = json.loads(out.read_text())
    bad = {n: s.get("error") for n, s in doc["steps"].items() if s["status"] != "ok"}
    assert not bad and run.returncode == 0, (bad, run.stderr[-3000:])
    pairs = {"qwen3-next/vllm+lru", "qwen3-next/dense+lru"}
    assert set(doc["summary"]) == pairs | {"qwen3-next/inpass-vllm", "qwen3-next/inpass-dense"}
    for name in pairs:
        row = doc["summary"][name]
        assert row["requests"] == 24, name
        assert row["requests_differing"] == 0 and row["prefill_steps_differing"] == 0, name
        assert row["evictions"][0] == row["evictions"][1] > 0, name
        assert row["state_checkpoints"][0] == row["state_checkpoints"][1], name
        assert row["same_as_stock"] is True, name
    # dense keeps a state at every block: more checkpoints than vLLM's own admission.
    assert (doc["summary"]["qwen3-next/dense+lru"]["state_checkpoints"][0]
            > doc["summary"]["qwen3-next/vllm+lru"]["state_checkpoints"][0])
    stock = doc["steps"]["qwen3-next/stock"]["result"]
    assert [o["cached"] for o in stock["outputs"]][0] == 0
    # Split against in-pass: the same hits and outputs, every state compared, fewer passes.
    for admission in ("vllm", "dense"):
        row = doc["summary"][f"qwen3-next/inpass-{admission}"]
        assert row["hits_equal"] and row["outputs_equal"], admission
        split_passes, inpass_passes = row["prefill_passes"]
        assert inpass_passes < split_passes, admission
        compared, states = row["states_bit_identical"][1], doc["steps"][
            f"qwen3-next/inpass-{admission}"]["result"]["states"]
        assert compared == states["split"] == states["inpass"] > 0, admission
    ttft = doc["steps"]["qwen3-next/ttft"]["result"]
    assert set(ttft) == {"stock", "vllm/split", "vllm/inpass", "dense/split", "dense/inpass"}
    assert all(r["requests"] == 24 and r["p50_s"] > 0 for r in ttft.values())
    for admission in ("vllm", "dense"):
        assert ttft[f"{admission}/split"]["hit_tokens"] == ttft[f"{admission}/inpass"]["hit_tokens"]
        assert ttft[f"{admission}/inpass"]["prefill_steps"] < ttft[f"{admission}/split"]["prefill_steps"]


def test_a_malformed_pair_is_refused_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"),
                          "--pairs", "vllm"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode != 0
    assert "a pair is ADMISSION+EVICTION, got 'vllm'" in run.stderr
    assert "Traceback" not in run.stderr
