"""One builder per supported architecture: a config's layers as :class:`LayerCost` records."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from vllm_admission.core.costs.config import ConfigFields
from vllm_admission.core.costs.dtypes import NEMOTRON_H, QWEN3_5, Dtypes
from vllm_admission.core.costs.layers import (
    LayerCost,
    _attention_layer,
    _AttentionShape,
    _gdn_layer,
    _mamba1_layer,
    _mamba2_layer,
    _mlp_terms,
    _moe_terms,
    _proj,
)

# --------------------------------------------------------------------------- #
# Architectures
# --------------------------------------------------------------------------- #

Builder = Callable[[ConfigFields, Dtypes], tuple[list[LayerCost], int]]


def _head_dim(cfg: ConfigFields, hidden: int, num_heads: int) -> int:
    if cfg.get("head_dim") is not None:
        return cfg.int("head_dim")
    if cfg.get("attention_head_dim") is not None:
        return cfg.int("attention_head_dim")
    if hidden % num_heads:
        raise cfg._error("head_dim", f"is missing and hidden_size {hidden} is not a multiple of "
                                     f"num_attention_heads {num_heads}")
    return hidden // num_heads


def _gqa_attention(cfg: ConfigFields, hidden: int, dtypes: Dtypes) -> _AttentionShape:
    """``num_attention_heads``, ``num_key_value_heads`` (default: the heads) and :func:`_head_dim`."""
    num_heads = cfg.int("num_attention_heads")
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    return _AttentionShape(hidden, num_heads, num_kv_heads, _head_dim(cfg, hidden, num_heads), dtypes.kv)


@dataclass(frozen=True)
class _Mamba2Fields:
    """The config fields one architecture names its Mamba2 mixer's shape with."""

    num_heads: str
    head_dim: str
    n_groups: str
    state_size: str
    conv_kernel: str
    #: ``n_groups``'s default; None: the field is required.
    n_groups_default: int | None = 1

    def layer(
        self,
        cfg: ConfigFields,
        index: int,
        *,
        hidden: int,
        intermediate: int | None,
        dtypes: Dtypes,
        extra_terms: list[tuple[str, int]] | None = None,
    ) -> LayerCost:
        """The Mamba2 layer; ``intermediate`` None: ``num_heads * head_dim``."""
        num_heads = cfg.int(self.num_heads)
        head_dim = cfg.int(self.head_dim)
        n_groups = (cfg.int(self.n_groups) if self.n_groups_default is None
                    else cfg.int(self.n_groups, self.n_groups_default))
        return _mamba2_layer(
            index,
            hidden=hidden,
            intermediate=num_heads * head_dim if intermediate is None else intermediate,
            num_heads=num_heads,
            head_dim=head_dim,
            n_groups=n_groups,
            state_size=cfg.int(self.state_size),
            conv_kernel=cfg.int(self.conv_kernel),
            dtypes=dtypes,
            extra_terms=extra_terms,
        )


_NEMOTRON_MAMBA2 = _Mamba2Fields("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel",
                                 n_groups_default=None)
_ZAMBA2_MAMBA2 = _Mamba2Fields("n_mamba_heads", "mamba_headdim", "mamba_ngroups", "mamba_d_state", "mamba_d_conv")
#: Granite-4.0-H and Falcon-H1.
_MAMBA_N_HEADS_MAMBA2 = _Mamba2Fields("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state",
                                      "mamba_d_conv")


