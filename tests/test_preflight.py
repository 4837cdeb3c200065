"""One decision for what an engine can run (``plugin/boundary/engine_setup.py``: ``plan_for`` on
``EngineFacts``), taken before the model loads from vLLM's ``VllmConfig`` and again in the
scheduler from the live engine; ``auto`` on an architecture without a FLOP model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from scheduler_harness import build, plugin_lines  # noqa: E402

from vllm_admission.core.adaptive import AUTO, AUTO_ADMISSIONS, AUTO_EVICTIONS  # noqa: E402
from vllm_admission.plugin.boundary.engine_setup import (  # noqa: E402
    EngineFacts,
    plan_for,
    prefill_tokens,
    preflight,
)
from vllm_admission.plugin.env import Settings, SettingsError  # noqa: E402

# The harness's fixtures (model_dir, vllm_config, async_config, costs; tuners stopped
# after each test) are pytest's to inject.
pytest_plugins = ["scheduler_harness"]


def settings(policy="vllm", eviction="lru", **kw) -> Settings:
    return Settings(admission=policy, eviction=eviction, log_interval=0, **kw)


class _Spec:
    def __init__(self, method, hidden_layers=(1,)):
        self.method = method
        self.draft_model_config = SimpleNamespace(
            hf_config=SimpleNamespace(eagle_aux_hidden_state_layer_ids=list(hidden_layers)))

    def use_eagle(self):
        return self.method in ("eagle", "eagle3", "mtp")


#: n-gram speculative decoding (a method the core does not model) and its one-line refusal.
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
NGRAM_REFUSAL = ("VLLM_ADMISSION_POLICY=marconi cannot run with speculative decoding other "
                 "than EAGLE/MTP and extract_hidden_states (valid here: vllm)")


def fake_config(*, spec=None, tokens=0, connector=None, unit=None, block=128, caching=True,
                hybrid=True, arch="Qwen3NextForCausalLM"):
    """A stand-in with exactly the VllmConfig fields the preflight reads."""
    from vllm_admission.engine.tiny_model import tiny_model_config_kwargs

    hf = dict(tiny_model_config_kwargs(), architectures=[arch], model_type="qwen3_next")
    return SimpleNamespace(
        cache_config=SimpleNamespace(enable_prefix_caching=caching, block_size=block,
                                     prefix_match_unit=unit, mamba_cache_mode="align",
                                     use_replayssm=False),
        speculative_config=None if spec is None else _Spec(spec),
        num_speculative_tokens=tokens, kv_transfer_config=connector,
        model_config=SimpleNamespace(is_hybrid=hybrid, hf_config=SimpleNamespace(to_dict=lambda: hf)),
        parallel_config=SimpleNamespace(distributed_executor_backend=None))


@pytest.mark.parametrize("config, named, feature", [
    (dict(spec="ngram", tokens=2), "VLLM_ADMISSION_POLICY=marconi",
     "speculative decoding other than EAGLE/MTP"),
])
def test_a_refusal_comes_from_the_config_before_the_model_loads(config, named, feature):
    with pytest.raises(SettingsError) as info:
        preflight(fake_config(**config), settings("marconi"))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{named} cannot run with ") and feature in msg


def test_a_sub_block_hash_unit_runs_every_policy_and_refuses_inpass(caplog):
    """``prefix_match_unit`` below the block: the core models it for admission and for the
    keys a hash-keyed eviction hears, so every admission, every eviction and ``auto`` with
    all its candidates run; ``inpass`` is refused before the model loads, in one line
    naming the unit."""
    config = fake_config(unit=32)
    for policy in ("marconi", "dense", "last", AUTO):
        preflight(config, settings(policy))
    for eviction in ("reuse", "s3fifo", "conversation", "mix"):
        preflight(config, settings("marconi", eviction))
    plan, lines = plugin_lines(caplog, lambda: plan_for(
        settings(AUTO, AUTO), EngineFacts.from_vllm_config(config)))
    assert set(plan.evictions) == set(AUTO_EVICTIONS) and not lines
    with pytest.raises(SettingsError, match="VLLM_ADMISSION_CHECKPOINT=inpass cannot run "
                                                   ".*prefix_match_unit below"):
        preflight(config, settings("marconi", checkpoint="inpass"))


def test_a_key_problem_the_core_does_not_model_refuses_hash_keyed_eviction(caplog):
    """Blocks hashed in a way the core does not model (groups of different block sizes):
    a fixed hash-keyed eviction is refused in one line naming it, and ``auto`` runs
    without those candidates, saying so."""
    facts = EngineFacts(key_problems=("KV cache groups of different block sizes",))
    with pytest.raises(SettingsError, match="VLLM_ADMISSION_EVICTION=reuse cannot run "
                                                   "with KV cache groups of different"):
        plan_for(settings("vllm", "reuse"), facts)
    plan, lines = plugin_lines(caplog, lambda: plan_for(settings("vllm", AUTO), facts))
    assert "reuse" not in plan.evictions and plan.evictions
    assert any("auto eviction leaves out" in message for _, message in lines)


def test_what_the_config_cannot_tell_is_left_to_the_scheduler():
    # A unit equal to the configured block size may still split the final (aligned) block:
    # the scheduler checks that against the live KV cache groups.
    assert EngineFacts.from_vllm_config(fake_config(unit=128)).key_problems == ()
    preflight(fake_config(unit=128), settings("marconi"))
    # Nothing to refuse where the plugin has nothing to do.
    preflight(fake_config(spec="mtp", tokens=1, caching=False), settings("marconi"))
    preflight(fake_config(spec="mtp", tokens=1, hybrid=False), settings("marconi"))
    # Stock settings run on any configuration.
    preflight(fake_config(spec="ngram", tokens=2, connector=object(), unit=32), settings())


@pytest.mark.parametrize("policy", ["marconi", "dense", "last", AUTO])
def test_a_kv_connector_and_the_hidden_state_cache_refuse_nothing(policy, caplog):
    """A KV connector (it reads vLLM's free queue, which the plugin's implements in
    eviction order) and ``extract_hidden_states`` (a hidden-state group the core models,
    one draft token without EAGLE's rules): every policy and ``auto`` with every
    candidate run, without a warning."""
    config = fake_config(spec="extract_hidden_states", tokens=1, connector=object())
    preflight(config, settings(policy, AUTO))
    plan, lines = plugin_lines(caplog, lambda: plan_for(
        settings(policy, AUTO), EngineFacts.from_vllm_config(config)))
    assert set(plan.evictions) == set(AUTO_EVICTIONS) and plan.adaptive and not lines


def test_mtp_with_a_finer_hash_unit_runs_every_policy_but_inpass():
    """EAGLE/MTP together with a ``prefix_match_unit`` below the block: the core models
    the lookup that drops one hash block and the prompt's unit end a unit lower, so nothing but
    ``inpass`` is refused."""
    config = fake_config(spec="mtp", tokens=1, unit=32)
    for policy in ("marconi", "dense", "last", "block", AUTO):
        preflight(config, settings(policy, AUTO if policy == AUTO else "s3fifo"))
    with pytest.raises(SettingsError, match="VLLM_ADMISSION_CHECKPOINT=inpass"):
        preflight(config, settings("marconi", checkpoint="inpass"))


def test_mtp_runs_every_admission_and_every_eviction(caplog):
    """EAGLE/MTP: the core models its lookup, checkpoints, draft slots and speculative
    state blocks, so every admission and every eviction runs, and ``auto`` keeps all its
    candidates."""
    facts = EngineFacts.from_vllm_config(fake_config(spec="mtp", tokens=1))
    assert facts.eagle and facts.key_problems == ("Mamba speculative blocks",)
    assert facts.unmodelled_key_problems == []
    for policy in ("marconi", "dense", "last", "block"):
        plan_for(settings(policy), facts)
    for eviction in ("reuse", "s3fifo", "conversation", "mix", "flop"):
        plan_for(settings("marconi", eviction), facts)
    plan, lines = plugin_lines(caplog, lambda: plan_for(settings(AUTO, AUTO), facts))
    assert plan.admissions == AUTO_ADMISSIONS and set(plan.evictions) == set(AUTO_EVICTIONS)
    assert plan.adaptive and not lines


def test_auto_without_a_flop_model_scores_by_tokens_and_flop_is_refused():
    """An architecture the cost model does not know: ``auto`` runs (its shadows score
    prompt tokens saved), a policy that needs FLOP values is refused naming itself, and
    ``auto`` admission with plain ``lru`` is no longer refused under lru's name."""
    facts = EngineFacts(flop_model_error="unknown architecture 'KimiLinearForCausalLM'")
    plan = plan_for(settings(AUTO, AUTO), facts)
    assert plan.adaptive and plan.needs_flops
    assert plan_for(settings(AUTO, "lru"), facts).adaptive
    with pytest.raises(SettingsError) as info:
        plan_for(settings("vllm", "flop"), facts)
    msg = str(info.value)
    assert msg.startswith("VLLM_ADMISSION_EVICTION=flop needs a FLOP model of this "
                          "architecture: unknown architecture 'KimiLinearForCausalLM'")
    assert "flop" not in msg.split("valid here:")[1]
    with pytest.raises(SettingsError, match="VLLM_ADMISSION_EVICTION=flop needs"):
        plan_for(settings(AUTO, "flop"), facts)
    assert prefill_tokens(1000, 256) == 744.0


def test_the_scheduler_runs_auto_by_tokens_on_an_unknown_architecture(vllm_config, monkeypatch,
                                                                     caplog):
    from vllm_admission.core.costs import ModelConfigError, ModelCosts

    def unknown(*args, **kwargs):
        raise ModelConfigError("unknown architecture 'LFM2ForCausalLM'")

    monkeypatch.setattr(ModelCosts, "from_config", staticmethod(unknown))
    engine, lines = plugin_lines(caplog, lambda: build(vllm_config, monkeypatch,
                                                        policy="auto", eviction="auto"))
    try:
        assert engine.scheduler.stats().adaptive
        assert engine.scheduler._admission.prefill_flops(1000, 256) == 744.0  # noqa: SLF001
        assert any("auto scores its candidates by prompt tokens saved" in message
                   for _, message in lines)
    finally:
        engine.scheduler.shutdown()
    with pytest.raises(SettingsError, match="needs a FLOP model"):
        build(vllm_config, monkeypatch, policy="vllm", eviction="flop")


@pytest.mark.engine
def test_build_llm_refuses_before_the_engine_core_starts(tiny_model_of, engine_env, monkeypatch):
    """Through vLLM's own config path (``EngineArgs.create_engine_config``): n-gram
    speculative decoding and ``marconi`` fail with one line before vLLM builds the engine
    core (so before any weight loads)."""
    import vllm.v1.engine.core as core

    from vllm_admission.engine.llm import build_llm, plugin_settings

    started = []
    real = core.EngineCore.__init__
    monkeypatch.setattr(core.EngineCore, "__init__",
                        lambda self, *a, **k: started.append(1) or real(self, *a, **k))
    s = plugin_settings(str(tiny_model_of("qwen3-next")), admission="marconi", eviction="lru")
    s.engine_args = {"speculative_config": NGRAM}
    with pytest.raises(SettingsError) as info:
        build_llm(s)
    assert str(info.value) == NGRAM_REFUSAL
    assert not started


def test_hidden_states_in_smaller_blocks_are_refused_before_the_model_loads(caplog):
    """``extract_hidden_states`` on Qwen3-Next-80B: one 2,048-wide hidden state per token
    is larger than one token's KV in an attention layer (2 KV heads of 256), so vLLM gives
    the hidden-state group half-size blocks; groups of different block sizes are not
    modelled, so ``marconi`` is refused in one line from the config alone, and ``auto``
    runs stock's admission, saying so."""
    import json

    from vllm_admission.core.costs import load_model

    qwen = json.loads(Path(load_model("qwen3-next-80b-a3b").source).read_text())
    config = fake_config(spec="extract_hidden_states", tokens=1)
    config.model_config.hf_config = SimpleNamespace(to_dict=lambda: qwen)
    with pytest.raises(SettingsError) as info:
        preflight(config, settings("marconi"))
    assert str(info.value).startswith("VLLM_ADMISSION_POLICY=marconi cannot run with KV cache "
                                      "groups of different block sizes")
    plan, lines = plugin_lines(caplog, lambda: plan_for(
        settings(AUTO, AUTO), EngineFacts.from_vllm_config(config)))
    assert plan.admissions == ("vllm",)
    assert any("auto admission leaves out" in message for _, message in lines)
