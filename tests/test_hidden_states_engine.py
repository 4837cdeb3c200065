"""vLLM's hidden-state cache under the plugin, with a KV connector, on the CPU engine (issue 32).

``speculative_config={"method": "extract_hidden_states"}`` gives a hybrid model a third
kind of KV cache group: per-token hidden states (``HiddenStateCacheSpec``), written out
per finished request by vLLM's hidden-states connector (on CPU through
``vllm_admission.plugin.repairs.cpu_hidden_states``, which changes only the device copy).
So one engine has attention, recurrent-state and hidden-state groups, and a KV connector
that drives the scheduler and holds a finished request's blocks until its file is
written. Here every admission policy, and ``auto``, runs there: stock's output (greedy
tokens and logits within rounding, tests/model_output.py),
at least stock's cached tokens on the junction case, the hits the core predicts with a
hidden-state group (``HybridPrefixCache`` group kind ``"hidden"``), and hidden states
read back from the connector's files that equal those of a cold run of the same prompt.
"""

from __future__ import annotations

import pytest
from model_output import (
    LOGITS_MODE,
    assert_same_output,
    route_to_every_expert,
    serve_one_at_a_time,
)

pytestmark = pytest.mark.engine

#: The hidden states of layer 1 go to the cache (vLLM's ``eagle_aux_hidden_state_layer_ids``).
HIDDEN = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
          "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1]}}}


