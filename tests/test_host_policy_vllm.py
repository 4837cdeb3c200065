"""The project's host policies inside vLLM's own ``CPUOffloadingManager``.

vLLM 0.32 loads an out-of-tree host policy by class name from
``cache_policy_module_path`` (``v1/kv_offload/cpu/policies/factory.py``). These tests load
the project's policies that way and drive vLLM's manager (``v1/kv_offload/cpu/manager.py``:
``prepare_store``, ``complete_store``, ``prepare_load``, ``complete_load``,
``on_request_finished``) with random requests, next to the simulator's
:class:`~vllm_admission.core.cache.host.HostTier` given the same requests: both must hold
the same chunks after every request. vLLM's own ``lru`` is checked against the core's
:class:`~vllm_admission.core.cache.host.HostLRU` the same way.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_admission.core.cache.host import HostRequest, HostTier, host_policy_names
from vllm_admission.plugin.offload_config import HOST_POLICY_MODULE

pytest.importorskip("vllm.v1.kv_offload.cpu.manager")

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

B = 16
ATTN, STATE = (1,), (0,)


def vkey(key):
    (tag, i), group = key
    return make_offload_key(f"{tag}/{i}".encode(), group)


class Both:
    """One host tier in the core and one vLLM manager, given the same requests."""

    def __init__(self, policy: str, chunks: int) -> None:
        self.tier = HostTier(chunks, policy)
        module = None if policy == "lru" else HOST_POLICY_MODULE
        self.manager = CPUOffloadingManager(chunks, cache_policy=policy,
                                            cache_policy_module_path=module)
        self.n = 0

    def request(self, tag: str, blocks: int, states: tuple[int, ...]) -> None:
        hashes = [(tag, i) for i in range(blocks)]
        prompt = blocks * B + 1
        self.n += 1
        ctx = ReqContext(req_id=str(self.n))
        self.manager.on_new_request(ctx)
        req = HostRequest()
        # A hit: consecutive attention chunks and a state at the end.
        end = self.tier.hit_end(hashes, 0, prompt, B, ATTN, STATE)
        if end:
            self.tier.load(req, hashes, 0, end, B, ATTN, STATE)
            keys = [((hashes[i], 1), (i + 1) * B) for i in range(end // B)]
            keys.append(((hashes[end // B - 1], 0), end))
            vkeys = [vkey(k) for k, _ in keys]
            for k, (_key, pos) in zip(vkeys, keys, strict=True):
                ctx.set_offload_key_position(k, pos)
            assert all(self.manager.lookup(k, ctx) == LookupResult.HIT for k in vkeys)
            self.manager.prepare_load(vkeys, ctx)
            self.manager.complete_load(vkeys, ctx)
            self.tier.settle()
        # Stores: the states, one call each, then the attention chunks in one call.
        calls = [[((hashes[s - 1], 0), s * B)] for s in states if s * B > end]
        calls.append([((hashes[i], 1), (i + 1) * B) for i in range(end // B, blocks)])
        for call in calls:
            ok = self.tier.store(req, call)
            vkeys = [vkey(k) for k, _ in call]
            for k, (_, pos) in zip(vkeys, call, strict=True):
                ctx.set_offload_key_position(k, pos)
            out = self.manager.prepare_store(vkeys, ctx)
            assert (out is not None) == ok
            if out is not None:
                self.manager.complete_store(out.keys_to_store, ctx)
            self.tier.settle()  # vLLM's side completes each store at once here
        self.tier.finish(req, hashes, 0, ATTN, B)
        self.tier.flush()
        self.manager.on_request_finished(ctx)

    def held(self) -> tuple[set, set]:
        core = {vkey(k) for k in self.tier.policy._ids} if hasattr(self.tier.policy, "_ids") \
            else {vkey(k) for k in self.tier.policy._order}
        ctx = ReqContext(req_id="probe")
        # Every key either side ever saw is a (tag, i) pair of a small universe.
        universe = {vkey(((t, i), g)) for t in "abcdef" for i in range(8) for g in (0, 1)}
        vllm = {k for k in universe if self.manager.lookup(k, ctx) != LookupResult.MISS}
        return core, vllm


requests = st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 8),
                              st.sets(st.integers(1, 8), max_size=3)),
                    min_size=1, max_size=30)


@pytest.mark.parametrize("policy", host_policy_names())
@settings(max_examples=40, deadline=None)
@given(reqs=requests, chunks=st.integers(4, 24))
def test_vllms_manager_with_a_project_policy_holds_what_the_core_holds(policy, reqs, chunks):
    both = Both(policy, chunks)
    for tag, blocks, states in reqs:
        both.request(tag, blocks, tuple(sorted(s for s in states if s <= blocks)))
        core, vllm = both.held()
        assert core == vllm


def test_vllm_resolves_the_policies_by_name_from_the_module():
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from vllm_admission.plugin.boundary.host_policy import AdmissionHostPolicy

    cls = CachePolicyFactory.get_cache_policy_cls("s3fifo", HOST_POLICY_MODULE)
    assert issubclass(cls, AdmissionHostPolicy) and cls.eviction == "s3fifo"
    assert CachePolicyFactory.get_cache_policy_cls("s3fifo", HOST_POLICY_MODULE) is cls
    with pytest.raises(AttributeError, match="'flop' cannot run in the host tier"):
        CachePolicyFactory.get_cache_policy_cls("flop", HOST_POLICY_MODULE)


def test_a_pinned_chunk_is_not_evicted():
    """A chunk being loaded (``ref_cnt`` > 0) is skipped, as vLLM's lru skips it."""
    manager = CPUOffloadingManager(2, cache_policy="s3fifo",
                                   cache_policy_module_path=HOST_POLICY_MODULE)
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    a, b, c = (make_offload_key(x, 0) for x in (b"a", b"b", b"c"))
    out = manager.prepare_store([a, b], ctx)
    manager.complete_store(out.keys_to_store, ctx)
    manager.prepare_load([a], ctx)                      # a pinned
    out = manager.prepare_store([c], ctx)
    assert out.evicted_keys == [b]
    manager.complete_store(out.keys_to_store, ctx)
    manager.prepare_load([c], ctx)                      # both chunks pinned
    d = make_offload_key(b"d", 0)
    assert manager.prepare_store([d], ctx) is None      # nothing evictable, nothing changed
    manager.complete_load([a], ctx)
    assert manager.prepare_store([d], ctx).evicted_keys == [a]
