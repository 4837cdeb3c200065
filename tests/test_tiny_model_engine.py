"""Real-engine tests: the tiny Qwen3-Next hybrid model on stock vLLM 0.32 with prefix caching.

One engine is started for the whole module (about 7 s of engine construction
after a ~20 s first import of vLLM on a 2-core CPU machine). The numbers
asserted here are the ones measured by ``scripts/engine_probe.py`` and
explained in ``docs/engine-facts.md``.

Derivations used below (B = block size = 128 tokens for this model):

* vLLM never serves a prompt's last token from the cache (it needs that
  token's logits), so a hit is at most ``P - 1`` tokens, and hits are whole
  blocks: an identical prompt of P tokens sent again hits
  ``floor((P - 1) / B) * B`` tokens. The first request also leaves a Mamba
  state at exactly that position (its prefill is cut there), so the hybrid hit
  is not shortened by the recurrent group.
  P = 1000 -> 7 * 128 = 896; P = 1025 -> 8 * 128 = 1024.
* Junction scenario: prefix of 1500 tokens, prompts = prefix + 1 distinct
  token + the same 300 tokens. Prompts share ``floor(1500 / B) = 11`` full
  blocks = 1408 tokens. With the prefix sent first, its prefill leaves a
  Mamba state at ``floor(1499 / B) * B = 1408``: every prompt hits 1408.
  Without it, prompt 1 misses (empty cache) and leaves state only at its own
  ``floor(1800 / B) * B = 1792``; prompt 2 finds 1408 attention tokens but no
  state at or below 1408 -> 0, and stops its prefill at the junction 1408,
  caching the state there; prompts 3..10 hit 1408.
"""

from __future__ import annotations

import gc
import os
import random
import time
from dataclasses import dataclass

import pytest

from vllm_admission.engine.replay import (
    SEQUENTIAL_MODE,
    EngineSettings,
    ReplayResult,
    _skip_reason,
    blocks_needed,
)

VOCAB = 512
B = 128  # measured block size of the tiny model; asserted against the engine below


@dataclass(frozen=True)
class StandInRequest:
    """Minimal request with the members replay() uses."""

    request_id: str
    tokens: tuple[int, ...]
    output_len: int
    declared_len: int | None = None  # prompt_len without materialising tokens

    @property
    def prompt_len(self) -> int:
        return self.declared_len if self.declared_len is not None else len(self.tokens)

    def token_ids(self, vocab_size: int) -> list[int]:
        assert all(0 <= t < vocab_size for t in self.tokens)
        return list(self.tokens)


