"""The plugin with vLLM's own one-checkpoint-per-prefill export (no model).

vLLM 0.33 gives Qwen GDN layers on the FlashInfer prefill backend (the default on
H100) a ``MambaSpec`` with ``num_prefill_checkpoint_blocks=1`` and
``prefill_checkpoint_alignment`` = the prefix-cache grid, the Mamba block size here
(``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`` ``get_kv_cache_spec``);
vLLM 0.32 already does the same for Mamba2 layers (alignment 1). With it, the
scheduler no longer ends the last prefill chunk at the prompt-end boundary
(``floor((P - 1) / B) * B``): the kernel writes that state from inside the pass into
a reserved block, the block of that position (``v1/core/sched/scheduler.py``
``_mamba_block_aligned_split``, ``v1/core/single_type_kv_cache_manager.py``
``MambaManager._needs_internal_checkpoint``). The scheduler-side code is the same in
0.32 and 0.33, so these tests run on both (``make compat`` runs them on 0.33).

The plugin takes vLLM's exported state as the prompt-end (``last``) checkpoint: every
policy keeps the same states, and gets the same hits and evictions as the core model,
as without the export; only the prompt-end chunk stop disappears.
"""

from __future__ import annotations

import pytest
import scheduler_harness as harness
from scheduler_harness import (
    CHUNK,
    EVICTION_CASES,
    POLICIES,
    B,
    assert_counters_match,
    free_equals_usable,
    mamba_positions,
    random_workload,
    run_engine,
    toks,
)
from sequence_case import expected_states

pytest.importorskip("vllm")

# The harness's fixtures (model_dir, vllm_config, async_config, costs; tuners stopped
# after each test) are pytest's to inject.
pytest_plugins = ["scheduler_harness"]

#: The alignment vLLM 0.33 gives the Qwen GDN FlashInfer spec here: the Mamba block size.
EXPORT = B


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from vllm_admission_testing.harness import write_config_only_model

    return write_config_only_model(tmp_path_factory.mktemp("tiny_config_export"))


@pytest.fixture(scope="module")
def vllm_config(model_dir):
    from vllm_admission_testing.harness import make_vllm_config

    cfg = make_vllm_config(model_dir, block_size=B, max_model_len=8192,
                           max_num_batched_tokens=CHUNK)
    assert cfg.cache_config.mamba_cache_mode == "align"
    cfg.parallel_config.distributed_executor_backend = "uni"
    return cfg


@pytest.fixture(scope="module")
def costs(model_dir):
    from vllm_admission.core.costs import ModelCosts

    return ModelCosts.from_config(model_dir / "config.json")


def build(vllm_config, monkeypatch, *, export=EXPORT, **settings):
    """The harness's engine, with vLLM's export on the state groups by default."""
    return harness.build(vllm_config, monkeypatch, export=export, **settings)


def simulate(policy, eviction, requests, *, export=True, **options):
    """The harness's core model, with vLLM's export modelled by default."""
    return harness.simulate(policy, eviction, requests, export=export, **options)


def chunk_sizes(engine, tokens, out_len):
    """Tokens scheduled per step while ``tokens`` is served alone."""
    from test_plugin_scheduler import _outputs

    engine.add(tokens, out_len)
    sizes = []
    while engine.scheduler.has_requests():
        out = engine.scheduler.schedule()
        sizes.append(sum(out.num_scheduled_tokens.values()))
        engine.scheduler.update_from_output(out, _outputs(engine, out))
    return [n for n in sizes if n]


