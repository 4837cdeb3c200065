"""auto's shadow caches in a child process: same decisions as in-process, clear errors."""

from __future__ import annotations

import os
import random

import pytest

from vllm_admission.core.adaptive import PolicyController
from vllm_admission.core.cache_inputs import CacheRequest, CacheSetup
from vllm_admission.core.costs import load_model
from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec
from vllm_admission.core.shadows import DEFAULT_NICE, ShadowProcess, ShadowProcessError

B = 16
#: A real model's prefill FLOPs (a bound method of ModelCosts: it pickles to the child).
flops = load_model("qwen3-next-80b-a3b").prefill_flops


def workload(n: int = 90, seed: int = 3) -> list[CacheRequest]:
    rng = random.Random(seed)
    docs = [[("d", k, i) for i in range(rng.randint(2, 12) * B)] for k in range(6)]
    reqs = []
    for r in range(n):
        doc = rng.choice(docs)
        tokens = doc[: rng.randint(1, len(doc))] + [("u", r)] * rng.randint(1, 2 * B)
        keys, h = [], 0
        for b in range(len(tokens) // B):
            h = hash((h, tuple(tokens[b * B:(b + 1) * B])))
            keys.append(h)
        reqs.append(CacheRequest(keys, len(tokens), rng.randint(1, 8)))
    return reqs


def controller_kwargs(blocks: int = 40) -> dict:
    layout = CacheLayout(PoolSpec(num_blocks=blocks, block_size=B, group_kinds=("state", "attention")),
                         SchedulingSpec(chunk_size=8192))
    setup = CacheSetup(layout=layout, admission="vllm", eviction="lru", segment_flops=flops)
    return dict(setup=setup, admissions=("last", "vllm", "dense"), evictions=("lru", "lfu"),
                prefill_flops=flops, min_window=10)


def test_child_decides_exactly_as_in_process():
    reqs = workload()
    here = PolicyController(None, **controller_kwargs())
    child = ShadowProcess(**controller_kwargs())
    try:
        for i, req in enumerate(reqs):
            assert child.observe(i, req) == here.observe(i, req)
    finally:
        child.close()
    assert here.switches, "the workload should make the controller switch"
    assert child._proc.poll() is not None      # noqa: SLF001 - closed means exited


def test_a_batch_in_one_round_trip_decides_as_one_by_one():
    """``observe_many`` (the plugin's worker thread hands over 16 finished requests at a
    time) returns, in order, the decision each request's own ``observe`` would."""
    reqs = workload()
    here = PolicyController(None, **controller_kwargs())
    expected = [here.observe(i, req) for i, req in enumerate(reqs)]
    child = ShadowProcess(**controller_kwargs())
    try:
        got = []
        for start in range(0, len(reqs), 16):
            got += child.observe_many([(i, reqs[i]) for i in range(start, min(start + 16, len(reqs)))])
    finally:
        child.close()
    assert got == expected
    assert sum(d is not None for d in got) == len(here.switches) > 0


def test_once_settled_the_child_says_so_and_the_worker_stops_handing_over():
    """Settling (one shadow left): the child reports the controller's ``settled_at``, and
    the plugin's controller thread ends the child and hands no later request over."""
    from vllm_admission.plugin.background import ControllerThread

    kw = controller_kwargs() | dict(admissions=("vllm", "none"), evictions=("lru",), max_window=20)
    reqs = workload(120)
    here = PolicyController(None, **kw)
    for i, req in enumerate(reqs):
        here.observe(i, req)
    assert here.settled_at is not None and here.settled_at < 100   # `none` saves nothing
    thread = ControllerThread(ShadowProcess(**kw))
    child = thread.controller
    for i, req in enumerate(reqs):
        thread.submit(i, req)
    assert thread.drain(timeout=60)
    assert child.settled_at == here.settled_at and thread.settled
    assert child._proc.poll() is not None        # noqa: SLF001 - ended when it settled
    thread.submit(len(reqs), reqs[0])             # handed over, read by no one: no error
    assert thread.drain(timeout=60) and thread.error is None
    thread.stop()


def test_once_settled_the_scheduler_hands_no_finished_request_over():
    """The scheduler side: ``BackgroundTuning.on_finished`` stops reducing finished vLLM
    requests for ``auto`` once its controller settled."""
    from types import SimpleNamespace

    from vllm_admission.core.admission import HitProbe
    from vllm_admission.plugin.background import BackgroundTuning

    kw = controller_kwargs() | dict(admissions=("vllm", "none"), evictions=("lru",), max_window=20)
    controller = PolicyController(None, **kw)
    seen = []
    observe = controller.observe
    controller.observe = lambda i, req: (seen.append(i), observe(i, req))[1]   # type: ignore[method-assign]
    tuning = BackgroundTuning(make_tuner=None, controller=controller, block_size=B,
                              hashes_per_block=1, sub_block=False, prefill_flops=None,
                              in_thread=False)
    for req in workload(120):
        vllm_request = SimpleNamespace(block_hashes=[k.to_bytes(8, "big", signed=True) + bytes(24)
                                                     for k in req.hashes],
                                       num_output_tokens=req.output_len)
        tuning.on_finished(vllm_request, HitProbe(req.prompt_len, B, 0, 0), evicted_so_far=False)
    assert controller.settled_at is not None
    assert seen == list(range(controller.settled_at + 1))


def test_child_errors_come_back_as_one_exception():
    with pytest.raises(ShadowProcessError, match="UserError: the decision interval"):
        ShadowProcess(**{**controller_kwargs(), "min_window": 0})
    child = ShadowProcess(**controller_kwargs())
    child._proc.kill()                          # noqa: SLF001 - the child dies
    child._proc.wait()                          # noqa: SLF001
    with pytest.raises(ShadowProcessError, match="is gone"):
        child.observe(0, workload(1)[0])
    child.close()


@pytest.mark.parametrize("nice", [0, 7, 19])
def test_child_runs_at_the_priority_asked(nice):
    """The child lowers its own priority by ``nice`` (the plugin's default: 19, the
    lowest), so that on cores the engine needs it runs on the time the engine leaves."""
    child = ShadowProcess(nice=nice, **controller_kwargs())
    try:
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == min(base + nice, 19)
        assert child.observe(0, workload(1)[0]) is None     # and it still serves
    finally:
        child.close()
    assert DEFAULT_NICE == 19


@pytest.mark.parametrize("nice", [-1, 20, 2.5, "19"])
def test_a_priority_out_of_range_is_refused_before_any_child_starts(nice):
    with pytest.raises(ValueError, match="nice must be an integer from 0 to 19"):
        ShadowProcess(nice=nice, **controller_kwargs())
