"""Tests of vllm_admission.core.geometry.

Hand-computed geometry, properties, errors, and (when vllm is installed) a
comparison with vLLM 0.32's own functions: ``Platform._align_hybrid_block_size``
(block size and state-page padding), ``get_kv_cache_groups`` (grouping) and
``get_kv_cache_configs`` (block count and the "enough memory" check), run on
vLLM's KV cache spec objects built from vLLM's model classes.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_data import MODEL_CONFIGS

from vllm_admission.core.costs import BUILTIN_MODELS, ModelCosts, load_model
from vllm_admission.core.geometry import (
    CPU_BLOCK_SIZE,
    CPU_KERNEL_BLOCK_SIZE,
    CacheGeometry,
    CapacityError,
    aligned_block_size,
    block_geometry,
    geometry_from_blocks,
    minimum_capacity_bytes,
    parse_bytes,
)
from vllm_admission.engine.tiny_model import TINY_MODEL_PARAMS, tiny_model_config_kwargs

SHARED = MODEL_CONFIGS
REAL_CONFIGS = sorted(SHARED.glob("*.json")) + sorted(SHARED.glob("unverified/*.json"))
needs_shared = pytest.mark.skipif(not REAL_CONFIGS, reason="shared model configs not present")
GiB = 2**30

TINY_QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                   "torch_dtype": "bfloat16", **TINY_MODEL_PARAMS}


def tiny_with(layer_types, **overrides):
    return ModelCosts.from_config(
        dict(TINY_QWEN3_NEXT, layer_types=layer_types, num_hidden_layers=len(layer_types)), **overrides
    )


QWEN3_NEXT = load_model("qwen3-next-80b-a3b")


# --------------------------------------------------------------------------- #
# Hand-computed
# --------------------------------------------------------------------------- #



def _vllm_kv_cache_planning():
    """vLLM's ``(get_kv_cache_configs, get_kv_cache_groups)``: in
    ``v1/core/kv_cache_utils.py`` in 0.32, moved to ``v1/core/kv_cache_planning.py`` in 0.33."""
    try:
        from vllm.v1.core import kv_cache_planning as mod
    except ImportError:
        from vllm.v1.core import kv_cache_utils as mod
        return mod.get_kv_cache_configs, mod.get_kv_cache_groups

    def get_kv_cache_configs(vllm_config, specs, memory):
        # 0.33 takes the whole model's groups, as EngineCore computes them (v1/engine/core.py).
        groups = mod.get_global_kv_cache_groups(vllm_config, specs)
        return mod.get_kv_cache_configs(vllm_config, specs, memory, groups)

    return get_kv_cache_configs, mod.get_kv_cache_groups


def test_qwen3_next_geometry_by_hand():
    # Attention page per token and layer: 2 (K, V) * 2 kv heads * 256 * 2 bytes = 2048.
    # State page: 1097728 bytes (see test_costs). CUDA: block 16, kernel multiple of 16:
    #   align = max(16, 16) = 16; 16 * ceil(1097728 / (16 * 2048)) = 16 * ceil(33.5) = 544 tokens.
    # Page = 544 * 2048 = 1114112 bytes; the state page is padded by 16384 bytes (1.5 %).
    # Groups: 12 attention, 36 GDN layers: min 12, 36 >= 1.5 * 12 -> group size 12,
    #   1 attention group + 36 / 12 = 3 state groups. One block id: 12 * 1114112 = 13369344 bytes.
    # 10 GiB: 10737418240 // 13369344 = 803 blocks.
    geometry = block_geometry(QWEN3_NEXT, 10 * GiB)
    assert geometry == CacheGeometry(
        block_size=544,
        num_blocks=803,
        page_bytes=1114112,
        group_size=12,
        num_attention_groups=1,
        num_state_groups=3,
        attention_page_bytes=1114112,
        state_page_bytes=1097728,
        num_sliding_groups=0,
    )
    assert geometry.bytes_per_block == 13369344
    assert geometry.state_padding_bytes == 16384
    assert geometry.usable_blocks == 802
    # A 4096-token prompt: ceil(4096 / 544) = 8 KV blocks; one saved state: 3 blocks.
    assert geometry.kv_blocks(4096) == 8
    assert geometry.state_blocks() == 3


def test_user_block_size_is_the_alignment_start():
    # --block-size 64: align = 64; 64 * ceil(1097728 / (64 * 2048)) = 64 * 9 = 576.
    assert aligned_block_size(QWEN3_NEXT, 64) == 576
    # A block already large enough is only rounded to the kernel multiple: 1000 -> 1008.
    assert aligned_block_size(QWEN3_NEXT, 1000) == 1008
    # Blackwell FA4 head_dim-256 kernel: start and kernel block 128: 128 * ceil(1097728 / 262144) = 640.
    assert aligned_block_size(QWEN3_NEXT, 128, kernel_block_size=128) == 640
    # CPU backend: default block 128, kernel multiple of 32: 128 * ceil(1097728 / 262144) = 640.
    assert aligned_block_size(QWEN3_NEXT, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE) == 640


def test_guide_tiny_model_gets_block_256_on_cpu():
    # vllm-integration.md: the tiny Qwen3-Next got block_size 256 on the CPU backend. That
    # machine's CPU had AVX-512 BF16, where vLLM's CPU platform stores the GDN state in float32
    # (vllm/platforms/cpu.py; elsewhere it stays bf16, docs/engine-facts.md section 0).
    # Attention page per token: 2 * 2 * 64 * 2 = 512. Float32 state:
    # conv 3 * 512 * 2 = 3072 + state 4 * 64 * 64 * 4 = 65536 -> 68608 bytes.
    # align = max(32, 128) = 128; 128 * ceil(68608 / (128 * 512)) = 128 * 2 = 256.
    costs = ModelCosts.from_config(TINY_QWEN3_NEXT, mamba_ssm_cache_dtype="float32")
    assert aligned_block_size(costs, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE) == 256
    # With a bf16 state (35840 bytes) one 128-token page (65536 bytes) would have sufficed.
    assert aligned_block_size(ModelCosts.from_config(TINY_QWEN3_NEXT), 128, kernel_block_size=32) == 128


def _gdn_config(which: str) -> dict:
    """The raw config of the built-in Qwen3-Next or of the tiny model (as its Qwen3NextConfig kwargs)."""
    if which == "qwen3-next":
        path = Path(QWEN3_NEXT.source)
        assert path.name == BUILTIN_MODELS["qwen3-next-80b-a3b"][0]
        return json.loads(path.read_text())
    return {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", **tiny_model_config_kwargs()}


def _gdn_expectations(cfg: dict, ssm_bytes: int, start: int, kernel: int) -> tuple[int, int, int, int]:
    """(conv elements, SSM elements, attention page bytes per token, aligned block size) of one layer.

    From the config's shapes alone.

    vLLM's ``MambaStateShapeCalculator.gated_delta_net_state_shape`` (TP 1): conv state
    ``(kernel - 1) x (2 * Hk * dk + Hv * dv)`` in the model dtype (bf16), temporal (SSM) state
    ``Hv x dv x dk`` in the SSM dtype (``ssm_bytes`` per element). Attention page per token:
    K and V, ``kv_heads * head_dim`` bf16 each. Block: ``Platform._align_hybrid_block_size``.
    """
    conv = (cfg["linear_conv_kernel_dim"] - 1) * (
        2 * cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
        + cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
    )
    ssm = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"] * cfg["linear_key_head_dim"]
    state_page = 2 * conv + ssm_bytes * ssm
    attn_per_token = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    align = max(kernel, start)
    size = align * math.ceil(state_page / (align * attn_per_token))
    return conv, ssm, attn_per_token, max(start, kernel * math.ceil(size / kernel))


def _num_gdn_layers(cfg: dict) -> int:
    if "layer_types" in cfg:
        return cfg["layer_types"].count("linear_attention")
    return cfg["num_hidden_layers"] - cfg["num_hidden_layers"] // cfg["full_attention_interval"]


@pytest.mark.parametrize("which", ["qwen3-next", "tiny"])
@pytest.mark.parametrize("start, kernel", [(16, 16), (CPU_BLOCK_SIZE, CPU_KERNEL_BLOCK_SIZE)], ids=["cuda", "cpu"])
def test_ssm_cache_dtype_scales_the_state_page_and_the_block_size(which, start, kernel):
    cfg = _gdn_config(which)
    costs = {d: ModelCosts.from_config(cfg, mamba_ssm_cache_dtype=d) for d in ("auto", "bfloat16", "float32")}
    # "auto" resolves as vLLM does on a GPU: Qwen3-Next keeps its GDN state in the model dtype.
    assert {d: c.ssm_dtype for d, c in costs.items()} == {"auto": "bfloat16", "bfloat16": "bfloat16",
                                                          "float32": "float32"}
    assert {d: c.mamba_ssm_cache_dtype for d, c in costs.items()} == {d: d for d in costs}
    assert costs["auto"].state_bytes == costs["bfloat16"].state_bytes
    # Only the SSM share of the state doubles: ratio (2 conv + 4 ssm) / (2 conv + 2 ssm).
    conv, ssm, attn_per_token, bf16_block = _gdn_expectations(cfg, 2, start, kernel)
    *_, fp32_block = _gdn_expectations(cfg, 4, start, kernel)
    layers = _num_gdn_layers(cfg)
    assert costs["bfloat16"].state_bytes == layers * (2 * conv + 2 * ssm)
    assert costs["float32"].state_bytes == layers * (2 * conv + 4 * ssm)
    assert Fraction(costs["float32"].state_bytes, costs["bfloat16"].state_bytes) == Fraction(
        2 * conv + 4 * ssm, 2 * conv + 2 * ssm)
    assert costs["float32"].kv_bytes_per_token == costs["bfloat16"].kv_bytes_per_token
    # The larger state page needs a larger attention page, so a larger aligned block.
    blocks = {d: aligned_block_size(c, start, kernel_block_size=kernel) for d, c in costs.items()}
    assert blocks == {"auto": bf16_block, "bfloat16": bf16_block, "float32": fp32_block}
    assert fp32_block > bf16_block
    # Same capacity: the float32 geometry's pages are larger, so fewer blocks (num_blocks =
    # capacity // (layers per group * block_size * attention page per token)).
    capacity = 64 * GiB
    geo = {d: block_geometry(costs[d], capacity, block_size=start, kernel_block_size=kernel)
           for d in ("bfloat16", "float32")}
    for d, g in geo.items():
        assert g.block_size == blocks[d]
        assert g.page_bytes == g.block_size * attn_per_token
        assert g.num_blocks == capacity // (g.group_size * g.block_size * attn_per_token)
    assert geo["float32"].num_blocks < geo["bfloat16"].num_blocks


def test_ssm_cache_dtype_block_sizes_by_hand():
    # The same rule with the numbers written out (derivations in the two tests above).
    # Qwen3-Next, CUDA: float32 state 49152 + 32*128*128*4 = 2146304 bytes; 16 * ceil(2146304 / 32768) = 1056.
    f32 = load_model("qwen3-next-80b-a3b", mamba_ssm_cache_dtype="float32")
    assert (aligned_block_size(QWEN3_NEXT), aligned_block_size(f32)) == (544, 1056)
    # Tiny model, CPU: bf16 state 35840 bytes fits one 128-token page (65536); float32 68608 needs 256.
    tiny = {d: ModelCosts.from_config(_gdn_config("tiny"), mamba_ssm_cache_dtype=d) for d in ("bfloat16", "float32")}
    assert {d: aligned_block_size(c, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE)
            for d, c in tiny.items()} == {"bfloat16": 128, "float32": 256}


@pytest.mark.parametrize(
    "layer_types, group_size, attention_groups, state_groups",
    [
        # 2 attention, 2 GDN: one bucket each, equal sizes -> group size 2.
        (["linear_attention", "full_attention"] * 2, 2, 1, 1),
        # 2 attention, 6 GDN: 6 >= 1.5 * 2 -> size 2; 6 / 2 = 3 state groups.
        ((["linear_attention"] * 3 + ["full_attention"]) * 2, 2, 1, 3),
        # 3 attention, 4 GDN: 4 < 1.5 * 3 -> size 4; the attention group gets one padding layer.
        (["full_attention", "linear_attention"] * 3 + ["linear_attention"], 4, 1, 1),
        # 3 attention, 7 GDN: 7 >= 4.5 -> size 3; ceil(7 / 3) = 3 state groups.
        (["full_attention", "linear_attention"] * 3 + ["linear_attention"] * 4, 3, 1, 3),
    ],
)
def test_grouping_rule(layer_types, group_size, attention_groups, state_groups):
    geometry = block_geometry(tiny_with(layer_types), 64 * 2**20)
    assert (geometry.group_size, geometry.num_attention_groups, geometry.num_state_groups) == (
        group_size,
        attention_groups,
        state_groups,
    )


def test_attention_only_model_is_one_group():
    costs = ModelCosts.from_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "torch_dtype": "bfloat16",
        }
    )
    geometry = block_geometry(costs, 2**20)
    # 16 tokens * 2 * 4 heads * 16 * 2 bytes = 4096-byte pages, all 3 layers in one group.
    assert (geometry.block_size, geometry.page_bytes, geometry.group_size) == (16, 4096, 3)
    assert (geometry.num_attention_groups, geometry.num_state_groups) == (1, 0)
    assert geometry.num_blocks == 2**20 // (3 * 4096)


# --------------------------------------------------------------------------- #
# Properties
# --------------------------------------------------------------------------- #


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 2**40))
def test_num_blocks_is_the_floor_of_capacity_over_block_bytes(capacity):
    try:
        geometry = block_geometry(QWEN3_NEXT, capacity)
    except CapacityError:
        assert capacity < minimum_capacity_bytes(block_geometry(QWEN3_NEXT, 10 * GiB))
        return
    assert geometry.num_blocks * geometry.bytes_per_block <= capacity
    assert capacity < (geometry.num_blocks + 1) * geometry.bytes_per_block
    assert geometry.capacity_used_bytes <= capacity


@settings(max_examples=200, deadline=None)
@given(start=st.integers(1, 4096), kernel=st.sampled_from([1, 8, 16, 32, 64, 128]))
def test_aligned_block_is_the_smallest_kernel_multiple_covering_the_state(start, kernel):
    size = aligned_block_size(QWEN3_NEXT, start, kernel_block_size=kernel)
    attention = QWEN3_NEXT.attention_layers[0].kv_bytes_per_token
    state = QWEN3_NEXT.recurrent_layers[0].state_bytes
    # Re-derive vLLM's rule by stepping instead of dividing: grow in steps of
    # align = max(kernel, start) until a page covers the state, then round up to the kernel.
    align = max(kernel, start)
    grown = align
    while grown * attention < state:
        grown += align
    rounded = grown
    while rounded % kernel:
        rounded += 1
    assert size == max(start, rounded)
    assert size * attention >= state and size % kernel == 0


@settings(max_examples=50, deadline=None)
@given(blocks=st.integers(8, 100_000))
def test_geometry_from_blocks_roundtrips(blocks):
    # 8 blocks is the minimum to serve one 544-token request (1 null + 1 KV + 3 groups * 2 states).
    reported = geometry_from_blocks(QWEN3_NEXT, blocks, 544)
    assert reported.num_blocks == blocks
    assert block_geometry(QWEN3_NEXT, reported.capacity_used_bytes) == reported


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


def test_capacity_error_states_the_minimum():
    # One 4096-token request: 1 null + ceil(4096 / 544) = 8 KV + 3 groups * 2 (align mode) = 15 blocks
    # of 13369344 bytes = 200540160 bytes.
    with pytest.raises(CapacityError, match=r"needs at least 191\.25 MiB \(200540160 bytes\)") as info:
        block_geometry(QWEN3_NEXT, 100 * 2**20, max_model_len=4096)
    assert "\n" not in str(info.value)
    assert "1 null block, 8 KV blocks, 6 state blocks" in str(info.value)
    assert block_geometry(QWEN3_NEXT, 200540160, max_model_len=4096).num_blocks == 15
    with pytest.raises(CapacityError):
        block_geometry(QWEN3_NEXT, 200540159, max_model_len=4096)
    # Default: a single block of tokens, 1 + 1 + 6 = 8 blocks.
    with pytest.raises(CapacityError, match=r"serving one 544-token request"):
        block_geometry(QWEN3_NEXT, 8 * 13369344 - 1)
    # mamba_cache_mode "none" keeps one state block per group: 1 + 1 + 3 = 5.
    assert block_geometry(QWEN3_NEXT, 5 * 13369344, mamba_cache_mode="none").num_blocks == 5


def test_capacity_error_is_a_value_error():
    with pytest.raises(ValueError):
        block_geometry(QWEN3_NEXT, 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity_bytes": 1.5e9}, "capacity_bytes must be an integer"),
        ({"capacity_bytes": GiB, "block_size": 0}, "block_size must be a positive integer"),
        ({"capacity_bytes": GiB, "kernel_block_size": -16}, "kernel_block_size must be a positive integer"),
        ({"capacity_bytes": GiB, "mamba_cache_mode": "all"}, "mamba_cache_mode must be one of"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        block_geometry(QWEN3_NEXT, **kwargs)


def test_geometry_from_blocks_rejects_a_block_too_small_for_the_state():
    with pytest.raises(ValueError, match=r"block_size 16 .* vLLM would use 544"):
        geometry_from_blocks(QWEN3_NEXT, 100, 16)
    with pytest.raises(ValueError, match="num_blocks must be a positive integer"):
        geometry_from_blocks(QWEN3_NEXT, 0)
    assert geometry_from_blocks(QWEN3_NEXT, 100).block_size == 544


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4GiB", 4 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("123456", 123456),
        ("10 kB", 10_000),
        ("2tib", 2 * 2**40),
        ("1_000B", 1000),
        ("0.5KiB", 512),
        ("1.1MiB", 1153433),  # 1153433.6 rounded down
        (" 7 ", 7),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("4G", r"ambiguous unit 'G' in '4G': write GiB"),
        ("4 parsecs", r"unknown unit 'parsecs'"),
        ("", r"cannot parse byte size ''"),
        ("-1GiB", r"cannot parse byte size '-1GiB'"),
        ("GiB", r"cannot parse byte size 'GiB'"),
        ("1.2.3", r"cannot parse"),
    ],
)
def test_parse_bytes_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_bytes(text)


# --------------------------------------------------------------------------- #
# vLLM 0.32 reference
# --------------------------------------------------------------------------- #


@functools.cache
def _fake_cuda_backend():
    """vLLM's CPU attention backend class with CUDA FlashAttention's kernel sizes (MultipleOf(16))."""
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    class FlashAttentionLike(CPUAttentionBackend):
        @staticmethod
        def get_supported_kernel_block_sizes(kv_cache_spec=None):
            return [MultipleOf(16)]

    return FlashAttentionLike


def _vllm_reference(model_dir: Path, raw: dict, *, start_block: int, cuda: bool, ssm_dtype: str | None,
                    capacities: list[int], max_model_len: int):
    """Block size, page, groups and num_blocks (or None where vLLM refuses) from vLLM's own code."""
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, Qwen3_5ForConditionalGenerationConfig
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    get_kv_cache_configs, get_kv_cache_groups = _vllm_kv_cache_planning()
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    is_qwen3_5 = raw["architectures"][0].startswith("Qwen3_5")
    # vLLM's qwen3_5.py imports torchvision (removed here); Qwen3.5's GDN state code is Qwen3-Next's.
    overrides = {"architectures": ["Qwen3NextForCausalLM"]} if is_qwen3_5 else {}
    model_config = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, max_model_len=max_model_len, hf_overrides=overrides
    )
    vllm_config = VllmConfig(model_config=model_config, cache_config=CacheConfig(enable_prefix_caching=True))
    cache = vllm_config.cache_config
    # GPU dtype rules, applied deterministically (the CPU platform may force float32 states).
    cache.mamba_ssm_cache_dtype = "auto"
    if is_qwen3_5:
        Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(vllm_config)
    elif model_config.architecture in MODELS_CONFIG_MAP:
        MODELS_CONFIG_MAP[model_config.architecture].verify_and_update_config(vllm_config)
    if ssm_dtype is not None:
        cache.mamba_ssm_cache_dtype = ssm_dtype
    cache.block_size = start_block
    cache.mamba_page_size_padded = None
    cache.kv_cache_layout = "LBNHC"
    backend = _fake_cuda_backend() if cuda else CPUAttentionBackend
    current_platform._align_hybrid_block_size(vllm_config, backend)
    assert cache.mamba_cache_mode == "align" and cache.mamba_block_size == cache.block_size

    model_cls, _ = ModelRegistry.resolve_model_cls(model_config.architecture, model_config=model_config)
    mamba_spec = MambaSpec(
        block_size=cache.mamba_block_size,
        shapes=model_cls.get_mamba_state_shape_from_config(vllm_config),
        dtypes=model_cls.get_mamba_state_dtype_from_config(vllm_config),
        page_size_padded=cache.mamba_page_size_padded,
        mamba_cache_mode=cache.mamba_cache_mode,
    )
    attention_spec = FullAttentionSpec(
        block_size=cache.block_size,
        num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model_config.get_head_size(),
        dtype=model_config.dtype,
    )
    # Layer kinds as transformers' config classes report them (not our JSON parsing).
    hf = model_config.hf_text_config
    kinds = getattr(hf, "layers_block_type", None) or hf.layer_types
    specs = {}
    for i, kind in enumerate(kinds):
        if kind in ("full_attention", "attention", "hybrid"):
            specs[f"layers.{i}.attn"] = attention_spec
        if kind in ("linear_attention", "mamba", "hybrid"):
            specs[f"layers.{i}.mixer"] = mamba_spec
    groups = get_kv_cache_groups(vllm_config, dict(specs))
    attention_groups = [g for g in groups if isinstance(g.kv_cache_spec, FullAttentionSpec)]
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    assert len(pages) == 1
    blocks = []
    for capacity in capacities:
        try:
            blocks.append(get_kv_cache_configs(vllm_config, [dict(specs)], [capacity])[0].num_blocks)
        except ValueError as exc:
            assert "To serve at least one request" in str(exc) or "No available memory" in str(exc)
            blocks.append(None)
    return {
        "block_size": cache.block_size,
        "page_bytes": pages.pop(),
        "group_size": max(len(g.layer_names) for g in groups),
        "num_attention_groups": len(attention_groups),
        "num_state_groups": len(groups) - len(attention_groups),
        "num_blocks": blocks,
    }