def _qwen_layer_types(cfg: ConfigFields, num_layers: int) -> list[str]:
    """Qwen3-Next / Qwen3.5 ``layer_types``, else derived from ``full_attention_interval``.

    Derivation as transformers' Qwen3NextConfig: layer i is full attention when
    ``(i + 1) % interval == 0``.
    """
    if cfg.get("layer_types") is not None:
        types = cfg.list("layer_types")
        if len(types) != num_layers:
            raise cfg._error("layer_types", f"has {len(types)} entries but num_hidden_layers is {num_layers}")
        for kind in types:
            if kind not in ("linear_attention", "full_attention", "sliding_attention"):
                raise cfg._error("layer_types", f"has unknown entry {kind!r}")
        return list(types)
    interval = cfg.int("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]


def _build_qwen_gdn(cfg: ConfigFields, dtypes: Dtypes) -> tuple[list[LayerCost], int]:
    """Qwen3-Next and Qwen3.5: GDN or gated full attention, each followed by MLP or MoE.

    Source: vllm/model_executor/models/qwen3_next.py Qwen3NextDecoderLayer (MoE
    when ``num_experts > 0``, ``(i + 1) % decoder_sparse_step == 0`` and i not in
    ``mlp_only_layers``) and qwen3_5.py Qwen3_5DecoderLayer (MoE on every layer
    of a ``qwen3_5_moe_text`` model). Qwen3.5's multi-token-prediction layer
    only runs with speculative decoding and is not counted.
    """
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    types = _qwen_layer_types(cfg, num_layers)
    attention = _gqa_attention(cfg, hidden, dtypes)
    output_gate = cfg.bool("attn_output_gate", True)
    num_experts = cfg.int("num_experts", 0, minimum=0)
    model_type = cfg.get("model_type")
    mlp_only = set(cfg.list("mlp_only_layers", []))
    sparse_step = cfg.int("decoder_sparse_step", 1)
    window = cfg.int("sliding_window", None) if cfg.bool("use_sliding_window", False) else None

    layers = []
    for i, layer_type in enumerate(types):
        if model_type in ("qwen3_5_text", "qwen3_5_moe_text"):
            is_moe = model_type == "qwen3_5_moe_text"
        else:
            is_moe = num_experts > 0 and (i + 1) % sparse_step == 0 and i not in mlp_only
        if is_moe:
            ffn = _moe_terms(hidden, cfg.int("num_experts"), cfg.int("num_experts_per_tok"),
                             cfg.int("moe_intermediate_size"), gated=True,
                             shared_intermediate=cfg.int("shared_expert_intermediate_size", 0, minimum=0),
                             shared_gate=True)
        else:
            ffn = _mlp_terms(hidden, cfg.int("intermediate_size"), gated=True)
        if layer_type == "linear_attention":
            layers.append(
                _gdn_layer(
                    i,
                    hidden=hidden,
                    num_k_heads=cfg.int("linear_num_key_heads"),
                    num_v_heads=cfg.int("linear_num_value_heads"),
                    k_head_dim=cfg.int("linear_key_head_dim"),
                    v_head_dim=cfg.int("linear_value_head_dim"),
                    conv_kernel=cfg.int("linear_conv_kernel_dim"),
                    dtypes=dtypes,
                    extra_terms=ffn,
                )
            )
        else:
            layers.append(
                _attention_layer(
                    i,
                    attention,
                    output_gate=output_gate,
                    sliding_window=window if layer_type == "sliding_attention" else None,
                    extra_terms=ffn,
                )
            )
    return layers, num_layers


_NEMOTRON_CODES = {
    "M": "mamba2",
    "mamba": "mamba2",
    "linear_attention": "mamba2",
    "*": "full_attention",
    "attention": "full_attention",
    "full_attention": "full_attention",
    "-": "mlp",
    "mlp": "mlp",
    "E": "moe",
    "moe": "moe",
}


def _build_nemotron_h(cfg: ConfigFields, dtypes: Dtypes) -> tuple[list[LayerCost], int]:
    """Nemotron-H: each layer is ONE of Mamba2 (M), attention (*), MLP (-), MoE (E).

    Source: vllm/model_executor/models/nemotron_h.py (NemotronHMambaDecoderLayer
    with ``intermediate_size = mamba_num_heads * mamba_head_dim``,
    NemotronHAttentionDecoderLayer, NemotronHMLPDecoderLayer with relu2
    up/down, NemotronHMoE with relu2 experts, a relu2 shared expert of width
    ``moe_shared_expert_intermediate_size * n_shared_experts``, and optional
    latent projections ``D -> moe_latent_size`` around the routed experts).
    Layer order: ``hybrid_override_pattern``, or ``layers_block_type`` (newer
    transformers spelling).
    """
    hidden = cfg.int("hidden_size")
    if cfg.get("hybrid_override_pattern") is not None:
        codes = list(cfg.str("hybrid_override_pattern"))
        field_name = "hybrid_override_pattern"
    else:
        codes = cfg.list("layers_block_type")
        field_name = "layers_block_type"
    kinds = []
    for code in codes:
        if code not in _NEMOTRON_CODES:
            raise cfg._error(field_name, f"has unknown layer code {code!r} (expected M, *, -, E)")
        kinds.append(_NEMOTRON_CODES[code])

    attention = _gqa_attention(cfg, hidden, dtypes)
    window = cfg.int("sliding_window", None)
    layers: list[LayerCost] = []
    mlp_index = 0
    for i, kind in enumerate(kinds):
        if kind == "mamba2":
            layers.append(_NEMOTRON_MAMBA2.layer(cfg, i, hidden=hidden, intermediate=None, dtypes=dtypes))
        elif kind == "full_attention":
            layers.append(_attention_layer(i, attention, sliding_window=window))
        elif kind == "mlp":
            intermediate = cfg.get("intermediate_size")
            if isinstance(intermediate, list):
                if not intermediate:
                    raise cfg._error("intermediate_size", "is an empty list")
                intermediate = intermediate[0] if len(intermediate) == 1 else intermediate[mlp_index]
                width = ConfigFields({"intermediate_size": intermediate}, cfg.label,
                                     cfg.prefix).int("intermediate_size")
            else:
                width = cfg.int("intermediate_size")
            mlp_index += 1
            layers.append(_ffn_only_layer("mlp", i, _mlp_terms(hidden, width, gated=False)))
        else:
            latent = cfg.int("moe_latent_size", None)
            expert_width = latent or hidden
            terms = _moe_terms(expert_width, cfg.int("n_routed_experts"), cfg.int("num_experts_per_tok"),
                               cfg.int("moe_intermediate_size"), gated=False)
            # The router reads the full hidden state even with latent experts.
            terms[0] = ("moe_router", _proj(hidden, cfg.int("n_routed_experts")))
            shared = cfg.int("n_shared_experts", 0, minimum=0)
            if shared:
                terms += _mlp_terms(
                    hidden, cfg.int("moe_shared_expert_intermediate_size") * shared, gated=False,
                    prefix="moe_shared_expert"
                )
            if latent:
                terms += [("moe_latent_proj", 2 * _proj(hidden, latent))]
            layers.append(_ffn_only_layer("moe", i, terms))
    return layers, len(kinds)


def _ffn_only_layer(kind: str, index: int, terms: list[tuple[str, int]]) -> LayerCost:
    return LayerCost(
        kind=kind,
        kv_bytes_per_token=0,
        state_bytes=0,
        index=index,
        flops_per_token=sum(value for _, value in terms),
        flop_terms=tuple(terms),
    )


def _build_zamba2(cfg: ConfigFields, dtypes: Dtypes) -> tuple[list[LayerCost], int]:
    """Zamba2: Mamba2 layers; "hybrid" layers add a shared attention + MLP block.

    Source: vllm/model_executor/models/zamba2.py. Every decoder layer runs a
    Mamba2 mixer (``I = mamba_expand * D``, ``n_mamba_heads`` heads of
    ``mamba_headdim``). A "hybrid" layer first runs one of the
    ``num_mem_blocks`` shared transformer blocks on ``concat(h, embeddings)``
    (width 2D): attention with ``num_attention_heads`` heads of
    ``attention_head_dim`` (KV heads = heads, each hybrid layer has its own KV
    cache), then a gated GELU MLP ``D -> ffn/intermediate_size``, optional
    LoRA adapters of rank ``adapter_rank``, and a ``D -> D`` linear whose
    output is added to the Mamba2 input.
    """
    hidden = cfg.int("hidden_size")
    block_types = cfg.list("layers_block_type")
    num_heads = cfg.int("num_attention_heads")
    attention = _AttentionShape(hidden, num_heads, num_heads, cfg.int("attention_head_dim"), dtypes.kv)
    attn_width = cfg.int("attention_hidden_size", 2 * hidden)
    intermediate = cfg.first_int(("intermediate_size", "ffn_hidden_size"))
    rank = cfg.int("adapter_rank", 0, minimum=0)
    mamba_intermediate = cfg.int("mamba_expand") * hidden

    layers: list[LayerCost] = []
    for i, block_type in enumerate(block_types):
        if block_type not in ("mamba", "hybrid"):
            raise cfg._error("layers_block_type", f"has unknown entry {block_type!r} (expected mamba or hybrid)")
        if block_type == "hybrid":
            extra = _mlp_terms(hidden, intermediate, gated=True)
            if rank and cfg.bool("use_shared_mlp_adapter", True):
                extra.append(("mlp_adapter", _proj(hidden, rank) + _proj(rank, 2 * intermediate)))
            if rank and cfg.bool("use_shared_attention_adapter", False):
                extra.append(("qkv_adapters", 3 * (_proj(attn_width, rank) + _proj(rank, attn_width))))
            extra.append(("hybrid_linear", _proj(hidden, hidden)))
            layers.append(_attention_layer(i, attention, input_width=attn_width, extra_terms=extra))
        layers.append(_ZAMBA2_MAMBA2.layer(cfg, i, hidden=hidden, intermediate=mamba_intermediate, dtypes=dtypes))
    return layers, len(block_types)


def _build_jamba(cfg: ConfigFields, dtypes: Dtypes) -> tuple[list[LayerCost], int]:
    """Jamba: Mamba1 or attention, each followed by a gated MLP or an MoE block.

    Source: vllm/model_executor/models/jamba.py with transformers' JambaConfig
    properties: layer i is attention when ``i % attn_layer_period ==
    attn_layer_offset`` and MoE (``num_experts`` experts, top
    ``num_experts_per_tok``, each of width ``intermediate_size``) when ``i %
    expert_layer_period == expert_layer_offset``. ``mamba_dt_rank`` "auto" is
    ``ceil(D / 16)``.
    """
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    attn_period = cfg.int("attn_layer_period")
    attn_offset = cfg.int("attn_layer_offset", minimum=0)
    expert_period = cfg.int("expert_layer_period")
    expert_offset = cfg.int("expert_layer_offset", minimum=0)
    num_experts = cfg.int("num_experts", 1)
    intermediate = cfg.int("intermediate_size")
    attention = _gqa_attention(cfg, hidden, dtypes)
    window = cfg.int("sliding_window", None)
    dt_rank_raw = cfg.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(hidden / 16) if dt_rank_raw == "auto" else cfg.int("mamba_dt_rank")

    layers: list[LayerCost] = []
    for i in range(num_layers):
        if num_experts > 1 and i % expert_period == expert_offset:
            ffn = _moe_terms(hidden, num_experts, cfg.int("num_experts_per_tok"), intermediate, gated=True)
        else:
            ffn = _mlp_terms(hidden, intermediate, gated=True)
        if i % attn_period == attn_offset:
            layers.append(_attention_layer(i, attention, sliding_window=window, extra_terms=ffn))
        else:
            layers.append(
                _mamba1_layer(
                    i,
                    hidden=hidden,
                    intermediate=cfg.int("mamba_expand") * hidden,
                    state_size=cfg.int("mamba_d_state"),
                    conv_kernel=cfg.int("mamba_d_conv"),
                    dt_rank=dt_rank,
                    dtypes=dtypes,
                    extra_terms=ffn,
                )
            )
    return layers, num_layers


def _build_granite_hybrid(cfg: ConfigFields, dtypes: Dtypes) -> tuple[list[LayerCost], int]:
    """Granite-4.0-H (GraniteMoeHybrid): Mamba2 or attention, each followed by MoE and/or a shared MLP.

    Source: vllm/model_executor/models/granitemoehybrid.py. ``layer_types``
    (or ``layers_block_type``) entries "mamba"/"linear_attention" are Mamba2
    (``I = mamba_expand * D``, ``mamba_n_heads`` heads of ``mamba_d_head``),
    "attention"/"full_attention" are attention with ``head_dim = D /
    num_attention_heads`` (the model file ignores any ``head_dim`` field).
    Feed-forward: an MoE of ``num_local_experts`` gated experts of width
    ``intermediate_size`` (top ``num_experts_per_tok``) when
    ``num_local_experts > 0``, plus a gated shared MLP of width
    ``shared_intermediate_size`` when that is > 0.
    """
    hidden = cfg.int("hidden_size")
    key = "layer_types" if cfg.get("layer_types") is not None else "layers_block_type"
    types = cfg.list(key)
    num_heads = cfg.int("num_attention_heads")
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    if hidden % num_heads:
        raise cfg._error("num_attention_heads", f"must divide hidden_size {hidden}")
    attention = _AttentionShape(hidden, num_heads, num_kv_heads, hidden // num_heads, dtypes.kv)
    num_experts = cfg.int("num_local_experts", 0, minimum=0)
    shared = cfg.int("shared_intermediate_size", 0, minimum=0)
    ffn: list[tuple[str, int]] = []
    if num_experts:
        ffn += _moe_terms(hidden, num_experts, cfg.int("num_experts_per_tok"), cfg.int("intermediate_size"), gated=True)
    if shared:
        ffn += _mlp_terms(hidden, shared, gated=True, prefix="shared_mlp")
    layers: list[LayerCost] = []
    for i, layer_type in enumerate(types):
        if layer_type in ("mamba", "linear_attention"):
            layers.append(
                _MAMBA_N_HEADS_MAMBA2.layer(
                    cfg, i, hidden=hidden, intermediate=cfg.int("mamba_expand") * hidden, dtypes=dtypes,
                    extra_terms=list(ffn),
                )
            )
        elif layer_type in ("attention", "full_attention"):
            layers.append(_attention_layer(i, attention, extra_terms=list(ffn)))
        else:
            raise cfg._error(key, f"has unknown entry {layer_type!r} (expected mamba or attention)")
    return layers, len(types)


def _build_falcon_h1(cfg: ConfigFields, dtypes: Dtypes) -> tuple[list[LayerCost], int]:
    """Falcon-H1: every decoder layer runs attention AND a Mamba2 mixer in parallel, then a gated MLP.

    Source: vllm/model_executor/models/falcon_h1.py (FalconH1ParallelHybrid).
    Each decoder layer gives two entries (attention, then Mamba2, same
    ``index``); vLLM registers them as separate cache layers. Mamba2 width
    ``I = mamba_d_ssm`` (or ``mamba_expand * D``), ``mamba_n_heads`` heads of
    ``mamba_d_head``; attention ``head_dim`` (or ``D / heads``). The MLP
    (width ``intermediate_size``) is attached to the attention entry. muP
    multipliers do not change FLOPs.
    """
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    num_heads = cfg.int("num_attention_heads")
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    head_dim = cfg.int("head_dim", None) or _head_dim(ConfigFields({}, cfg.label, cfg.prefix), hidden, num_heads)
    attention = _AttentionShape(hidden, num_heads, num_kv_heads, head_dim, dtypes.kv)
    d_ssm = cfg.int("mamba_d_ssm", None) or int(cfg.int("mamba_expand") * hidden)
    layers: list[LayerCost] = []
    for i in range(num_layers):
        mlp = _mlp_terms(hidden, cfg.int("intermediate_size"), gated=True)
        layers.append(_attention_layer(i, attention, extra_terms=mlp))
        layers.append(_MAMBA_N_HEADS_MAMBA2.layer(cfg, i, hidden=hidden, intermediate=d_ssm, dtypes=dtypes))
    return layers, num_layers


def _build_dense(cfg: ConfigFields, dtypes: Dtypes) -> tuple[list[LayerCost], int]:
    """Plain decoder-only transformers (Llama, Mistral, Qwen2/3, Qwen3-MoE): no recurrent layer.

    Accepted so that a non-hybrid model gives ``is_hybrid == False`` instead of
    an error. Source: vllm/model_executor/models/llama.py, qwen2.py, qwen3.py,
    qwen3_moe.py (MoE when ``num_experts > 0``, ``(i + 1) % decoder_sparse_step
    == 0`` and i not in ``mlp_only_layers``). A ``sliding_window`` applies to
    every layer when set (Mistral; Qwen2/3 only with ``use_sliding_window``).
    """
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    attention = _gqa_attention(cfg, hidden, dtypes)
    num_experts = cfg.int("num_experts", 0, minimum=0)
    mlp_only = set(cfg.list("mlp_only_layers", []))
    sparse_step = cfg.int("decoder_sparse_step", 1)
    window = None
    if cfg.get("sliding_window") is not None and cfg.bool("use_sliding_window", True):
        window = cfg.int("sliding_window")
    layers = []
    for i in range(num_layers):
        if num_experts > 0 and (i + 1) % sparse_step == 0 and i not in mlp_only:
            ffn = _moe_terms(
                hidden, num_experts, cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size"), gated=True
            )
        else:
            ffn = _mlp_terms(hidden, cfg.int("intermediate_size"), gated=True)
        layers.append(_attention_layer(i, attention, sliding_window=window, extra_terms=ffn))
    return layers, num_layers


#: Architecture name -> its builder.
BUILDERS: dict[str, Builder] = {
    "Qwen3NextForCausalLM": _build_qwen_gdn,
    **{arch: _build_qwen_gdn for arch in QWEN3_5},
    **{arch: _build_nemotron_h for arch in NEMOTRON_H},
    "Zamba2ForCausalLM": _build_zamba2,
    "JambaForCausalLM": _build_jamba,
    "GraniteMoeHybridForCausalLM": _build_granite_hybrid,
    "FalconH1ForCausalLM": _build_falcon_h1,
    "LlamaForCausalLM": _build_dense,
    "MistralForCausalLM": _build_dense,
    "Qwen2ForCausalLM": _build_dense,
    "Qwen3ForCausalLM": _build_dense,
    "Qwen3MoeForCausalLM": _build_dense,
}
#: Architecture names :meth:`ModelCosts.from_config` accepts.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(BUILDERS)