def test_the_spec_is_the_one_vllm_builds_for_qwen_gdn_on_flashinfer(vllm_config):
    """The hand-built spec: vLLM's scheduler sees an export on every state group, and on
    vLLM 0.33 the FlashInfer kernel's alignment divides the grid the spec carries."""
    from vllm.v1.kv_cache_interface import MambaSpec

    from vllm_admission_testing.harness import make_kv_cache_config

    kv = make_kv_cache_config(vllm_config, 40, prefill_checkpoint_alignment=EXPORT)
    spec = kv.kv_cache_groups[0].kv_cache_spec
    assert isinstance(spec, MambaSpec)
    assert (spec.num_prefill_checkpoint_blocks, spec.prefill_checkpoint_alignment) == (1, B)
    assert spec.mamba_cache_mode == "align"
    try:  # vLLM 0.33 (the FlashInfer GDN checkpoint export); absent in 0.32
        from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    except ImportError:
        FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = None
    import vllm

    if vllm.__version__.startswith("0.33."):
        assert FLASHINFER_GDN_CHECKPOINT_ALIGNMENT == 64
        assert EXPORT % FLASHINFER_GDN_CHECKPOINT_ALIGNMENT == 0
    with pytest.raises(ValueError, match="positive number of tokens"):
        make_kv_cache_config(vllm_config, 40, prefill_checkpoint_alignment=0)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_and_the_export_replaces_the_prompt_end_stop(vllm_config, monkeypatch,
                                                                       policy):
    """P = 1000: without the export the prompt's last chunk ends at 896 (= floor(999 / 128)
    * 128) and 896..1000 follows; with it, 0..1000 is one chunk for every policy that adds
    no stops of its own (``dense`` still ends a chunk at every block)."""
    engine = build(vllm_config, monkeypatch, policy=policy)
    assert engine.scheduler._admission_vllm_exports_checkpoint()  # noqa: SLF001
    sizes = chunk_sizes(engine, toks(4, 1000), 2)
    if policy == "dense":
        assert sizes == [128] * 7 + [104, 1]
    else:
        assert sizes == [1000, 1]
    plain = build(vllm_config, monkeypatch, policy=policy, export=None)
    assert not plain.scheduler._admission_vllm_exports_checkpoint()  # noqa: SLF001
    expect = [128] * 7 + [104, 1] if policy == "dense" else [896, 104, 1]
    assert chunk_sizes(plain, toks(4, 1000), 2) == expect


@pytest.mark.parametrize("policy", POLICIES)
def test_exported_state_is_the_prompt_end_checkpoint(vllm_config, monkeypatch, costs, policy):
    """The same cached states per policy as without the export (the policy's own answers,
    ``sequence_case.expected_states``): 896 is vLLM's exported state, kept only by the
    policies that admit the prompt end."""
    states = expected_states(policy, 1000, 300, B)
    engine = build(vllm_config, monkeypatch, policy=policy)
    run_engine(engine, [(toks(4, 1000), 300)])
    assert mamba_positions(engine) == states
    assert engine.scheduler.stats().state_checkpoints == len(states)
    assert free_equals_usable(engine)
    # A resend of the prompt hits the exported state where it was kept.
    rid = engine.add(toks(4, 1000), 3)
    engine.run()
    assert engine.cached_tokens[rid] == (896 if 896 in states else 0)


@pytest.mark.parametrize("eviction,alpha", EVICTION_CASES)
@pytest.mark.parametrize("policy", POLICIES)
def test_random_workload_matches_core_model_with_the_export(vllm_config, monkeypatch, costs,
                                                            policy, eviction, alpha):
    """test_plugin_scheduler's random workload on the export spec: the same hits, evictions
    per group, checkpoints and junctions as the core model (which knows nothing of the
    export), for every admission and eviction policy, ``reuse`` (keys) included."""
    from vllm_admission.engine.llm import PrefillStepCounter

    reqs = random_workload(11)
    engine = build(vllm_config, monkeypatch, policy=policy, eviction=eviction, alpha=alpha,
                   blocks=60)
    assert engine.scheduler._admission.geometry.scheduling.prompt_end_export  # noqa: SLF001
    with PrefillStepCounter(engine.scheduler) as counter:
        hits = run_engine(engine, reqs)
    sim_steps = []
    sim_hits, cache = simulate(policy, eviction, reqs, blocks=60, costs=costs, alpha=alpha,
                               steps=sim_steps)
    assert hits == sim_hits
    # The export's effect, request by request: the scheduler's prefill steps are the
    # core model's with the export, and fewer than without it (dense aside: its stops
    # leave no chunk that could export).
    assert list(counter.counts.values()) == sim_steps
    plain_steps = []
    simulate(policy, eviction, reqs, blocks=60, costs=costs, alpha=alpha, steps=plain_steps,
             export=False)
    assert (sum(sim_steps) == sum(plain_steps)) if policy == "dense" else (
        sum(sim_steps) < sum(plain_steps))
    assert_counters_match(engine, cache)


def test_inpass_mode_refuses_vllms_export(vllm_config, monkeypatch):
    """The plugin's own in-pass capture and vLLM's export would both write checkpoint
    columns in one step: ``inpass`` says so in one line."""
    from vllm_admission.plugin.env import SettingsError

    with pytest.raises(SettingsError) as info:
        build(vllm_config, monkeypatch, policy="marconi", checkpoint="inpass")
    msg = str(info.value)
    assert "\n" not in msg
    assert "vLLM's own prefill checkpoint export (num_prefill_checkpoint_blocks)" in msg
    assert msg.startswith("VLLM_ADMISSION_CHECKPOINT=inpass cannot run with")