def _ours(costs, *, start_block, cuda, capacities, max_model_len):
    kernel = 16 if cuda else CPU_KERNEL_BLOCK_SIZE
    blocks = []
    for capacity in capacities:
        try:
            geometry = block_geometry(
                costs, capacity, block_size=start_block, kernel_block_size=kernel, max_model_len=max_model_len
            )
            blocks.append(geometry.num_blocks)
        except CapacityError:
            blocks.append(None)
    geometry = block_geometry(costs, 2**50, block_size=start_block, kernel_block_size=kernel)
    return {
        "block_size": geometry.block_size,
        "page_bytes": geometry.page_bytes,
        "group_size": geometry.group_size,
        "num_attention_groups": geometry.num_attention_groups,
        "num_state_groups": geometry.num_state_groups,
        "num_blocks": blocks,
    }


@pytest.fixture(scope="module")
def vllm_model_dirs(tmp_path_factory):
    pytest.importorskip("vllm")
    root = tmp_path_factory.mktemp("vllm_geometry")
    dirs = {}
    for path in REAL_CONFIGS:
        model_dir = root / path.stem
        model_dir.mkdir()
        shutil.copy(path, model_dir / "config.json")
        dirs[path.stem] = model_dir
    tiny_dir = root / "tiny-qwen3-next"
    tiny_dir.mkdir()
    (tiny_dir / "config.json").write_text(json.dumps(TINY_QWEN3_NEXT))
    dirs["tiny"] = tiny_dir
    return dirs


