"""``VLLM_ADMISSION_CHECKPOINT=inpass`` in vLLM's scheduler driven without a model (FakeEngine).

The junction case (tests/junction_case.py, B = 128) for every admission policy: the same
hits as ``split`` and as the core model in ``inpass`` mode, one prefill step per prompt, the
checkpoint list each step hands the runner (``SchedulerOutput.admission_inpass``); the
chunk arithmetic of :func:`vllm_admission.plugin.inpass.inpass_split` on made-up requests.
The fault case (abort mid-prefill, preemptions, no block leaked) runs in both modes in
``test_plugin_scheduler.py::test_preemption_and_abort_leak_nothing``.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from block_hashes import chained_hashes
from junction_case import (
    expected_junction,
    expected_junction_inpass_prefill_steps,
    junction_prompts,
)

pytest.importorskip("vllm")

from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission  # noqa: E402
from vllm_admission.core.cache import HybridPrefixCache  # noqa: E402
from vllm_admission.core.eviction import get_eviction  # noqa: E402
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec  # noqa: E402
from vllm_admission.plugin.boundary.hooks import INPASS_ATTR  # noqa: E402
from vllm_admission.plugin.inpass import inpass_split, split_stops  # noqa: E402

B = 128
CHUNK = 4096


def inpass_layout(num_blocks):
    """The core's layout of the engines here, in ``inpass`` mode."""
    return CacheLayout(PoolSpec(num_blocks=num_blocks, block_size=B, group_kinds=("state", "attention")),
                       SchedulingSpec(chunk_size=CHUNK, checkpoint="inpass"))


POLICIES = list(ADMISSION_POLICIES)


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    from vllm_admission_testing.harness import make_vllm_config, write_config_only_model

    model_dir = write_config_only_model(tmp_path_factory.mktemp("tiny_config"))
    cfg = make_vllm_config(model_dir, block_size=B, max_model_len=8192, max_num_batched_tokens=CHUNK)
    # No runner here; inpass checks that a real one would share the scheduler's process.
    cfg.parallel_config.distributed_executor_backend = "uni"
    return cfg


def build(vllm_config, monkeypatch, policy, *, blocks=160, checkpoint="inpass",
          state_layer="GDN_ATTN"):
    from vllm_admission.plugin.scheduler import AdmissionScheduler
    from vllm_admission_testing.harness import (
        FakeEngine,
        make_kv_cache_config,
        make_scheduler,
    )

    monkeypatch.setenv("VLLM_ADMISSION_POLICY", policy)
    monkeypatch.setenv("VLLM_ADMISSION_EVICTION", "lru")
    monkeypatch.setenv("VLLM_ADMISSION_CHECKPOINT", checkpoint)
    monkeypatch.setenv("VLLM_ADMISSION_LOG_INTERVAL", "0")
    sched = make_scheduler(AdmissionScheduler, vllm_config,
                           make_kv_cache_config(vllm_config, blocks, kinds=("state", "attention"),
                                                state_layer=state_layer))
    return FakeEngine(sched)


def toks(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(8, 512) for _ in range(n)]


def chained(tokens):
    return chained_hashes(tokens, B)


def free_equals_usable(engine):
    pool = engine.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def checkpoint_lists(sched):
    """Record the checkpoint list of every step the scheduler hands the runner (a list that
    grows as the scheduler steps)."""
    lists = []
    original = sched.schedule

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        lists.append(dict(getattr(out, INPASS_ATTR)))
        return out

    sched.schedule = spy
    return lists


@pytest.mark.parametrize("policy", POLICIES)
def test_inpass_junction_case(vllm_config, monkeypatch, policy):
    from vllm_admission.engine.llm import PrefillStepCounter

    engine = build(vllm_config, monkeypatch, policy)
    sched = engine.scheduler
    lists = checkpoint_lists(sched)
    hits = []
    prompts = junction_prompts(toks)
    with PrefillStepCounter(sched) as counter:
        for p in prompts:
            rid = engine.add(p, 4)
            engine.run()
            hits.append(engine.cached_tokens[rid])
    assert hits == expected_junction(B)[policy]
    assert list(counter.counts.values()) == expected_junction_inpass_prefill_steps(B)[policy]
    assert free_equals_usable(engine)
    # The core model's inpass prediction, request by request.
    cache = HybridPrefixCache(inpass_layout(160), admission=get_admission(policy),
                              eviction=get_eviction("lru"))
    outs = [cache.serve(chained(p), len(p), 4, rid=r, now=float(r)) for r, p in enumerate(prompts)]
    assert [o.hit_tokens for o in outs] == hits
    assert [o.prefill_steps for o in outs] == list(counter.counts.values())
    # Prompt 1's single prefill step: the checkpoint list names split mode's stops.
    offsets = sorted(off for pairs in lists[0].values() for off, _ in pairs)
    expected = {"none": [1792], "last": [1792], "vllm": [1792], "block": [1792], "marconi": [1792],
                "written": [1792], "dense": [B * i for i in range(1, 15)]}[policy]
    assert offsets == expected  # one state group in this layout
    (pairs,) = lists[0].values()
    assert len({blk for _, blk in pairs}) == len(pairs)


