"""vLLM's ``prefix_match_unit`` below the block size on the CPU engine (issue 31).

Both tiny models, a 32-token hash block size: stock vLLM, and the plugin with ``marconi``, ``block``,
``dense`` and ``auto``, serve the same prompts one at a time. Greedy outputs are the same
model output everywhere (tests/model_output.py: greedy tokens and logits within rounding, since
the policies cut the prompts into other prefill passes); each run's cached tokens are what the
core's cache model predicts for that policy under the same unit (docs/engine-facts.md section
10), and on the junction case every policy hits at least what stock vLLM hits.
"""

from __future__ import annotations

import random

import pytest
from block_hashes import chained_hashes
from engine_cases import predicted_block_size
from model_output import assert_same_output, greedy_one_at_a_time

pytestmark = pytest.mark.engine

UNIT = 32
SSM_DTYPE = "float32"
OUTPUT = 8
POLICIES = (("marconi", "lru"), ("dense", "lru"), ("block", "lru"), ("auto", "auto"))


def _prompts(vocab: int = 512) -> list[list[int]]:
    """Four junction siblings (1,500 shared tokens, one distinct, 300 shared), then a
    300-token prompt three times and a 1,000-token one twice (hits inside a block)."""
    rng = random.Random(7)

    def draw(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    prefix, suffix = draw(1500), draw(300)
    siblings = [prefix + draw(1) + suffix for _ in range(4)]
    short, longer = draw(300), draw(1000)
    return siblings + [short] * 3 + [longer] * 2


def _run(model, scheduler: str | None, env: dict) -> list:
    from vllm_admission.engine.llm import engine_geometry

    def unit_is_set(llm):
        assert engine_geometry(llm).prefix_match_unit == UNIT

    return greedy_one_at_a_time(model, scheduler, env, engine_args={"prefix_match_unit": UNIT},
                                prompts=_prompts(), max_tokens=OUTPUT, ssm_dtype=SSM_DTYPE,
                                check=unit_is_set)


def _predicted(policy: str, block_size: int) -> list[int]:
    """The core's hits for the prompts under ``policy`` (``auto`` starts as stock and
    decides only after 50 requests) with the engine's layout: one Mamba and two
    attention groups, room to spare."""
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.eviction import get_eviction
    from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec

    layout = CacheLayout(PoolSpec(num_blocks=4096, block_size=block_size,
                                  group_kinds=("state", "attention", "attention"), hash_block_size=UNIT),
                         SchedulingSpec(chunk_size=8192))
    cache = HybridPrefixCache(layout, admission=get_admission("vllm" if policy == "auto" else policy),
                              eviction=get_eviction("lru"))
    return [cache.serve(chained_hashes(p, block_size), len(p), OUTPUT, r, float(r),
                        chained_hashes(p, UNIT)).hit_tokens
            for r, p in enumerate(_prompts())]


@pytest.mark.parametrize("arch", ["qwen3-next", "nemotron-h"])
def test_every_admission_runs_under_a_sub_block_unit_as_the_core_predicts(arch, tiny_model_of,
                                                                          engine_env):
    model = tiny_model_of(arch)
    B = predicted_block_size(model, SSM_DTYPE)
    stock = _run(model, None, {})
    assert [o.cached for o in stock] == _predicted("vllm", B)
    # The unit gave hits inside a block (300 tokens: 288; 1,000: 992 at every block size).
    assert stock[5].cached == (300 - 1) // UNIT * UNIT
    assert stock[8].cached == (1000 - 1) // UNIT * UNIT
    for policy, eviction in POLICIES:
        plugin = _run(model, "vllm_admission.AdmissionScheduler",
                      {"VLLM_ADMISSION_POLICY": policy, "VLLM_ADMISSION_EVICTION": eviction})
        cached = [o.cached for o in plugin]
        assert_same_output(stock, plugin, label=policy)
        assert cached == _predicted(policy, B), policy
        # The junction case: every policy hits at least what stock does.
        assert all(c >= s.cached for c, s in zip(cached[:4], stock[:4], strict=True)), policy
