"""MTP speculative decoding on vLLM's CPU engine (issue 31; docs/engine-facts.md section 9).

vLLM 0.32's CPU build loads MTP drafters for hybrid models but lacks the state kernels
drafts need; ``vllm_admission.plugin.cpu_spec_decode`` supplies them. With them the tiny
models (``make-tiny-model --mtp``) serve with MTP and prefix caching: stock vLLM, and the
plugin in every setting the preflight lets run there, give the same greedy tokens and the
same cached tokens; the settings it cannot run yet are refused before the model loads.
"""

from __future__ import annotations

import pytest
from conftest import greedy_one_at_a_time

pytestmark = pytest.mark.engine

MTP = {"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}


def _prompts(vocab: int = 512) -> list[list[int]]:
    """Four 600-token prompts over one 512-token prefix, then the first one again."""
    import random

    rng = random.Random(0)
    prefix = [rng.randrange(3, vocab) for _ in range(512)]
    prompts = [prefix + [rng.randrange(3, vocab) for _ in range(88)] for _ in range(4)]
    return prompts + [prompts[0]]


def _run(model, scheduler: str | None, engine_args: dict, env: dict) -> list:
    return greedy_one_at_a_time(model, scheduler, env, engine_args=engine_args,
                                prompts=_prompts(), max_tokens=24)


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory, request):
    from vllm_admission.engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_mtp"), arch=request.param, mtp=True)


@pytest.mark.parametrize("mtp_model", ["qwen3-next", "nemotron-h"], indirect=True)
def test_mtp_runs_on_the_cpu_engine_and_the_plugin_changes_nothing(mtp_model, engine_env):
    """Stock vLLM with MTP, the plugin (stock pair, ``auto``+``auto`` narrowed to it) with
    MTP: the same greedy tokens and cached tokens, request by request; later prompts hit
    the shared prefix. With MTP vLLM drops the last matched block (EAGLE's rule), so the
    same prompts without MTP hit one block more."""
    stock = _run(mtp_model, None, MTP, {})
    assert all(len(tokens) == 24 for _, tokens in stock)
    for policy, eviction in (("vllm", "lru"), ("auto", "auto")):
        plugin = _run(mtp_model, "vllm_admission.AdmissionScheduler", MTP,
                      {"VLLM_ADMISSION_POLICY": policy, "VLLM_ADMISSION_EVICTION": eviction})
        assert plugin == stock, (policy, eviction)
    plain = _run(mtp_model, None, {}, {})
    # Drafts verified by the target give the target's greedy tokens: the first tokens
    # agree with the run without MTP (later ones may part at bf16 ties between two
    # candidates, docs/engine-facts.md section 9). Without the CPU conv fix the Mamba2
    # model parts from the first decode step.
    assert [t[:8] for _, t in stock] == [t[:8] for _, t in plain]
    cached_mtp = [c for c, _ in stock]
    cached_plain = [c for c, _ in plain]
    assert cached_mtp[0] == 0 and all(c > 0 for c in cached_mtp[2:])
    assert all(p > m for p, m in zip(cached_plain[2:], cached_mtp[2:]))


@pytest.mark.parametrize("mtp_model", ["qwen3-next"], indirect=True)
def test_what_mtp_cannot_run_yet_is_refused_before_the_model_loads(mtp_model, engine_env):
    from vllm_admission.plugin.config import AdmissionConfigError

    with pytest.raises(AdmissionConfigError) as info:
        _run(mtp_model, "vllm_admission.AdmissionScheduler", MTP,
             {"VLLM_ADMISSION_POLICY": "marconi"})
    assert str(info.value) == ("VLLM_ADMISSION_POLICY=marconi cannot run with Mamba speculative "
                               "blocks; EAGLE/MTP speculative decoding (valid here: vllm)")
