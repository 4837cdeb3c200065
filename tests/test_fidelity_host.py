"""Fidelity with a host tier (vLLM's ``OffloadingConnector``): the project's host
eviction policies and per-tier admission, against the simulator's host tier, request by
request (``fidelity_cases.host_fidelity``)."""

from __future__ import annotations

import pytest
from fidelity_cases import assert_mirrored, host_fidelity

HOST_PAIRS = (("none", "lru"), ("last", "lru"), ("vllm", "lru"), ("block", "lru"),
              ("marconi", "lru"), ("dense", "lru"), ("dense", "s3fifo"), ("auto", "auto"))


@pytest.mark.engine
def test_the_host_tier_is_mirrored_exactly(tiny_model_of, engine_env):
    """vLLM's ``OffloadingConnector`` with a 48-chunk host tier (``fidelity --offload``;
    the project's CPU worker), against the simulator's host tier of the chunks the engine
    reports: every request's cached tokens (host loads among them), prefill steps and GPU
    evictions agree for every admission with ``lru``, a key-reading eviction (``dense`` +
    ``s3fifo``: host loads after local hits, whose state blocks vLLM never references) and
    ``auto``, with both tiers evicting."""
    records = host_fidelity(tiny_model_of, HOST_PAIRS, 48)
    assert_mirrored(records, HOST_PAIRS)
    for rec in records:
        assert rec["host_chunks"] == 48 and rec["host_policy"] == "lru"
        assert rec["simulator_host_evictions"] > 0, rec["admission"]
        if rec["admission"] != "none":
            assert rec["simulator_host_hit_tokens"] > 0, rec["admission"]


HOST_POLICY_PAIRS = (("vllm", "lru"), ("last", "lru"), ("marconi", "s3fifo"), ("auto", "auto"))


@pytest.mark.engine
@pytest.mark.parametrize("host_policy", ["reuse", "s3fifo"])
def test_a_project_host_policy_is_mirrored_exactly(tiny_model_of, engine_env, host_policy):
    """The host tier run by one of the project's eviction policies, which vLLM loads
    through ``cache_policy_module_path`` (``plugin/boundary/host_policy.py``), against the
    simulator's host tier running the same policy object: every request's cached tokens,
    prefill steps and GPU evictions agree, with both tiers evicting."""
    records = host_fidelity(tiny_model_of, HOST_POLICY_PAIRS, 48, host_policy=host_policy)
    assert_mirrored(records, HOST_POLICY_PAIRS)
    for rec in records:
        assert rec["host_chunks"] == 48 and rec["host_policy"] == host_policy
        assert rec["simulator_host_evictions"] > 0, rec["admission"]
        assert rec["simulator_host_hit_tokens"] > 0, rec["admission"]


HOST_ADMISSION_PAIRS = (("vllm", "lru"), ("marconi", "reuse"), ("none", "lru"),
                        ("dense", "s3fifo"), ("auto", "auto"))


@pytest.mark.engine
def test_per_tier_admission_is_mirrored_exactly(tiny_model_of, engine_env):
    """Per-tier admission (``VLLM_ADMISSION_HOST_ADMISSION=dense``): the GPU keeps the
    pair's states, every other block boundary of a prompt is written (a chunk stop),
    handed to the host tier and dropped from the GPU cache at once. Every request's
    cached tokens, prefill steps and GPU evictions agree with the simulator's per-tier
    admission. With ``none`` on the GPU, which hits nothing without it, every hit comes
    from states only the host kept. (The same host tier without per-tier admission:
    ``test_the_host_tier_is_mirrored_exactly``.)"""
    records = host_fidelity(tiny_model_of, HOST_ADMISSION_PAIRS, 96, host_admission="dense")
    assert_mirrored(records, HOST_ADMISSION_PAIRS)
    for rec in records:
        assert rec["host_admission"] == "dense"
        assert rec["simulator_host_evictions"] > 0, rec["admission"]
    # No state on the GPU: without host admission nothing hits; with it every hit is a
    # state the host alone kept.
    (base,) = host_fidelity(tiny_model_of, (("none", "lru"),), 96)
    assert base["host_admission"] is None and sum(base["per_request"]["engine"]) == 0
    none = records[2]  # HOST_ADMISSION_PAIRS[2]
    assert none["admission"] == "none"
    hits = sum(none["per_request"]["engine"])
    assert hits > 0 and none["simulator_host_hit_tokens"] == hits


@pytest.mark.engine
def test_per_tier_admission_in_pass_is_mirrored_exactly(tiny_model_of, engine_env):
    """Per-tier admission with ``VLLM_ADMISSION_CHECKPOINT=inpass``: the host's states
    are captured inside the forward pass instead of ending chunks. Cached tokens, prefill
    steps and GPU evictions agree; with ``none`` on the GPU every hit is the host's."""
    pairs = (("marconi", "lru"), ("none", "lru"))
    records = host_fidelity(tiny_model_of, pairs, 96, host_admission="dense",
                            checkpoint="inpass")
    assert_mirrored(records, pairs)
    none = records[1]
    hits = sum(none["per_request"]["engine"])
    assert hits > 0 and none["simulator_host_hit_tokens"] == hits
