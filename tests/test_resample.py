"""Long traces: the source repeated with its private content renamed, streamed into the
simulator without a list of requests (core/traces/resample.py, sim.simulator)."""

import itertools
import json
import types
from itertools import pairwise

import pytest

from vllm_admission.core.costs import load_model
from vllm_admission.core.traces import SpanPrompt, Trace, TraceError, load_trace
from vllm_admission.core.traces.resample import resample, shared_prefix_keys
from vllm_admission.sim.simulator import SimulationSettings, simulate, stream_cache_requests

B = 16


def small_trace():
    """A shared system prompt (key 0) before 12 conversations of 3 turns each."""
    reqs = []
    key = itertools.count(1)
    convs = [[0] for _ in range(12)]
    t = 0.0
    for turn in range(3):
        for c, chain in enumerate(convs):
            chain.append(next(key))
            spans = tuple((k, 2 * B) for k in chain)
            reqs.append(types.SimpleNamespace(spans=spans, t=t, name=f"r{turn}-{c}"))
            t += 1.5
    from vllm_admission.core.traces import Request
    return Trace("small", [Request(r.name, SpanPrompt(r.spans), 8, r.t, None) for r in reqs])


def test_pass_zero_is_the_source_and_later_passes_rename_all_but_shared_prefixes():
    src = small_trace()
    shared = shared_prefix_keys(src)
    assert shared == {0}
    out = list(resample(src, 2 * len(src.requests) + 5))
    assert len(out) == 2 * len(src.requests) + 5
    n = len(src.requests)
    for a, b in zip(out[:n], src.requests, strict=True):
        assert a.prompt == b.prompt and a.output_len == b.output_len and a.arrival_s == b.arrival_s
    keys0 = {k for r in out[:n] for k, _ in r.prompt.spans}
    keys1 = {k for r in out[n:2 * n] for k, _ in r.prompt.spans}
    assert keys0 & keys1 == {0}
    for a, b in zip(out[n:2 * n], src.requests, strict=True):        # same shape, same gaps
        assert [n_ for _, n_ in a.prompt.spans] == [n_ for _, n_ in b.prompt.spans]
    gaps = [b.arrival_s - a.arrival_s for a, b in pairwise(out)]
    assert min(gaps) > 0


def test_the_mooncake_system_prompt_is_shared_by_every_pass():
    src = load_trace("synthetic", num_requests=300)
    shared = shared_prefix_keys(src)
    assert shared, "the synthetic workload's system prompts and templates are shared prefixes"
    out = list(resample(src, 600))
    firsts = {r.prompt.spans[0][0] for r in out[300:]}
    assert firsts & shared


def test_streamed_and_listed_requests_give_the_same_run():
    src = load_trace("synthetic", num_requests=400)
    costs = load_model("qwen3-next-80b-a3b")
    settings = SimulationSettings.of("auto", "auto", capacity_bytes=4 << 30)
    listed = simulate(src, costs, settings)
    bs = listed.block_size
    streamed = simulate(src, costs, settings, requests=stream_cache_requests(iter(src.requests), bs))
    a, b = listed.to_record(), streamed.to_record()
    for key in ("wall_seconds", "cpu_seconds"):
        a.pop(key), b.pop(key)
    assert a == b
    assert listed.policy_decisions > 0


def test_a_long_run_keeps_the_source_hit_rate_per_pass():
    src = load_trace("synthetic", num_requests=300)
    costs = load_model("qwen3-next-80b-a3b")
    one = simulate(src, costs, SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30))
    three = simulate(src, costs, SimulationSettings.of("vllm", "lru", capacity_bytes=2 << 30),
                     requests=stream_cache_requests(resample(src, 900), one.block_size))
    assert three.requests == 900
    # Later passes hit at least as much (their shared prefixes may be cached already).
    assert three.hit_tokens >= 3 * one.hit_tokens
    assert three.prompt_tokens == 3 * one.prompt_tokens


def test_bad_input():
    src = small_trace()
    with pytest.raises(TraceError, match="num_requests"):
        next(iter(resample(src, 0)))
    with pytest.raises(TraceError, match="fanout"):
        resample(src, 5, fanout=1)
    from vllm_admission.core.traces import Request, TokenPrompt
    tokens = Trace("t", [Request("a", TokenPrompt((1, 2, 3)), 1, None, None)])
    with pytest.raises(TraceError, match="spans"):
        resample(tokens, 5)


def test_the_cli_replays_a_resampled_trace(tmp_path, capsys):
    from vllm_admission.cli import main
    rc = main(["simulate", "--trace", "synthetic", "--resample", "1500", "--capacity", "2GiB",
               "--admission", "vllm", "--eviction", "lru", "--out", str(tmp_path), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["resample"] == 1500 and doc["runs"][0]["requests"] == 1500 and doc["bound"] == []
    assert "resampled, streamed" in capsys.readouterr().out
    assert main(["simulate", "--resample", "0", "--out", str(tmp_path)]) == 2
    assert "--resample must be >= 1" in capsys.readouterr().err
    assert main(["simulate", "--shadow-rate", "2", "--out", str(tmp_path)]) == 2
    assert "shadow sample rate" in capsys.readouterr().err
