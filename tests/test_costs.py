"""Tests of vllm_admission.core.costs: hand-computed figures, properties, real configs, errors.

The last section cross-checks state shapes, state dtypes and KV bytes per token
against vLLM 0.32's own functions (skipped when vllm is not installed).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_data import MODEL_CONFIGS

from vllm_admission.core.costs import (
    BUILTIN_MODELS,
    LAYER_KINDS,
    SUPPORTED_ARCHITECTURES,
    ModelConfigError,
    ModelCosts,
    load_model,
)
from vllm_admission.engine.tiny_model import TINY_MODEL_PARAMS

SHARED = MODEL_CONFIGS
REAL_CONFIGS = sorted(SHARED.glob("*.json")) + sorted(SHARED.glob("unverified/*.json"))
needs_shared = pytest.mark.skipif(not REAL_CONFIGS, reason="shared model configs not present")

# The tiny Qwen3-Next that ran on vLLM's CPU backend (shared/guide/vllm-integration.md).
TINY_QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                   "torch_dtype": "bfloat16", **TINY_MODEL_PARAMS}


def tiny(**changes):
    config = dict(TINY_QWEN3_NEXT)
    config.update(changes)
    return ModelCosts.from_config(config, name="tiny")


# --------------------------------------------------------------------------- #
# Hand-computed figures for the tiny config
# --------------------------------------------------------------------------- #


def test_tiny_memory_by_hand():
    costs = tiny()
    assert [layer.kind for layer in costs.layers] == ["gdn", "full_attention", "gdn", "full_attention"]
    # KV per attention layer: K and V, 2 KV heads x head_dim 64 x 2 bytes (bf16) each:
    #   2 * 2 * 64 * 2 = 512 bytes per token; 2 attention layers -> 1024.
    assert costs.attention_layers[0].kv_bytes_per_token == 512
    assert costs.kv_bytes_per_token == 1024
    # GDN conv state: (kernel 4 - 1) x conv_dim, conv_dim = 2 * (2 key heads * 64) + 4 value heads * 64 = 512
    #   3 * 512 * 2 bytes = 3072. Delta-rule state (4 v heads, 64, 64) * 2 bytes = 32768.
    gdn = costs.recurrent_layers[0]
    assert gdn.conv_state_shape == (3, 512)
    assert gdn.ssm_state_shape == (4, 64, 64)
    assert gdn.state_bytes == 3072 + 32768 == 35840
    assert costs.state_bytes == 2 * 35840 == 71680
    # 71680 / 1024 = 70 tokens of KV per state.
    assert costs.state_tokens_equivalent == 70.0
    assert costs.is_hybrid


def test_tiny_float32_ssm_state_by_hand():
    # vLLM's CPU backend may force the GDN state to float32: (4, 64, 64) * 4 bytes = 65536.
    costs = ModelCosts.from_config(TINY_QWEN3_NEXT, mamba_ssm_cache_dtype="float32")
    assert costs.recurrent_layers[0].state_bytes == 3072 + 65536
    assert costs.recurrent_layers[0].ssm_dtype == "float32"
    assert costs.recurrent_layers[0].conv_dtype == "bfloat16"


def test_tiny_flops_by_hand():
    costs = tiny()
    D = 128
    # MoE block (every layer: num_experts > 0, decoder_sparse_step 1, no mlp_only_layers):
    router = 2 * D * 4  # 4 experts
    experts = 2 * (3 * 2 * D * 64)  # top-2, gated (3 matrices), width 64
    shared = 3 * 2 * D * 64  # one shared expert of width 64
    shared_gate = 2 * D * 1
    moe = router + experts + shared + shared_gate
    assert moe == 1024 + 98304 + 49152 + 256
    # GDN layer: key_dim = 2*64 = 128, value_dim = 4*64 = 256.
    gdn = (
        2 * D * (2 * 128 + 2 * 256)  # in_proj_qkvz
        + 2 * D * (2 * 4)  # in_proj_ba
        + 2 * 4 * 512  # conv1d, kernel 4 over 512 channels
        + 7 * 4 * 64 * 64  # delta-rule update, 4 value heads of 64x64
        + 2 * 256 * D  # out_proj
    )
    # Gated attention layer: q_proj also emits the output gate (2 * 4 heads * 64).
    attention = 2 * D * (2 * 4 * 64) + 2 * (2 * D * (2 * 64)) + 2 * (4 * 64) * D
    assert costs.layers[0].flops_per_token == gdn + moe
    assert costs.layers[1].flops_per_token == attention + moe
    # Per (query, key) pair: q.k and p.v, 2*64 each, 4 heads: 4 * 4 * 64 = 1024.
    assert costs.layers[1].flops_per_pair == 1024
    linear = 2 * (gdn + moe) + 2 * (attention + moe)
    pair = 2 * 1024
    # 10 tokens from scratch: causal pairs 1 + 2 + ... + 10 = 55.
    assert costs.prefill_flops(10) == linear * 10 + pair * 55
    # Tokens 4..9 with 4 cached: queries 4..9 see 5..10 keys = 45 pairs.
    assert costs.prefill_flops(10, 4) == linear * 6 + pair * 45
    # A 4-token hit saves the first 4 tokens: 4 linear + 1+2+3+4 = 10 pairs.
    assert costs.saved_flops(4, 10) == linear * 4 + pair * 10


def test_mlp_only_layers_and_sparse_step_choose_dense_mlp():
    costs = tiny(mlp_only_layers=[0], decoder_sparse_step=1)
    names0 = [name for name, _ in costs.layers[0].flop_terms]
    names2 = [name for name, _ in costs.layers[2].flop_terms]
    assert "mlp" in names0 and "moe_router" not in names0
    assert "moe_router" in names2
    # Dense MLP of width 256, gated: 3 * 2 * 128 * 256.
    assert dict(costs.layers[0].flop_terms)["mlp"] == 3 * 2 * 128 * 256
    sparse = tiny(decoder_sparse_step=2)  # MoE only where (i + 1) % 2 == 0: layers 1 and 3
    assert ["moe_router" in dict(layer.flop_terms) for layer in sparse.layers] == [False, True, False, True]


def test_full_attention_interval_gives_qwen3_next_layout():
    config = dict(TINY_QWEN3_NEXT)
    del config["layer_types"]
    config["num_hidden_layers"] = 8
    config["full_attention_interval"] = 4
    costs = ModelCosts.from_config(config)
    # transformers' Qwen3NextConfig: full attention where (i + 1) % 4 == 0.
    assert [layer.index for layer in costs.attention_layers] == [3, 7]


def test_sliding_window_pairs_are_bounded_by_the_window():
    costs = ModelCosts.from_config(
        {
            "architectures": ["MistralForCausalLM"],
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "intermediate_size": 128,
            "sliding_window": 4,
            "torch_dtype": "bfloat16",
        }
    )
    layer = costs.layers[0]
    assert layer.kind == "sliding_attention" and layer.sliding_window == 4
    # KV per token is counted like full attention: 2 * 1 head * 32 * 2 bytes.
    assert layer.kv_bytes_per_token == 128
    # Keys seen by queries 0..9 with window 4: 1, 2, 3, 4, 4, 4, 4, 4, 4, 4 = 34.
    assert layer.attended_pairs(0, 10) == 34
    assert layer.attended_pairs(6, 10) == 16
    assert not costs.is_hybrid


def test_dense_model_is_not_hybrid_and_does_not_raise():
    costs = ModelCosts.from_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        }
    )
    assert costs.is_hybrid is False
    assert costs.state_bytes == 0
    assert costs.layer_counts() == {"full_attention": 2}
    # No dtype in the config -> float32 -> served as bfloat16 (vLLM "auto").
    assert costs.dtype == "bfloat16" and costs.dtype_bytes == 2


# --------------------------------------------------------------------------- #
# Properties
# --------------------------------------------------------------------------- #

TINY = tiny()


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 50_000), extra=st.integers(1, 5_000))
def test_prefill_flops_increase_with_tokens(n, extra):
    assert TINY.prefill_flops(n + extra) > TINY.prefill_flops(n)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 50_000), data=st.data())
def test_prefill_flops_decrease_with_cached_tokens(n, data):
    k = data.draw(st.integers(0, n - 1))
    assert TINY.prefill_flops(n, k + 1) < TINY.prefill_flops(n, k)
    assert TINY.prefill_flops(n, n) == 0.0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 50_000), data=st.data())
def test_saving_identity_is_exact(n, data):
    k = data.draw(st.integers(0, n))
    saved = TINY.saved_flops(k, n)
    assert TINY.prefill_flops(n, 0) - TINY.prefill_flops(n, k) == saved
    # A token's cost depends only on its position, so the saving of a k-token
    # hit does not depend on the prompt length.
    assert saved == TINY.prefill_flops(k, 0)


@settings(max_examples=100, deadline=None)
@given(length=st.integers(1, 50_000))
def test_attention_term_is_quadratic(length):
    doubled_minus_twice = TINY.prefill_flops(2 * length) - 2 * TINY.prefill_flops(length)
    assert doubled_minus_twice > 0
    # pairs(2L) - 2 pairs(L) = L(2L+1) - L(L+1) = L^2 exactly.
    assert doubled_minus_twice == TINY.flops_per_pair * length**2


@settings(max_examples=50, deadline=None)
@given(a=st.integers(0, 20_000), b=st.integers(0, 20_000), c=st.integers(0, 20_000))
def test_savings_are_additive_over_consecutive_ranges(a, b, c):
    x, y, z = sorted((a, b, c))
    assert TINY.prefill_flops(z, x) == TINY.prefill_flops(y, x) + TINY.prefill_flops(z, y)


def test_model_flops_equal_sum_of_layer_flops():
    for n, k in ((1, 0), (1000, 0), (1000, 999), (4096, 1024)):
        assert TINY.prefill_flops(n, k) == sum(layer.prefill_flops(n, k) for layer in TINY.layers)


def test_recurrent_only_model_has_no_quadratic_term():
    config = dict(TINY_QWEN3_NEXT, layer_types=["linear_attention"] * 4)
    costs = ModelCosts.from_config(config)
    assert costs.prefill_flops(2000) == 2 * costs.prefill_flops(1000)
    assert not costs.is_hybrid and costs.kv_bytes_per_token == 0


@pytest.mark.parametrize(
    "args, message",
    [((10, 11), "0 <= num_cached <= num_tokens"), ((-1, 0), "0 <= num_cached"), ((5.0, 0), "integer")],
)
def test_prefill_flops_rejects_bad_ranges(args, message):
    with pytest.raises(ValueError, match=message):
        TINY.prefill_flops(*args)


def test_saved_flops_rejects_hit_longer_than_prompt():
    with pytest.raises(ValueError, match="hit_tokens <= prompt_tokens"):
        TINY.saved_flops(11, 10)


# --------------------------------------------------------------------------- #
# Real configs
# --------------------------------------------------------------------------- #


@needs_shared
@pytest.mark.parametrize("path", REAL_CONFIGS, ids=lambda p: p.stem)
def test_every_real_config_loads(path):
    costs = ModelCosts.from_config(path)
    assert costs.is_hybrid
    assert costs.kv_bytes_per_token > 0 and costs.state_bytes > 0
    assert {layer.kind for layer in costs.layers} <= set(LAYER_KINDS) | {"mlp", "moe"}
    assert costs.prefill_flops(8192) > 0
    assert "__" not in costs.name


@needs_shared
@pytest.mark.parametrize(
    "file_name, counts, kv_per_token, state_bytes",
    [
        # Qwen3-Next: 48 layers, full attention every 4th -> 12 attention, 36 GDN.
        #   KV: 12 * (2 * 2 kv heads * 256 * 2 bytes) = 12 * 2048 = 24576 B/token.
        #   GDN: conv (3, 2*16*128 + 32*128 = 8192) bf16 = 49152; state (32, 128, 128) bf16 = 1048576;
        #   36 * 1097728 = 39518208 B (37.7 MiB), i.e. the KV of 1608 tokens.
        ("Qwen__Qwen3-Next-80B-A3B-Instruct.json", {"gdn": 36, "full_attention": 12}, 24576, 39518208),
        # Qwen3.5-35B-A3B: 40 layers, 10 attention; mamba_ssm_dtype float32:
        #   KV 10 * 2048 = 20480; GDN 30 * (49152 + 32*128*128*4 = 2097152) = 64389120.
        ("Qwen__Qwen3.5-35B-A3B.json", {"gdn": 30, "full_attention": 10}, 20480, 64389120),
        # Zamba2-2.7B: 54 Mamba2 layers, 9 of them hybrid with attention (32 heads of 160, KV heads = heads):
        #   KV 9 * 2*32*160*2 = 184320; Mamba2 I = 2*2560 = 5120, conv (3, 5120 + 2*1*64) bf16 = 31488,
        #   SSM (80, 64, 64) bf16 = 655360; 54 * 686848 = 37089792.
        ("Zyphra__Zamba2-2.7B.json", {"mamba2": 54, "full_attention": 9}, 184320, 37089792),
        # Nemotron-H-8B: pattern has 24 M, 4 *, 24 -; KV 4 * 2*8*128*2 = 16384;
        #   I = 128*64 = 8192, conv (3, 8192 + 2*8*128) bf16 = 61440, SSM (128, 64, 128) float32 = 4194304
        #   (vLLM's Nemotron-H default SSM dtype); 24 * 4255744 = 102137856.
        ("nvidia__Nemotron-H-8B-Base-8K.json", {"mamba2": 24, "full_attention": 4, "mlp": 24}, 16384, 102137856),
        # Nemotron-H-56B: 54 M, 10 *, 54 -; KV 10 * 4096 = 40960;
        #   I = 256*64 = 16384, conv (3, 16384 + 2*8*256) bf16 = 122880, SSM (256, 64, 256) fp32 = 16777216;
        #   54 * 16900096 = 912605184.
        ("nvidia__Nemotron-H-56B-Base-8K.json", {"mamba2": 54, "full_attention": 10, "mlp": 54}, 40960, 912605184),
        # Nemotron-3-Nano: 23 M, 6 *, 23 E; KV 6 * 2*2*128*2 = 6144;
        #   I = 64*64 = 4096, conv (3, 4096 + 2*8*128) bf16 = 36864, SSM (64, 64, 128) fp32 = 2097152;
        #   23 * 2134016 = 49082368.
        ("nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json",
         {"mamba2": 23, "full_attention": 6, "moe": 23}, 6144, 49082368),
        # Jamba-1.5-Mini: attention at i % 8 == 4 -> 4 layers; KV 4 * 2*8*128*2 = 16384;
        #   Mamba1 I = 2*4096 = 8192, conv (3, 8192) bf16 = 49152, SSM (8192, 16) bf16 = 262144;
        #   28 * 311296 = 8716288.
        ("unverified/ai21labs__AI21-Jamba-1.5-Mini.json", {"mamba1": 28, "full_attention": 4}, 16384, 8716288),
    ],
)
def test_known_figures_of_real_configs(file_name, counts, kv_per_token, state_bytes):
    costs = ModelCosts.from_config(SHARED / file_name)
    assert costs.layer_counts() == counts
    assert costs.kv_bytes_per_token == kv_per_token
    assert costs.state_bytes == state_bytes


@needs_shared
def test_qwen3_next_flops_by_hand():
    costs = ModelCosts.from_config(SHARED / "Qwen__Qwen3-Next-80B-A3B-Instruct.json")
    D = 2048
    moe = 2 * D * 512 + 10 * 3 * 2 * D * 512 + 3 * 2 * D * 512 + 2 * D  # router, 10 active, shared, gate
    gdn = 2 * D * (2 * 2048 + 2 * 4096) + 2 * D * 64 + 2 * 4 * 8192 + 7 * 32 * 128 * 128 + 2 * 4096 * D
    attention = 2 * D * (2 * 16 * 256) + 2 * 2 * D * (2 * 256) + 2 * 16 * 256 * D
    assert costs.flops_per_token == 36 * (gdn + moe) + 12 * (attention + moe)
    assert costs.flops_per_pair == 12 * 4 * 16 * 256
    # About 2 x 3.3e9 active non-embedding parameters per token.
    assert 6.0e9 < costs.flops_per_token < 7.0e9


@needs_shared
def test_nemotron_layers_are_one_thing_each():
    costs = ModelCosts.from_config(SHARED / "nvidia__Nemotron-H-8B-Base-8K.json")
    pattern = json.loads((SHARED / "nvidia__Nemotron-H-8B-Base-8K.json").read_text())["hybrid_override_pattern"]
    expected = {"M": "mamba2", "*": "full_attention", "-": "mlp"}
    assert [layer.kind for layer in costs.layers] == [expected[c] for c in pattern]
    attention = costs.attention_layers[0]
    # No MLP inside an attention layer: only the 4 projections.
    assert [name for name, _ in attention.flop_terms] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    # relu2 MLP: up + down only: 2 * 2 * 4096 * 21504.
    mlp = next(layer for layer in costs.layers if layer.kind == "mlp")
    assert mlp.flops_per_token == 2 * 2 * 4096 * 21504


@needs_shared
def test_zamba2_hybrid_layer_has_attention_and_mamba_entries():
    costs = ModelCosts.from_config(SHARED / "Zyphra__Zamba2-2.7B.json")
    assert costs.num_decoder_layers == 54
    entries_of_layer_6 = [layer.kind for layer in costs.layers if layer.index == 6]
    assert entries_of_layer_6 == ["full_attention", "mamba2"]
    attention = costs.attention_layers[0]
    # q/k/v read concat(h, embeddings) of width 5120; o_proj writes 2560.
    assert dict(attention.flop_terms)["q_proj"] == 2 * 5120 * 5120
    assert dict(attention.flop_terms)["o_proj"] == 2 * 5120 * 2560


GRANITE_4_H_SMALL_SHAPE = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "torch_dtype": "bfloat16",
    "vocab_size": 1000,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["mamba", "mamba", "attention", "mamba"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "intermediate_size": 128,
    "shared_intermediate_size": 256,
}

FALCON_H1_SMALL_SHAPE = {
    "architectures": ["FalconH1ForCausalLM"],
    "model_type": "falcon_h1",
    "torch_dtype": "bfloat16",
    "vocab_size": 1000,
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_d_ssm": 512,
    "mamba_n_heads": 8,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "intermediate_size": 512,
}


def test_granite_hybrid_by_hand():
    costs = ModelCosts.from_config(GRANITE_4_H_SMALL_SHAPE)
    assert [layer.kind for layer in costs.layers] == ["mamba2", "mamba2", "full_attention", "mamba2"]
    # Mamba2: I = 2 * 256 = 512 = 8 heads * 64; conv (3, 512 + 2*1*64 = 640) bf16 = 3840;
    # SSM (8, 64, 64) bf16 = 65536; 3 layers * 69376 = 208128.
    assert costs.recurrent_layers[0].conv_state_shape == (3, 640)
    assert costs.state_bytes == 3 * (3840 + 65536) == 208128
    # Attention head_dim = 256 / 4 = 64: 2 * 2 * 64 * 2 = 512 bytes per token.
    assert costs.kv_bytes_per_token == 512
    # FFN on every layer: router 2*256*4, 2 gated experts of 128, gated shared MLP of 256.
    ffn = 2 * 256 * 4 + 2 * 3 * 2 * 256 * 128 + 3 * 2 * 256 * 256
    attention = 2 * 256 * 256 + 2 * (2 * 256 * 128) + 2 * 256 * 256
    assert costs.attention_layers[0].flops_per_token == attention + ffn


def test_falcon_h1_layers_run_attention_and_mamba_in_parallel():
    costs = ModelCosts.from_config(FALCON_H1_SMALL_SHAPE)
    assert [(layer.index, layer.kind) for layer in costs.layers] == [
        (0, "full_attention"), (0, "mamba2"), (1, "full_attention"), (1, "mamba2")
    ]
    # Mamba2 width mamba_d_ssm = 512: same state as the Granite example, 2 layers.
    assert costs.state_bytes == 2 * 69376
    assert costs.kv_bytes_per_token == 2 * 512
    assert costs.num_decoder_layers == 2


def test_builtin_is_byte_identical_to_shared_copy():
    builtin = Path(__file__).resolve().parents[1] / "vllm_admission/core/model_configs/qwen3-next-80b-a3b.json"
    assert builtin.is_file()
    shared = SHARED / "Qwen__Qwen3-Next-80B-A3B-Instruct.json"
    if shared.is_file():
        assert builtin.read_bytes() == shared.read_bytes()


def test_load_model_builtin_name():
    costs = load_model("qwen3-next-80b-a3b")
    assert costs.name == "Qwen3-Next-80B-A3B-Instruct"
    assert costs.architecture == "Qwen3NextForCausalLM"
    assert costs.state_bytes == 39518208 and costs.kv_bytes_per_token == 24576
    assert list(BUILTIN_MODELS) == ["qwen3-next-80b-a3b"]


def test_load_model_path_and_directory(tmp_path):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps(TINY_QWEN3_NEXT))
    assert load_model(str(tmp_path / "my-model")).name == "my-model"
    assert load_model(tmp_path / "my-model" / "config.json").kv_bytes_per_token == 1024
    assert load_model(tmp_path / "my-model", name="renamed").name == "renamed"


def test_name_or_path_gives_the_name():
    costs = ModelCosts.from_config(dict(TINY_QWEN3_NEXT, _name_or_path="Org/Some-Model"))
    assert costs.name == "Some-Model"


# --------------------------------------------------------------------------- #
# Bad inputs
# --------------------------------------------------------------------------- #


def test_unknown_builtin_lists_builtins():
    with pytest.raises(ModelConfigError, match=r"unknown model 'nope'.*builtins: qwen3-next-80b-a3b") as info:
        load_model("nope")
    assert "\n" not in str(info.value)


def test_missing_file_is_a_model_config_error(tmp_path):
    with pytest.raises(ModelConfigError, match="no such file"):
        load_model(str(tmp_path / "absent.json"))
    with pytest.raises(ModelConfigError, match="file not found"):
        ModelCosts.from_config(tmp_path / "absent.json")


def test_non_json_names_file_and_position(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"architectures": ["Qwen3NextForCausalLM"],\n  "hidden_size": }')
    with pytest.raises(ModelConfigError, match=r"bad\.json: not valid JSON \(line 2") as info:
        load_model(str(bad))
    assert "builtins: qwen3-next-80b-a3b" in str(info.value)
    assert "\n" not in str(info.value)


def test_unsupported_architecture_names_it_and_lists_supported():
    with pytest.raises(ModelConfigError, match=r"architecture 'GPT2LMHeadModel' is not supported; "
                                               r"supported: .*Qwen3NextForCausalLM"):
        ModelCosts.from_config({"architectures": ["GPT2LMHeadModel"]})
    assert "NemotronHForCausalLM" in SUPPORTED_ARCHITECTURES


def test_missing_field_names_file_and_field(tmp_path):
    config = dict(TINY_QWEN3_NEXT)
    del config["linear_key_head_dim"]
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=r"cfg\.json: field 'linear_key_head_dim' is missing"):
        ModelCosts.from_config(path)


def test_bad_field_values():
    with pytest.raises(ModelConfigError, match=r"field 'hidden_size' must be an integer, got 'wide'"):
        tiny(hidden_size="wide")
    with pytest.raises(ModelConfigError, match=r"field 'layer_types' has 3 entries but num_hidden_layers is 4"):
        tiny(layer_types=["linear_attention"] * 3)
    with pytest.raises(ModelConfigError, match=r"field 'architectures' must be a non-empty list"):
        ModelCosts.from_config({"architectures": []})
    with pytest.raises(ModelConfigError, match=r"unsupported dtype 'int3'"):
        ModelCosts.from_config(TINY_QWEN3_NEXT, kv_cache_dtype="int3")


def test_text_config_fields_are_prefixed_in_errors():
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": {"hidden_size": 8}}
    with pytest.raises(ModelConfigError, match=r"field 'text_config\.num_hidden_layers' is missing"):
        ModelCosts.from_config(config)


def test_nemotron_unknown_pattern_code():
    with pytest.raises(ModelConfigError, match=r"hybrid_override_pattern' has unknown layer code 'X'"):
        ModelCosts.from_config(
            {"architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "hybrid_override_pattern": "M*X",
             "num_attention_heads": 2}
        )


def test_kv_cache_dtype_fp8_halves_kv_bytes():
    assert ModelCosts.from_config(TINY_QWEN3_NEXT, kv_cache_dtype="fp8").kv_bytes_per_token == 512


# --------------------------------------------------------------------------- #
# Cross-check against vLLM 0.32's own state-shape / dtype / page-size code
# --------------------------------------------------------------------------- #


@functools.cache
def _vllm_facts(path_text: str, work_dir: str):
    """State shapes/dtypes and the attention page per token as vLLM computes them (TP 1, GPU rules)."""
    pytest.importorskip("vllm")
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, Qwen3_5ForConditionalGenerationConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    path = Path(path_text)
    model_dir = Path(work_dir) / path.stem
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, model_dir / "config.json")
    raw = json.loads(path.read_text())
    overrides = {}
    is_qwen3_5 = raw["architectures"][0].startswith("Qwen3_5")
    if is_qwen3_5:
        # vLLM's qwen3_5.py imports torchvision (absent here); its GDN state code is
        # the Qwen3-Next one, so resolve the Qwen3-Next class on the Qwen3.5 config.
        overrides = {"architectures": ["Qwen3NextForCausalLM"]}
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=1024,
                               hf_overrides=overrides)
    vllm_config = VllmConfig(model_config=model_config, cache_config=CacheConfig(enable_prefix_caching=True))
    # Re-apply the GPU dtype rules deterministically (the CPU platform may change them).
    vllm_config.cache_config.mamba_ssm_cache_dtype = "auto"
    if is_qwen3_5:
        Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(vllm_config)
    elif model_config.architecture in MODELS_CONFIG_MAP:
        MODELS_CONFIG_MAP[model_config.architecture].verify_and_update_config(vllm_config)
    model_cls, _ = ModelRegistry.resolve_model_cls(model_config.architecture, model_config=model_config)
    shapes = model_cls.get_mamba_state_shape_from_config(vllm_config)
    dtypes = model_cls.get_mamba_state_dtype_from_config(vllm_config)
    attention_page = FullAttentionSpec(
        block_size=1,
        num_kv_heads=model_config.get_num_kv_heads(vllm_config.parallel_config),
        head_size=model_config.get_head_size(),
        dtype=model_config.dtype,
    ).page_size_bytes
    return (
        tuple(tuple(shape) for shape in shapes),
        tuple(str(dtype).replace("torch.", "") for dtype in dtypes),
        attention_page,
        str(model_config.dtype).replace("torch.", ""),
    )


@pytest.mark.parametrize("config", [GRANITE_4_H_SMALL_SHAPE, FALCON_H1_SMALL_SHAPE, TINY_QWEN3_NEXT],
                         ids=["granite-4-h", "falcon-h1", "tiny-qwen3-next"])
def test_synthetic_configs_match_vllm(config, tmp_path_factory):
    pytest.importorskip("vllm")
    root = tmp_path_factory.getbasetemp() / "vllm_costs_synthetic"
    root.mkdir(exist_ok=True)
    path = root / f"{config['model_type']}.json"
    path.write_text(json.dumps(config))
    shapes, dtypes, attention_page, model_dtype = _vllm_facts(str(path), str(root))
    costs = ModelCosts.from_config(config)
    recurrent = costs.recurrent_layers[0]
    assert (recurrent.conv_state_shape, recurrent.ssm_state_shape) == shapes
    assert (recurrent.conv_dtype, recurrent.ssm_dtype) == dtypes
    assert costs.attention_layers[0].kv_bytes_per_token == attention_page
    assert costs.dtype == model_dtype


@needs_shared
@pytest.mark.parametrize("path", REAL_CONFIGS, ids=lambda p: p.stem)
def test_state_shapes_dtypes_and_kv_page_match_vllm(path, tmp_path_factory):
    pytest.importorskip("vllm")
    shapes, dtypes, attention_page, model_dtype = _vllm_facts(
        str(path), str(tmp_path_factory.getbasetemp() / "vllm_costs"))
    costs = ModelCosts.from_config(path)
    recurrent = costs.recurrent_layers[0]
    assert (recurrent.conv_state_shape, recurrent.ssm_state_shape) == shapes
    assert (recurrent.conv_dtype, recurrent.ssm_dtype) == dtypes
    assert all(layer.kv_bytes_per_token == attention_page for layer in costs.attention_layers)
    assert costs.dtype == model_dtype