def _capacities_around(costs, start_block, cuda, max_model_len):
    """Capacities on both sides of the minimum, plus a few large odd ones."""
    kernel = 16 if cuda else CPU_KERNEL_BLOCK_SIZE
    layout = block_geometry(costs, 2**50, block_size=start_block, kernel_block_size=kernel)
    minimum = minimum_capacity_bytes(layout, max_model_len=max_model_len)
    return [minimum - 1, minimum, minimum + layout.bytes_per_block - 1, GiB, 8 * GiB + 12345, 70 * 10**9]


@needs_shared
@pytest.mark.parametrize("path", REAL_CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize(
    "start_block, cuda",
    [(16, True), (64, True), (CPU_BLOCK_SIZE, False)],
    ids=["cuda-default", "cuda-block64", "cpu-default"],
)
def test_geometry_matches_vllm(path, start_block, cuda, vllm_model_dirs):
    max_model_len = 4096
    costs = ModelCosts.from_config(path)
    capacities = _capacities_around(costs, start_block, cuda, max_model_len)
    raw = json.loads(path.read_text())
    expected = _vllm_reference(
        vllm_model_dirs[path.stem], raw, start_block=start_block, cuda=cuda, ssm_dtype=None,
        capacities=capacities, max_model_len=max_model_len,
    )
    ours = _ours(costs, start_block=start_block, cuda=cuda, capacities=capacities, max_model_len=max_model_len)
    assert ours == expected
    # The capacity check flips exactly at our minimum.
    assert expected["num_blocks"][0] is None and expected["num_blocks"][1] is not None


def test_tiny_model_on_cpu_matches_vllm(vllm_model_dirs):
    # The guide's measurement (block 256 on the CPU backend with float32 GDN state), from vLLM's code.
    costs = ModelCosts.from_config(TINY_QWEN3_NEXT, mamba_ssm_cache_dtype="float32")
    capacities = [GiB, 123_456_789]
    expected = _vllm_reference(
        vllm_model_dirs["tiny"], TINY_QWEN3_NEXT, start_block=CPU_BLOCK_SIZE, cuda=False, ssm_dtype="float32",
        capacities=capacities, max_model_len=2048,
    )
    assert expected["block_size"] == 256
    assert _ours(costs, start_block=CPU_BLOCK_SIZE, cuda=False, capacities=capacities, max_model_len=2048) == expected


@pytest.mark.parametrize("num_attention, num_state", [(1, 1), (2, 5), (3, 4), (4, 5), (5, 7), (6, 23), (9, 54), (7, 3)])
def test_grouping_matches_vllm(num_attention, num_state, vllm_model_dirs):
    """vLLM's get_kv_cache_groups on synthetic layer mixes vs our rule."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    _, get_kv_cache_groups = _vllm_kv_cache_planning()
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(vllm_model_dirs["tiny"]), skip_tokenizer_init=True, max_model_len=2048),
        cache_config=CacheConfig(enable_prefix_caching=True),
    )
    vllm_config.cache_config.kv_cache_layout = "LBNHC"
    attention = FullAttentionSpec(block_size=128, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    state = MambaSpec(block_size=128, shapes=((3, 512), (4, 64, 64)), dtypes=(torch.bfloat16, torch.bfloat16),
                      page_size_padded=attention.page_size_bytes, mamba_cache_mode="align")
    specs = {f"a{i}": attention for i in range(num_attention)} | {f"s{i}": state for i in range(num_state)}
    groups = get_kv_cache_groups(vllm_config, dict(specs))
    vllm_attention_groups = sum(isinstance(g.kv_cache_spec, FullAttentionSpec) for g in groups)

    layer_types = ["full_attention"] * num_attention + ["linear_attention"] * num_state
    geometry = block_geometry(tiny_with(layer_types), 2**40, block_size=128, kernel_block_size=32)
    assert geometry.group_size == max(len(g.layer_names) for g in groups)
    assert geometry.num_attention_groups == vllm_attention_groups
    assert geometry.num_state_groups == len(groups) - vllm_attention_groups


@needs_shared
@pytest.mark.parametrize("path", [p for p in REAL_CONFIGS if "unverified" not in str(p)],
                         ids=lambda p: p.stem)
@pytest.mark.parametrize("layers", [1, 3])
def test_hidden_states_get_the_largest_dividing_block_that_fits_the_page(path, layers):
    """vLLM's rule for the hidden-state group (``kv_cache_utils.get_kv_cache_groups``): the
    largest divisor of the block size whose tokens fit one common page."""
    from vllm_admission.core.geometry import hidden_state_block_size

    costs = ModelCosts.from_config(path)
    if not costs.is_hybrid:
        pytest.skip("not hybrid")
    geo = block_geometry(costs, 64 * GiB)
    per_token = layers * costs.hidden_size * costs.dtype_bytes
    size = hidden_state_block_size(geo, per_token)
    assert geo.block_size % size == 0 and size * per_token <= geo.page_bytes
    assert all(geo.block_size % d or d * per_token > geo.page_bytes
               for d in range(size + 1, geo.block_size + 1))


def test_hidden_states_wider_than_a_page_are_refused():
    from vllm_admission.core.errors import UserError
    from vllm_admission.core.geometry import hidden_state_block_size

    geo = block_geometry(QWEN3_NEXT, 64 * GiB)
    with pytest.raises(UserError, match="exceed the .*-byte page"):
        hidden_state_block_size(geo, geo.page_bytes + 1)
