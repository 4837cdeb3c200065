"""MTP speculative decoding on vLLM's CPU engine (issue 31; docs/engine-facts.md section 9).

vLLM 0.32's CPU build loads MTP drafters for hybrid models but lacks the state kernels
drafts need; ``vllm_admission.plugin.repairs.cpu_spec_decode`` supplies them. With them the tiny
models (``make-tiny-model --mtp``) serve with MTP and prefix caching: stock vLLM, and the
plugin in every setting the preflight lets run there, give the same greedy tokens and the
same cached tokens; the settings it cannot run yet are refused before the model loads.
"""

from __future__ import annotations

import pytest
from model_output import assert_same_output, greedy_one_at_a_time, route_to_every_expert

pytestmark = pytest.mark.engine

MTP = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}


def _prompts(vocab: int = 512) -> list[list[int]]:
    """Four 600-token prompts over one 512-token prefix, then the first one again."""
    import random

    rng = random.Random(0)
    prefix = [rng.randrange(3, vocab) for _ in range(512)]
    prompts = [prefix + [rng.randrange(3, vocab) for _ in range(88)] for _ in range(4)]
    return prompts + [prompts[0]]


def _junction_prompts(vocab: int = 512) -> list[list[int]]:
    """Four siblings sharing 1,500 tokens (one distinct token, then 300 shared), a
    300-token prompt twice and one of exactly three blocks of 256 twice."""
    import random

    rng = random.Random(3)

    def draw(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    prefix, suffix, short, aligned = draw(1500), draw(300), draw(300), draw(768)
    return [prefix + draw(1) + suffix for _ in range(4)] + [short] * 2 + [aligned] * 2


def _run(model, scheduler: str | None, engine_args: dict, env: dict, prompts=None,
         max_tokens: int = 24) -> list:
    return greedy_one_at_a_time(model, scheduler, env, engine_args=engine_args,
                                prompts=_prompts() if prompts is None else prompts,
                                max_tokens=max_tokens)


def _predicted(policy: str, block_size: int, prompts, output: int) -> list[int]:
    """The core's hits under EAGLE/MTP with one draft token, room to spare."""
    from block_hashes import chained_hashes

    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.eviction import get_eviction
    from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec, SpeculationSpec

    layout = CacheLayout(PoolSpec(num_blocks=4096, block_size=block_size,
                                  group_kinds=("state", "attention", "attention")),
                         SchedulingSpec(chunk_size=8192), SpeculationSpec(num_speculative_tokens=1))
    cache = HybridPrefixCache(layout, admission=get_admission(policy), eviction=get_eviction("lru"))
    return [cache.serve(chained_hashes(p, block_size), len(p), output, r, float(r)).hit_tokens
            for r, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory, request):
    from vllm_admission.engine.tiny_model import make_tiny_model

    return route_to_every_expert(
        make_tiny_model(tmp_path_factory.mktemp("tiny_mtp"), arch=request.param, mtp=True))


@pytest.mark.parametrize("mtp_model", ["qwen3-next", "nemotron-h"], indirect=True)
def test_mtp_runs_on_the_cpu_engine_and_the_plugin_changes_nothing(mtp_model, engine_env):
    """Stock vLLM with MTP, the plugin (stock pair, ``auto``+``auto`` narrowed to it) with
    MTP: the same greedy tokens and cached tokens, request by request; later prompts hit
    the shared prefix. With MTP vLLM drops the last matched block (EAGLE's rule), so the
    same prompts without MTP hit one block more."""
    stock = _run(mtp_model, None, MTP, {})
    assert all(len(o.tokens) == 24 for o in stock)
    for policy, eviction in (("vllm", "lru"), ("auto", "auto")):
        plugin = _run(mtp_model, "vllm_admission.AdmissionScheduler", MTP,
                      {"VLLM_ADMISSION_POLICY": policy, "VLLM_ADMISSION_EVICTION": eviction})
        # Stock's decisions: the same computation, so the same bytes.
        assert_same_output(stock, plugin, exact=True, label=(policy, eviction))
    plain = _run(mtp_model, None, {}, {})
    # Drafts verified by the target give the target's greedy output: the run without MTP
    # computes in other passes (a draft verified per step), so within rounding
    # (tests/model_output.py; bf16 ties between two candidates, docs/engine-facts.md
    # section 9). Without the CPU conv fix the Mamba2 model parts from the first decode step.
    assert_same_output(plain, stock, decode_differs=True, label="MTP against none")
    cached_mtp = [o.cached for o in stock]
    cached_plain = [o.cached for o in plain]
    assert cached_mtp[0] == 0 and all(c > 0 for c in cached_mtp[2:])
    assert all(p > m for p, m in zip(cached_plain[2:], cached_mtp[2:], strict=True))


@pytest.mark.parametrize("mtp_model", ["qwen3-next", "nemotron-h"], indirect=True)
def test_every_admission_runs_under_mtp_as_the_core_predicts(mtp_model, engine_env):
    """MTP with one draft token: ``marconi``, ``dense``, ``last`` and ``auto`` run, give
    stock's model output (tests/model_output.py: their prefill passes differ from stock's)
    and the hits the core predicts under
    EAGLE's rules (the lookup's dropped block, prompt checkpoints a block lower); on the
    junction case every policy that keeps junctions hits at least what stock does."""
    from engine_cases import predicted_block_size

    B = predicted_block_size(mtp_model, "float32")
    prompts, output = _junction_prompts(), 8
    stock = _run(mtp_model, None, MTP, {}, prompts, output)
    assert [o.cached for o in stock] == _predicted("vllm", B, prompts, output)
    for policy, eviction in (("marconi", "lru"), ("dense", "lru"), ("last", "lru"),
                             ("auto", "auto")):
        plugin = _run(mtp_model, "vllm_admission.AdmissionScheduler", MTP,
                      {"VLLM_ADMISSION_POLICY": policy, "VLLM_ADMISSION_EVICTION": eviction},
                      prompts, output)
        cached = [o.cached for o in plugin]
        assert_same_output(stock, plugin, label=policy)
        assert [len(o.tokens) for o in plugin] == [output] * len(prompts)
        assert cached == _predicted("vllm" if policy == "auto" else policy, B, prompts,
                                    output), policy
        if policy != "last":  # last keeps no junction state, by design
            assert all(c >= s.cached for c, s in zip(cached[:4], stock[:4], strict=True)), policy


@pytest.mark.parametrize("mtp_model", ["qwen3-next"], indirect=True)
def test_mtp_with_a_finer_hash_unit_runs_every_policy(mtp_model, engine_env):
    """MTP together with ``prefix_match_unit=32`` (vLLM then drops one hash block, not a
    block): every admission, with an eviction that hears block keys, runs without
    refusal, gives stock's greedy tokens under the same settings, and on the junction
    case hits at least what stock does where it keeps junctions. (That each request's
    hit is the simulator's: ``tests/test_fidelity_units.py``.)"""
    args = {**MTP, "prefix_match_unit": 32}
    prompts, output = _junction_prompts(), 8
    stock = _run(mtp_model, None, args, {}, prompts, output)
    assert sum(o.cached for o in stock) > 0
    for policy, eviction in (("marconi", "s3fifo"), ("dense", "reuse"), ("last", "lru"),
                             ("auto", "auto")):
        plugin = _run(mtp_model, "vllm_admission.AdmissionScheduler", args,
                      {"VLLM_ADMISSION_POLICY": policy, "VLLM_ADMISSION_EVICTION": eviction},
                      prompts, output)
        assert_same_output(stock, plugin, label=policy)
        if policy != "last":  # last keeps no junction state, by design
            assert all(p.cached >= s.cached
                       for p, s in zip(plugin[:4], stock[:4], strict=True)), policy
