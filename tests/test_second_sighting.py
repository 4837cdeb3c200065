"""A prompt sent twice hits on its second sighting, with the engine core in its own process.

vLLM 0.32's engine core, when it runs in a process of its own (``LLM``'s default and
``vllm serve``), re-runs ``VllmConfig.__post_init__`` after its start-up handshake, and the
CPU platform's config check then resets the scheduler's block size to 128 while the KV
cache keeps the hybrid-aligned one (256 for the tiny Qwen3-Next with a float32 state).
Chunks are then cut on 128-token boundaries, the prompt-end state is never written, and
the second sighting misses (docs/engine-facts.md, section 11). The plugin's CPU fixes keep
the block size (``plugin/repairs/cpu_block_size.py``); these tests run the same three
sends with and without them, in a fresh interpreter each (the engine core is spawned).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from engine_cases import env_without_vllm

pytestmark = pytest.mark.engine

SCRIPT = r"""
import json, random, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], enable_prefix_caching=True, dtype="bfloat16",
              skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.5,
              max_model_len=8192, mamba_ssm_cache_dtype="float32")
    B = llm.llm_engine.vllm_config.cache_config.block_size
    rng = random.Random(1)
    prompt = [rng.randrange(10, 250) for _ in range(14 * B + 156)]
    cached = []
    for _ in range(3):
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                           SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                           use_tqdm=False)
        cached.append(out[0].num_cached_tokens)
    print("RESULT " + json.dumps({"block_size": B, "prompt_len": len(prompt), "cached": cached}),
          flush=True)
"""


def sends(model_dir, **env: str) -> dict:
    """Three sends of one prompt through an ``LLM`` whose engine core runs in its own process."""
    full = env_without_vllm(VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_CPU_KVCACHE_SPACE="1", **env)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model_dir)], env=full,
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("RESULT "):])


def test_the_second_sighting_hits_with_the_block_size_kept(tiny_model_dir):
    got = sends(tiny_model_dir, VLLM_ADMISSION_CPU_FIXES="1")
    B, P = got["block_size"], got["prompt_len"]  # noqa: N806
    assert B > 128, "a float32 state must give a block above the CPU default for this to test"
    end = (P - 1) // B * B   # the prompt's last reusable block boundary
    assert got["cached"] == [0, end, end]


def test_without_the_fix_vllm_needs_a_third_sighting(tiny_model_dir):
    """The failure the fix removes, on a stock engine without the plugin (``VLLM_PLUGINS``
    empty): the second sighting finds the KV but no state, so it becomes a junction."""
    got = sends(tiny_model_dir, VLLM_PLUGINS="")
    B, P = got["block_size"], got["prompt_len"]  # noqa: N806
    assert B > 128
    assert got["cached"] == [0, 0, (P - 1) // B * B]