def toks(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


# ------------------------------------------------------------------ pure helpers (no engine)

GEO_64 = {
    "block_size": 128,
    "num_gpu_blocks": 64,
    "max_model_len": 7808,
    "mamba_cache_mode": "align",
    "kv_cache_groups": [{"kind": "mamba"}, {"kind": "full_attention"}],
}


def test_blocks_needed_counts_every_group():
    # 7808 tokens = 61 attention blocks + 2 Mamba state blocks = 63 = 64 - null block.
    assert blocks_needed(7808, GEO_64) == 63
    assert blocks_needed(7809, GEO_64) == 64
    assert blocks_needed(1, GEO_64) == 3
    with pytest.raises(ValueError):
        blocks_needed(-1, GEO_64)


def test_skip_reasons():
    assert _skip_reason(7700, 108, GEO_64) is None
    assert _skip_reason(7700, 109, GEO_64) == "longer than max_model_len"
    geo = dict(GEO_64, max_model_len=100_000)
    assert _skip_reason(7700, 109, geo) == "needs more KV blocks than the pool holds"
    assert _skip_reason(0, 5, GEO_64) == "empty prompt"
    assert _skip_reason(5, 0, GEO_64) == "output_len < 1"


# ------------------------------------------------------------------ engine fixtures


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from vllm_admission.engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_qwen3_next"))


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    pytest.importorskip("vllm")
    from vllm_admission.engine.replay import build_llm

    saved = dict(os.environ)
    t0 = time.perf_counter()
    # Stock vLLM: keep this project's general plugin (and any other) out of the engine.
    engine = build_llm(EngineSettings(model=str(tiny_model_dir), env={"VLLM_PLUGINS": ""}))
    engine._probe_start_seconds = time.perf_counter() - t0  # noqa: SLF001
    yield engine
    del engine
    gc.collect()
    os.environ.clear()
    os.environ.update(saved)
    # vLLM loads general plugins once per process; with VLLM_PLUGINS="" that "once" loaded
    # nothing. Let a later engine in this pytest process load the plugins it asks for.
    import vllm.plugins

    vllm.plugins.plugins_loaded = False


def one(llm, prompt: list[int], max_tokens: int = 4) -> tuple[int, list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
    return int(out.num_cached_tokens), list(out.outputs[0].token_ids)


# ------------------------------------------------------------------ engine tests


@pytest.mark.engine
def test_tiny_model_is_idempotent(tiny_model_dir):
    from vllm_admission.engine.tiny_model import make_tiny_model

    weights = tiny_model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    t0 = time.perf_counter()
    assert make_tiny_model(tiny_model_dir) == tiny_model_dir
    assert time.perf_counter() - t0 < 1.0
    assert weights.stat().st_mtime_ns == mtime


@pytest.mark.engine
def test_engine_geometry(llm):
    from vllm_admission.engine.replay import engine_geometry

    geo = engine_geometry(llm)
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    assert geo["inprocess"] is True
    assert geo["block_size"] == B
    assert geo["mamba_cache_mode"] == "align"
    assert geo["max_model_len"] == 131072
    assert geo["max_num_batched_tokens"] == 4096
    assert geo["num_gpu_blocks"] == 8192  # VLLM_CPU_KVCACHE_SPACE=1 GiB / 2 layers / 64 KiB pages
    kinds = {g["kind"]: g["num_layers"] for g in geo["kv_cache_groups"]}
    assert kinds == {"mamba": 2, "full_attention": 2}
    assert {g["block_size"] for g in geo["kv_cache_groups"]} == {B}


@pytest.mark.engine
def test_repeated_prompt_hits_last_full_block_before_last_token(llm):
    for p_len in (1000, 1025):
        llm.reset_prefix_cache()
        prompt = toks(p_len, p_len)
        first, out1 = one(llm, prompt)
        second, out2 = one(llm, prompt)
        assert first == 0
        assert second == (p_len - 1) // B * B  # 896 for 1000, 1024 for 1025
        assert out1 == out2


@pytest.mark.engine
def test_greedy_outputs_are_identical(llm):
    llm.reset_prefix_cache()
    prompt = toks(11, 333)
    _, a = one(llm, prompt, 16)
    llm.reset_prefix_cache()
    _, b = one(llm, prompt, 16)
    _, c = one(llm, prompt, 16)  # this one is served partly from the cache
    assert len(a) == 16
    assert a == b == c


@pytest.mark.engine
def test_junction_scenario_exact_hits(llm):
    prefix, suffix = toks(2, 1500), toks(3, 300)
    prompts = [prefix + [3 + i] + suffix for i in range(10)]

    llm.reset_prefix_cache()
    assert one(llm, prefix)[0] == 0
    assert [one(llm, p)[0] for p in prompts] == [1408] * 10

    llm.reset_prefix_cache()
    assert [one(llm, p)[0] for p in prompts] == [0, 0] + [1408] * 8


@pytest.mark.engine
def test_second_turn_hits_prompt_checkpoint_not_decode_boundary(llm):
    from vllm_admission.engine.replay import cached_block_positions

    llm.reset_prefix_cache()
    first = toks(4, 1000)
    _, out = one(llm, first, 100)
    cached = cached_block_positions(llm)
    # Attention blocks filled during decode are cached (1099 tokens computed -> 8 blocks),
    # but the only Mamba state is the prompt checkpoint floor(999 / 128) * 128 = 896.
    assert cached["0:mamba"] == [896]
    assert cached["1:full_attention"] == [B * i for i in range(1, 9)]
    # So turn 2 = turn 1 prompt + its output + 700 new tokens hits 896, not 1024.
    assert one(llm, first + out + toks(5, 700))[0] == 896


@pytest.mark.engine
def test_replay_counts_hits_and_skips(llm):
    from vllm_admission.engine.replay import replay

    llm.reset_prefix_cache()
    p = tuple(toks(6, 200))
    reqs = [
        StandInRequest("a", p, 4),
        StandInRequest("too-long", (), 1, declared_len=131072),  # 131073 > max_model_len
        StandInRequest("a-again", p, 4),
    ]
    res = replay(llm, reqs, vocab_size=VOCAB)
    assert isinstance(res, ReplayResult)
    assert res.mode == SEQUENTIAL_MODE
    assert [r["status"] for r in res.requests] == ["ok", "skipped: longer than max_model_len", "ok"]
    assert res.skipped == {"longer than max_model_len": 1}
    assert [r["cached_tokens"] for r in res.requests] == [0, None, 128]  # floor(199 / 128) * 128
    assert res.prompt_tokens == 400 and res.hit_tokens == 128
    assert res.token_hit_rate == pytest.approx(128 / 400)
    assert res.requests[0]["output_tokens"] == res.requests[2]["output_tokens"]
    assert len(res.requests[0]["output_tokens"]) == 4
    assert res.engine_prefix_cache_queries == 400
    assert res.engine_prefix_cache_hits == 128
    with pytest.raises(ValueError):
        replay(llm, [], vocab_size=VOCAB, mode="batched")


@pytest.mark.engine
def test_replay_accepts_trace_requests(llm):
    traces = pytest.importorskip("vllm_admission.core.traces")
    from vllm_admission.core.traces.prompts import TokenPrompt
    from vllm_admission.engine.replay import replay

    llm.reset_prefix_cache()
    prompt = TokenPrompt(tuple(toks(7, 300)))
    reqs = [traces.Request(f"r{i}", prompt, 2, None, None) for i in range(2)]
    res = replay(llm, reqs, vocab_size=VOCAB)
    assert [r["cached_tokens"] for r in res.requests] == [0, 256]  # floor(299 / 128) * 128
    assert res.skipped == {}
