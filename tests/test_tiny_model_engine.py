"""Real-engine tests: the tiny hybrid models on stock vLLM 0.32 with prefix caching.

The module runs once per ``engine_cases.ENGINE_CASES`` entry: the tiny Qwen3-Next (Gated
DeltaNet) model per pinned SSM state dtype (bf16 gives 128-token blocks, float32 256) and
the tiny Nemotron-H (Mamba2) model with its default float32 state, one engine per run;
more tests start an engine with vLLM's platform default for each arch, whatever this CPU
makes of it, and the Mamba2 model with a bf16 state. "Stock" for the Mamba2 model means
vLLM with :func:`vllm_admission.plugin.repairs.cpu_mamba2.install` (which ``build_llm`` applies):
without it vLLM 0.32's CPU engine fails at its first prefill (``docs/engine-facts.md``,
section 0). The block size
``B`` is read from the live engine after checking it against the core's derivation, and
every expected number below is derived from it (``docs/engine-facts.md``).

Derivations used below:

* vLLM never serves a prompt's last token from the cache (it needs that
  token's logits), so a hit is at most ``P - 1`` tokens, and hits are whole
  blocks: an identical prompt of P tokens sent again hits
  ``floor((P - 1) / B) * B`` tokens. The first request also leaves a Mamba
  state at exactly that position (its prefill is cut there), so the hybrid hit
  is not shortened by the recurrent group.
* Junction scenario: prefix of 1500 tokens, prompts = prefix + 1 distinct
  token + the same 300 tokens. Prompts share ``S = floor(1500 / B) * B``
  tokens. With the prefix sent first, its prefill leaves a Mamba state at
  ``floor(1499 / B) * B = S``: every prompt hits S. Without it, prompt 1
  misses (empty cache) and leaves state only at its own
  ``floor(1800 / B) * B``; prompt 2 finds S attention tokens but no state at or
  below S -> 0, and stops its prefill at the junction S, caching the state
  there; prompts 3..10 hit S.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import random
from dataclasses import dataclass

import pytest
from engine_cases import engine_block_size, predicted_block_size
from model_output import LOGITS_MODE, assert_same_output, generate

from vllm_admission.engine.engine_geometry import EngineGeometry, KVCacheGroupInfo
from vllm_admission.engine.llm import EngineSettings, shutdown_llm
from vllm_admission.engine.llm_replay import (
    SEQUENTIAL_MODE,
    ReplayResult,
    _skip_reason,
    blocks_needed,
)
from vllm_admission.engine.tiny_model import TINY_MODEL_ARCHS

VOCAB = 512


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

# A made-up geometry (these helpers take any): 128-token blocks, one state and one attention group.
GEO_64 = EngineGeometry(
    block_size=128, num_gpu_blocks=64, max_num_batched_tokens=4096, max_model_len=7808,
    mamba_cache_mode="align",
    kv_cache_groups=(KVCacheGroupInfo(kind="state", num_layers=2, block_size=128, page_size_bytes=65536),
                     KVCacheGroupInfo(kind="attention", num_layers=2, block_size=128,
                                      page_size_bytes=65536)))


def test_blocks_needed_counts_every_group():
    # 7808 tokens = 61 attention blocks + 2 Mamba state blocks = 63 = 64 - null block.
    # KV for P + O - 1 tokens: 7,807 -> 61 attention blocks + 2 Mamba blocks = 63 = 64 - null.
    assert blocks_needed(7600, 208, GEO_64) == 63
    assert blocks_needed(7600, 209, GEO_64) == 63  # 7,808 tokens of KV: still 61 blocks
    assert blocks_needed(7600, 210, GEO_64) == 64
    assert blocks_needed(1, 1, GEO_64) == 3
    with pytest.raises(ValueError):
        blocks_needed(0, 1, GEO_64)


def test_skip_reasons():
    assert _skip_reason(7700, 108, GEO_64) is None
    assert _skip_reason(7700, 109, GEO_64) == "longer than max_model_len"
    geo = dataclasses.replace(GEO_64, max_model_len=100_000)
    assert _skip_reason(7700, 109, geo) is None  # 7,808 tokens of KV fit (63 blocks)
    assert _skip_reason(7700, 110, geo) == "needs more KV blocks than the pool holds"
    assert _skip_reason(0, 5, GEO_64) == "empty prompt"
    assert _skip_reason(5, 0, GEO_64) == "output_len < 1"


def test_spec_without_export_changes_only_the_export():
    """cpu_mamba2's spec: vLLM's own MambaSpec with the prefill-checkpoint fields of a
    layer that declares no export (what 0.32's GDN layers declare)."""
    import dataclasses

    torch = pytest.importorskip("torch")
    kv = pytest.importorskip("vllm.v1.kv_cache_interface")
    from vllm_admission.plugin.repairs.cpu_mamba2 import spec_without_export

    spec = kv.MambaSpec(block_size=128, shapes=((3, 512), (4, 64, 64)),
                        dtypes=(torch.bfloat16, torch.float32), mamba_cache_mode="align",
                        num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
    plain = spec_without_export(spec)
    assert (plain.num_prefill_checkpoint_blocks, plain.prefill_checkpoint_alignment) == (0, None)
    assert dataclasses.replace(plain, num_prefill_checkpoint_blocks=1,
                               prefill_checkpoint_alignment=1) == spec
    assert spec_without_export(plain) is plain


# ------------------------------------------------------------------ engine fixtures


@contextlib.contextmanager
def stock_engine(model_dir, **settings):
    """Stock vLLM on ``model_dir`` (this project's general plugin, and any other, kept out),
    shut down afterwards with the environment restored."""
    pytest.importorskip("vllm")
    from vllm_admission.engine.llm import build_llm

    saved = dict(os.environ)
    settings["engine_args"] = {**LOGITS_MODE, **settings.get("engine_args", {})}
    engine = build_llm(EngineSettings(model=str(model_dir), env={"VLLM_PLUGINS": ""}, **settings))
    try:
        yield engine
    finally:
        shutdown_llm(engine)
        del engine
        gc.collect()
        os.environ.clear()
        os.environ.update(saved)
        # vLLM loads general plugins once per process; with VLLM_PLUGINS="" that "once"
        # loaded nothing. Let a later engine in this pytest process load the plugins it asks for.
        import vllm.plugins

        vllm.plugins.plugins_loaded = False


@pytest.fixture(scope="module")
def ssm_dtype(engine_case):
    """This module instance's pinned SSM state dtype (``engine_cases.ENGINE_CASES``)."""
    return engine_case[1]


@pytest.fixture(scope="module")
def llm(engine_model_dir, ssm_dtype):
    with stock_engine(engine_model_dir, mamba_ssm_cache_dtype=ssm_dtype) as engine:
        yield engine


@pytest.fixture(scope="module")
def B(llm, engine_model_dir, ssm_dtype):  # noqa: N802 - the block size, as in the docs
    """The live engine's block size, checked against the core's derivation for this dtype."""
    block = engine_block_size(llm)
    assert block == predicted_block_size(engine_model_dir, ssm_dtype)
    return block


def state_specs(llm):
    """The live engine's ``MambaSpec`` per state group."""
    from vllm.v1.kv_cache_interface import MambaSpec

    from vllm_admission.engine.llm import inprocess_scheduler

    groups = inprocess_scheduler(llm).kv_cache_config.kv_cache_groups
    return [g.kv_cache_spec for g in groups if isinstance(g.kv_cache_spec, MambaSpec)]


def one(llm, prompt: list[int], max_tokens: int = 4) -> tuple[int, list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
    return int(out.num_cached_tokens), list(out.outputs[0].token_ids)


def output(llm, prompt: list[int], max_tokens: int = 4):
    """The request's ``model_output.Output`` (tokens, top logits, prefill passes)."""
    return generate(llm, [prompt], max_tokens)[0]


# ------------------------------------------------------------------ engine tests


@pytest.mark.engine
@pytest.mark.parametrize("arch", TINY_MODEL_ARCHS)
def test_tiny_model_is_idempotent_and_has_a_tokenizer(tiny_model_of, arch):
    import json

    from transformers import AutoTokenizer

    from vllm_admission.engine.tiny_model import make_tiny_model, tiny_model_config_kwargs

    model_dir = tiny_model_of(arch)
    weights = model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert make_tiny_model(model_dir, arch=arch) == model_dir
    assert weights.stat().st_mtime_ns == mtime  # not rebuilt
    config = json.loads((model_dir / "config.json").read_text())
    expected = {"qwen3-next": "Qwen3NextForCausalLM", "nemotron-h": "NemotronHForCausalLM"}[arch]
    assert config["architectures"] == [expected]
    assert config["vocab_size"] == tiny_model_config_kwargs(arch=arch)["vocab_size"] == VOCAB
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = "The prefix cache keeps a recurrent state, 42 times!"
    ids = tok(text)["input_ids"]
    assert ids and max(ids) < VOCAB
    assert tok.decode(ids) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)


@pytest.mark.engine
def test_engine_geometry(llm, B, ssm_dtype):
    from vllm_admission.engine.llm import engine_geometry

    geo = engine_geometry(llm)
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    assert geo.inprocess is True
    assert geo.block_size == B
    assert geo.mamba_ssm_cache_dtype == ssm_dtype
    assert geo.ssm_state_dtype == ssm_dtype
    assert geo.mamba_cache_mode == "align"
    assert geo.max_model_len == 131072
    assert geo.max_num_batched_tokens == 4096
    kinds = {g.kind: g.num_layers for g in geo.kv_cache_groups}
    assert kinds == {"state": 2, "attention": 2}  # both recipes: 2 recurrent + 2 attention layers
    # No state group declares vLLM's in-pass prefill-checkpoint export on CPU (GDN layers
    # never do in 0.32; Mamba2 layers do, and cpu_mamba2 turns it off), so the scheduler ends
    # a chunk at every prompt-end checkpoint and the derivations below hold for both.
    assert all(spec.num_prefill_checkpoint_blocks == 0 for spec in state_specs(llm))
    assert {g.block_size for g in geo.kv_cache_groups} == {B}
    # The attention page is B tokens x 2 KV heads x 64 x (K, V) x 2 bytes; the state page is
    # padded to it. A block id costs the largest group's pages: VLLM_CPU_KVCACHE_SPACE=1 GiB
    # over 2 layers of one page each.
    page = B * 2 * 64 * 2 * 2
    assert {g.page_size_bytes for g in geo.kv_cache_groups} == {page}
    assert geo.num_gpu_blocks == (1 << 30) // (2 * page)


@pytest.mark.engine
def test_repeated_prompt_hits_last_full_block_before_last_token(llm, B):
    for p_len in (1000, 1025, 2 * B + 1):
        llm.reset_prefix_cache()
        prompt = toks(p_len, p_len)
        out1, out2 = output(llm, prompt), output(llm, prompt)
        assert out1.cached == 0
        assert out2.cached == (p_len - 1) // B * B
        # The hit cuts the prompt elsewhere: the same model output (tests/model_output.py).
        assert_same_output([out1], [out2], label=p_len)
    assert (1025 - 1) // B * B > (1000 - 1) // B * B  # the cases differ in both geometries


@pytest.mark.engine
def test_greedy_outputs_are_identical(llm):
    llm.reset_prefix_cache()
    prompt = toks(11, 333)
    a = output(llm, prompt, 16)
    llm.reset_prefix_cache()
    b = output(llm, prompt, 16)
    c = output(llm, prompt, 16)  # this one is served partly from the cache
    assert len(a.tokens) == 16 and c.cached > 0
    assert_same_output([a], [b], exact=True)  # the same computation, the same bytes
    assert_same_output([a], [c])  # another cut: within rounding


@pytest.mark.engine
def test_junction_scenario_exact_hits(llm, B):
    prefix, suffix = toks(2, 1500), toks(3, 300)
    prompts = [prefix + [3 + i] + suffix for i in range(10)]
    shared = 1500 // B * B  # = floor(1499 / B) * B, the prefix request's checkpoint
    assert shared == 1499 // B * B > 0

    llm.reset_prefix_cache()
    assert one(llm, prefix)[0] == 0
    assert [one(llm, p)[0] for p in prompts] == [shared] * 10

    llm.reset_prefix_cache()
    assert [one(llm, p)[0] for p in prompts] == [0, 0] + [shared] * 8


@pytest.mark.engine
def test_second_turn_hits_prompt_checkpoint_not_decode_boundary(llm, B):
    from vllm_admission.engine.llm import cached_block_positions

    llm.reset_prefix_cache()
    first = toks(4, 1000)
    # Enough output to cross the next block boundary after the prompt in either geometry.
    checkpoint = 999 // B * B
    output_len = checkpoint + 2 * B - 1000 + 1
    _, out = one(llm, first, output_len)
    computed = 1000 + output_len - 1  # the last output token's KV is never computed
    cached = cached_block_positions(llm)
    # Every full attention block is cached, decode ones included, but the only Mamba state
    # is the prompt checkpoint floor(999 / B) * B.
    assert cached["0:state"] == [checkpoint]
    assert cached["1:attention"] == [B * i for i in range(1, computed // B + 1)]
    assert computed // B * B > checkpoint + B - 1  # a decode block boundary lies past it
    # So turn 2 = turn 1 prompt + its output + 700 new tokens hits the checkpoint only.
    assert one(llm, first + out + toks(5, 700))[0] == checkpoint


def platform_default_ssm_dtype(model_dir) -> str:
    """The SSM state dtype vLLM's CPU platform gives ``model_dir`` with "auto": float32 on
    CPUs with AVX-512 BF16 (``vllm/platforms/cpu.py`` ``check_and_update_config``), the
    model's own choice elsewhere (the core's reading of "auto": the model dtype for
    Qwen3-Next, the config's ``mamba_ssm_cache_dtype`` for Nemotron-H)."""
    import torch

    from vllm_admission.core.costs import ModelCosts

    if torch.cpu._is_avx512_bf16_supported():  # noqa: SLF001
        return "float32"
    return ModelCosts.from_config(f"{model_dir}/config.json", mamba_ssm_cache_dtype="auto").ssm_dtype


@pytest.mark.engine
@pytest.mark.parametrize("arch", TINY_MODEL_ARCHS)
def test_platform_default_follows_the_cpu_rule(tiny_model_of, arch):
    """With vLLM's default ("auto"), the CPU platform and the model decide the SSM dtype
    (:func:`platform_default_ssm_dtype`); the block size follows the dtype."""
    from vllm_admission.engine.llm import engine_geometry

    model_dir = tiny_model_of(arch)
    expected = platform_default_ssm_dtype(model_dir)
    with stock_engine(model_dir, num_gpu_blocks=64, max_model_len=2048) as engine:
        geo = engine_geometry(engine)
        B = geo.block_size  # noqa: N806
        assert geo.ssm_state_dtype == expected
        assert predicted_block_size(model_dir, expected) == B
        prompt = toks(8, 700)
        assert one(engine, prompt)[0] == 0
        assert one(engine, prompt)[0] == 699 // B * B


@pytest.mark.engine
def test_mamba2_bf16_state_runs_without_the_export(tiny_model_of):
    """The Mamba2 model with a pinned bf16 state: the core's block size, no prefill-checkpoint
    export (cpu_mamba2 active on this CPU platform), and a resent prompt hits its prompt-end
    checkpoint with the same greedy output, through a two-chunk prefill."""
    from vllm_admission.engine.llm import engine_geometry
    from vllm_admission.plugin.repairs import cpu_mamba2

    model_dir = tiny_model_of("nemotron-h")
    with stock_engine(model_dir, mamba_ssm_cache_dtype="bfloat16", num_gpu_blocks=64,
                      max_model_len=2048) as engine:
        geo = engine_geometry(engine)
        B = geo.block_size  # noqa: N806
        assert geo.ssm_state_dtype == "bfloat16"
        assert predicted_block_size(model_dir, "bfloat16") == B
        assert cpu_mamba2.installed()
        specs = state_specs(engine)
        assert specs and all(s.num_prefill_checkpoint_blocks == 0 for s in specs)
        prompt = toks(9, 3 * B + 5)
        out1, out2 = output(engine, prompt, 8), output(engine, prompt, 8)
        assert (out1.cached, out2.cached) == (0, 3 * B)
        assert_same_output([out1], [out2])


@pytest.mark.engine
def test_replay_counts_hits_and_skips(llm, B):
    from vllm_admission.engine.llm_replay import replay

    llm.reset_prefix_cache()
    p_len = 2 * B + 72
    hit = (p_len - 1) // B * B  # = 2 B
    p = tuple(toks(6, p_len))
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
    assert [r["cached_tokens"] for r in res.requests] == [0, None, hit]
    assert res.prompt_tokens == 2 * p_len and res.hit_tokens == hit
    assert res.token_hit_rate == pytest.approx(hit / (2 * p_len))
    assert res.requests[0]["output_tokens"] == res.requests[2]["output_tokens"]
    assert len(res.requests[0]["output_tokens"]) == 4
    assert res.engine_prefix_cache_queries == 2 * p_len
    assert res.engine_prefix_cache_hits == hit
    with pytest.raises(ValueError):
        replay(llm, [], vocab_size=VOCAB, mode="batched")


@pytest.mark.engine
def test_replay_accepts_trace_requests(llm, B):
    traces = pytest.importorskip("vllm_admission.core.traces")
    from vllm_admission.core.traces.prompts import TokenPrompt
    from vllm_admission.engine.llm_replay import replay

    llm.reset_prefix_cache()
    prompt = TokenPrompt(tuple(toks(7, B + 44)))
    reqs = [traces.Request(f"r{i}", prompt, 2, None, None) for i in range(2)]
    res = replay(llm, reqs, vocab_size=VOCAB)
    assert [r["cached_tokens"] for r in res.requests] == [0, B]  # floor((B + 43) / B) * B
    assert res.skipped == {}