def _prompts(vocab: int = 512) -> list[list[int]]:
    """Four siblings sharing 1,500 tokens (one distinct token, then 300 shared), a
    300-token prompt twice and one of exactly three blocks of 256 twice (the junction
    case of ``test_mtp_engine.py``)."""
    import random

    rng = random.Random(3)

    def draw(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    prefix, suffix, short, aligned = draw(1500), draw(300), draw(300), draw(768)
    return [prefix + draw(1) + suffix for _ in range(4)] + [short] * 2 + [aligned] * 2


def _serve(model, scheduler: str | None, env: dict, prompts, store, max_tokens: int = 8,
           check=None):
    """Serve ``prompts`` one at a time with the hidden-states connector writing under
    ``store``; returns ``(model_output.Output, hidden states, token ids)`` per prompt.
    The connector writes a request's file one engine step after it finishes, so a last
    one-token request flushes the final file before they are read."""
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        load_hidden_states,
    )
    from vllm.inputs import TokensPrompt

    from vllm_admission.engine.llm import EngineSettings, build_llm, shutdown_llm
    from vllm_admission.plugin.repairs.cpu_hidden_states import hidden_states_connector_config

    args = {**LOGITS_MODE, "speculative_config": HIDDEN,
            "kv_transfer_config": hidden_states_connector_config(store)}
    settings = EngineSettings(model=str(model), scheduler_cls=scheduler, max_model_len=4096,
                              mamba_ssm_cache_dtype="float32", engine_args=args,
                              env={"VLLM_PLUGINS": "" if scheduler is None else None, **env})
    llm = build_llm(settings)
    try:
        served = [(output, o.kv_transfer_params["hidden_states_path"])
                  for output, o in serve_one_at_a_time(llm, prompts, max_tokens)]
        llm.generate([TokensPrompt(prompt_token_ids=[5] * 8)],
                     SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
        if check is not None:
            check(llm)
        out = []
        for output, path in served:
            data = load_hidden_states(path)
            out.append((output, data["hidden_states"], data["token_ids"].tolist()))
        return out
    finally:
        shutdown_llm(llm)


def _predicted(policy: str, block_size: int, prompts, output: int) -> list[int]:
    """The core's hits with a hidden-state group: one draft token a step without EAGLE's
    rules (``extract_hidden_states``), room to spare."""
    from block_hashes import chained_hashes

    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.eviction import get_eviction
    from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec, SpeculationSpec

    layout = CacheLayout(PoolSpec(num_blocks=4096, block_size=block_size,
                                  group_kinds=("state", "attention", "hidden")),
                         SchedulingSpec(chunk_size=8192),
                         SpeculationSpec(num_speculative_tokens=1, eagle=False))
    cache = HybridPrefixCache(layout, admission=get_admission(policy), eviction=get_eviction("lru"))
    return [cache.serve(chained_hashes(p, block_size), len(p), output, r, float(r)).hit_tokens
            for r, p in enumerate(prompts)]


def _assert_hidden_states_match_cold(runs, prompts) -> None:
    """Each request's file holds its prompt's tokens and one row of hidden states per
    token. A request that hit the cache gets, over its cached tokens, exactly the hidden
    states of the first request with that prefix (which ran it cold: nothing held it
    before), and over the rest of the prefix they share, the same values recomputed
    from the restored recurrent state in other prefill passes: per token, within one
    rounding of the row's largest value per pass of either request, ``(passes of both) x u
    x max |row|`` (tests/model_output.py)."""
    import torch

    for i, (output, states, token_ids) in enumerate(runs):
        cached = output.cached
        assert token_ids == list(prompts[i])
        assert states.shape[0] == len(prompts[i])
        if not cached:
            continue
        cold = next(j for j in range(i) if prompts[j][:cached] == prompts[i][:cached])
        assert runs[cold][0].cached < cached, (i, cold)
        reference = runs[cold][1]
        assert torch.equal(states[:cached], reference[:cached]), (i, cold)
        shared = cached
        limit = min(len(prompts[i]), len(prompts[cold]))
        while shared < limit and prompts[i][shared] == prompts[cold][shared]:
            shared += 1
        got, want = states[cached:shared].float(), reference[cached:shared].float()
        bound = (output.passes + runs[cold][0].passes) * output.u * want.abs().amax(dim=-1)
        worst = ((got - want).abs().amax(dim=-1) - bound).max()
        assert float(worst) <= 0, (i, cold, float(worst))


@pytest.fixture(scope="module")
def hidden_model(tmp_path_factory, request):
    from vllm_admission.engine.tiny_model import make_tiny_model

    return route_to_every_expert(  # tests/model_output.py: no router near-ties
        make_tiny_model(tmp_path_factory.mktemp("tiny_hidden"), arch=request.param))


@pytest.mark.parametrize("hidden_model", ["qwen3-next", "nemotron-h"], indirect=True)
def test_every_admission_runs_with_the_hidden_state_cache_and_its_connector(
        hidden_model, engine_env, tmp_path):
    """``marconi``, ``dense``, ``last`` and ``auto`` under ``extract_hidden_states`` and
    the hidden-states connector: no refusal; the scheduler names the third group
    ``hidden``; stock's output within rounding (tests/model_output.py); the hits the core
    predicts with a hidden-state group; at least stock's cached tokens on the siblings wherever the
    policy keeps junctions; hidden states equal to a cold run's over every shared prefix."""
    from engine_cases import predicted_block_size

    from vllm_admission.plugin.scheduler import admission_stats

    B = predicted_block_size(hidden_model, "float32")
    prompts, output = _prompts(), 8
    stock = _serve(hidden_model, None, {}, prompts, tmp_path / "stock", output)
    assert [o.cached for o, *_ in stock] == _predicted("vllm", B, prompts, output)
    assert sum(o.cached for o, *_ in stock) > 0
    _assert_hidden_states_match_cold(stock, prompts)
    kinds = []

    def group_kinds(llm):
        stats = admission_stats(llm)
        kinds.append(tuple(stats.evictions_by_group))

    for policy, eviction in (("marconi", "lru"), ("dense", "s3fifo"), ("last", "lru"),
                             ("auto", "auto")):
        runs = _serve(hidden_model, "vllm_admission.AdmissionScheduler",
                      {"VLLM_ADMISSION_POLICY": policy, "VLLM_ADMISSION_EVICTION": eviction},
                      prompts, tmp_path / policy, output, check=group_kinds)
        cached = [o.cached for o, *_ in runs]
        assert_same_output([o for o, *_ in stock], [o for o, *_ in runs], label=policy)
        assert [len(o.tokens) for o, *_ in runs] == [output] * len(prompts)
        if policy != "auto":  # auto's first pair is stock's; its switches are its own
            assert cached == _predicted(policy, B, prompts, output), policy
        if policy != "last":  # last keeps no junction state, by design
            assert all(c >= s.cached
                       for c, (s, *_) in zip(cached[:4], stock[:4], strict=True)), policy
        _assert_hidden_states_match_cold(runs, prompts)
    assert set(kinds) == {("state0", "attention1", "hidden2")}