def test_inpass_captures_stay_within_what_the_pool_holds(vllm_config, monkeypatch):
    """dense on a 3,000-token prompt in a 40-block pool: capturing every block boundary of the
    4,096-token chunk (23 states) would need more blocks than the pool has, and the request
    would never be scheduled. The step captures at most ``inpass_capture_limit`` states and
    ends at the next boundary, as the core model predicts; then a hit on the prefix."""
    from vllm_admission.core.geometry import inpass_capture_limit
    from vllm_admission.engine.llm import PrefillStepCounter

    blocks, out_len = 40, 4
    prompt = toks(5, 3000)
    limit = inpass_capture_limit(len(prompt), out_len, num_blocks=blocks, block_size=B,
                                 num_attention_groups=1, num_state_groups=1)
    assert 0 < limit < 3000 // B   # the case needs the limit to bind
    engine = build(vllm_config, monkeypatch, "dense", blocks=blocks)
    sched = engine.scheduler
    lists = checkpoint_lists(sched)
    second = prompt[:2000] + toks(6, 500)
    with PrefillStepCounter(sched) as counter:
        rids = []
        for p in (prompt, second):
            rids.append(engine.add(p, out_len))
            engine.run(max_steps=200)
    hits = [engine.cached_tokens[r] for r in rids]
    assert all(len(pairs) <= limit for step in lists for pairs in step.values())
    assert max(len(pairs) for step in lists for pairs in step.values()) == limit
    cache = HybridPrefixCache(inpass_layout(blocks), admission=get_admission("dense"),
                              eviction=get_eviction("lru"))
    assert cache.inpass_capture_limit(len(prompt), out_len) == limit
    outs = [cache.serve(chained(p), len(p), out_len, rid=r, now=float(r))
            for r, p in enumerate((prompt, second))]
    assert [o.prefill_steps for o in outs] == list(counter.counts.values())
    assert counter.counts[rids[0]] == 2        # one chunk end at the limit, then the rest
    assert [o.hit_tokens for o in outs] == hits and hits[1] == 2000 // B * B
    assert free_equals_usable(engine)


# ---------------------------------------------------------------- chunk arithmetic
def fake(num_computed, prompt, *, budget=4096):
    request = SimpleNamespace(request_id="r", num_computed_tokens=num_computed, num_prompt_tokens=prompt,
                              num_tokens=prompt)
    scheduler = SimpleNamespace(cache_config=SimpleNamespace(block_size=B), max_num_scheduled_tokens=budget,
                                scheduler_config=SimpleNamespace(long_prefill_token_threshold=0))
    return scheduler, request


def stops_at(*positions):
    """A split function that ends chunks at ``positions`` (absolute tokens)."""
    def split(request, n, local=0, external=0):
        start = request.num_computed_tokens + local + external
        return min([p for p in positions if start < p < start + n], default=start + n) - start
    return split


@pytest.mark.parametrize("state_layer", ["LINEAR", "SHORT_CONV", "MAMBA1"])
def test_inpass_refuses_state_layers_it_cannot_capture(vllm_config, monkeypatch, state_layer):
    # The runner captures Gated DeltaNet and Mamba2 prefills only. The model config cannot
    # tell (transformers lists both as linear_attention, and other linear layers may be
    # too), so the check reads the KV cache specs' mamba_type: another kind must get the
    # one-line refusal, not an in-pass plan whose checkpoint blocks no layer writes.
    from vllm_admission.plugin.env import SettingsError

    with pytest.raises(SettingsError) as info:
        build(vllm_config, monkeypatch, "marconi", state_layer=state_layer)
    message = str(info.value)
    assert "\n" not in message and "VLLM_ADMISSION_CHECKPOINT=inpass cannot run" in message
    assert f"state layers of kind {state_layer}" in message and "valid here: split" in message
    # the same engine in split mode builds
    assert build(vllm_config, monkeypatch, "marconi", checkpoint="split",
                 state_layer=state_layer).scheduler is not None


def test_inpass_split_keeps_the_budget_and_lists_the_stops():
    sched, req = fake(0, 1801)
    plan = {}
    assert inpass_split(sched, stops_at(1408, 1792), plan, req, 1801) == 1801
    assert plan == {"r": (0, [1408, 1792])}
    # the budget end is floored to a block before the prompt end; stops past it are not listed
    plan.clear()
    assert inpass_split(sched, stops_at(640, 1792), plan, req, 1000) == 896
    assert plan == {"r": (0, [640])}
    # a stop that is not block-aligned still ends the chunk
    plan.clear()
    assert inpass_split(sched, stops_at(256, 700, 1792), plan, req, 1801) == 700
    assert plan == {"r": (0, [256])}
    # nothing inside: no plan entry; a chunk resuming past the prompt is left alone
    plan.clear()
    assert inpass_split(sched, stops_at(), plan, req, 1801) == 1801 and plan == {}
    sched, req = fake(1801, 1801)
    assert inpass_split(sched, stops_at(), plan, req, 1) == 1 and plan == {}


def test_split_stops_walks_the_chunk():
    _, req = fake(128, 1801)
    assert split_stops(stops_at(256, 1408, 1792), req, 128, 1801) == [256, 1408, 1792]
    assert split_stops(stops_at(256, 1408, 1792), req, 256, 1408) == []


def test_inpass_builds_for_mamba2_state_layers(vllm_config, monkeypatch):
    # Mamba2 layers are captured through vLLM's own export (runner/mamba2_export.py): the
    # same scheduler plan as for Gated DeltaNet, so the engine builds in inpass mode.
    built = build(vllm_config, monkeypatch, "marconi", state_layer="MAMBA2")
    assert built.scheduler._admission_inpass == {}
