"""Per-layer costs: the layer record, the kinds, and the FLOP terms of each layer family
(attention, MLP / MoE, Gated DeltaNet, Mamba2, Mamba1). See the package docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_admission.core.costs.dtypes import DTYPE_BYTES, Dtypes
from vllm_admission.core.errors import UserError


class ModelConfigError(UserError):
    """A model config cannot be read or describes something this module cannot cost.

    The message is one line and names the file (or ``<dict>``) and the field.
    """


#: Kinds of token-mixing layers that hold cache memory, in the order used throughout.
LAYER_KINDS = ("full_attention", "sliding_attention", "gdn", "mamba2", "mamba1")
#: Kinds whose memory grows with the number of tokens (KV cache).
ATTENTION_KINDS = ("full_attention", "sliding_attention")
#: Kinds whose memory is one fixed-size state per sequence.
RECURRENT_KINDS = ("gdn", "mamba2", "mamba1")
#: Nemotron-H layers that are only a feed-forward block: they hold no cache and
#: do not appear in ``LAYER_KINDS``.
FFN_ONLY_KINDS = ("mlp", "moe")


# --------------------------------------------------------------------------- #
# Per-layer record
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class LayerCost:
    """Memory and FLOP cost of one layer (tensor parallel size 1).

    Attributes:
        kind: one of ``LAYER_KINDS``, or ``"mlp"`` / ``"moe"`` for a Nemotron-H
            layer that is only a feed-forward block (no cache).
        kv_bytes_per_token: bytes of K and V one token occupies in this layer's
            KV cache: ``2 * num_kv_heads * head_dim * kv_dtype_bytes`` (vLLM
            ``AttentionSpec.page_size_bytes`` with ``block_size=1``). 0 for
            non-attention layers. For ``sliding_attention`` this is the same per
            token as full attention, but the layer only needs the last
            ``sliding_window`` tokens.
        state_bytes: bytes of one sequence's recurrent state in this layer
            (conv state + SSM / delta-rule state, vLLM ``MambaSpec`` page before
            padding). 0 for attention layers.
        index: position of the decoder layer this entry belongs to (0-based).
        sliding_window: window in tokens of a ``sliding_attention`` layer, else None.
        num_kv_heads, head_dim: attention geometry (0 for other kinds).
        kv_dtype: dtype name of the KV cache (None for other kinds).
        conv_state_shape, conv_dtype: per-sequence conv state, vLLM "SD" layout
            ``(conv_kernel - 1, conv_channels)``; empty / None if absent.
        ssm_state_shape, ssm_dtype: per-sequence temporal state: GDN
            ``(v_heads, v_head_dim, k_head_dim)``; Mamba2 ``(heads, head_dim,
            d_state)``; Mamba1 ``(d_inner, d_state)``.
        flops_per_token: FLOPs of everything in this layer whose cost is linear
            in the number of tokens (projections, conv, state update, MLP/MoE).
        flops_per_pair: attention FLOPs per (query, key) pair, ``4 * num_heads *
            head_dim`` (scores ``q.k`` and the weighted sum of values, 2 FLOPs
            per multiply-add each). 0 for non-attention layers.
        flop_terms: ``(name, flops_per_token)`` pairs that add up to
            ``flops_per_token``, for documentation and debugging.
    """

    kind: str
    kv_bytes_per_token: int
    state_bytes: int
    index: int = 0
    sliding_window: int | None = None
    num_kv_heads: int = 0
    head_dim: int = 0
    kv_dtype: str | None = None
    conv_state_shape: tuple[int, ...] = ()
    conv_dtype: str | None = None
    ssm_state_shape: tuple[int, ...] = ()
    ssm_dtype: str | None = None
    flops_per_token: int = 0
    flops_per_pair: int = 0
    flop_terms: tuple[tuple[str, int], ...] = ()

    @property
    def is_attention(self) -> bool:
        return self.kind in ATTENTION_KINDS

    @property
    def is_recurrent(self) -> bool:
        return self.kind in RECURRENT_KINDS

    def attended_pairs(self, start: int, end: int) -> int:
        """Number of (query, key) pairs for queries at positions ``[start, end)``.

        Causal masking: the query at position ``t`` sees keys ``0..t``, that is
        ``t + 1`` keys, or ``min(t + 1, sliding_window)`` keys for a sliding
        window layer. Exact integer; 0 for non-attention layers.
        """
        if not self.is_attention:
            return 0
        return _causal_pairs(end, self.sliding_window) - _causal_pairs(start, self.sliding_window)

    def prefill_flops(self, num_tokens: int, num_cached: int = 0) -> int:
        """Exact integer FLOPs of this layer for tokens ``[num_cached, num_tokens)``."""
        new = num_tokens - num_cached
        return self.flops_per_token * new + self.flops_per_pair * self.attended_pairs(
            num_cached, num_tokens
        )


def _causal_pairs(n: int, window: int | None) -> int:
    """sum over t in [0, n) of the keys query t sees: min(t + 1, window)."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


# --------------------------------------------------------------------------- #
# FLOP terms (per token). Sources: Marconi (MLSys 2025) section 4 for the
# structure (attention 8LD^2 + 4L^2D, MLP 16LD^2, Mamba 12LD^2 + 16LDN + 10LD),
# generalised with the layer shapes of the vLLM model files named below.
# --------------------------------------------------------------------------- #


def _proj(inputs: int, outputs: int) -> int:
    """Dense projection ``inputs -> outputs``: one multiply-add per weight = 2*in*out FLOPs/token."""
    return 2 * inputs * outputs


def _mlp_terms(hidden: int, intermediate: int, gated: bool, prefix: str = "mlp") -> list[tuple[str, int]]:
    """Feed-forward block per token.

    Gated (SwiGLU / GeGLU: gate, up, down matrices): ``2 * 3 * D * I``;
    non-gated (Nemotron-H relu2: up, down): ``2 * 2 * D * I``. Marconi's
    ``16 L D^2`` is the non-gated case with ``I = 4D``.
    Sources: vllm/model_executor/models/llama.py LlamaMLP (gate_up_proj +
    down_proj), nemotron_h.py NemotronHMLP (up_proj + down_proj).
    """
    matrices = 3 if gated else 2
    return [(prefix, matrices * _proj(hidden, intermediate))]


def _moe_terms(
    hidden: int,
    num_experts: int,
    top_k: int,
    expert_intermediate: int,
    gated: bool,
    shared_intermediate: int = 0,
    shared_gate: bool = False,
) -> list[tuple[str, int]]:
    """Mixture-of-experts block per token: router + ACTIVE experts + shared expert.

    router ``2 * D * E``; routed ``top_k`` experts, each an MLP of width
    ``expert_intermediate``; shared expert(s) an MLP of width
    ``shared_intermediate``; Qwen's ``shared_expert_gate`` (D -> 1) ``2 * D``.
    Sources: vllm/model_executor/models/qwen3_next.py Qwen3NextSparseMoeBlock,
    nemotron_h.py NemotronHMoE, jamba.py JambaMoE.
    """
    matrices = 3 if gated else 2
    terms = [
        ("moe_router", _proj(hidden, num_experts)),
        ("moe_active_experts", top_k * matrices * _proj(hidden, expert_intermediate)),
    ]
    if shared_intermediate:
        terms.append(("moe_shared_expert", matrices * _proj(hidden, shared_intermediate)))
        if shared_gate:
            terms.append(("moe_shared_expert_gate", _proj(hidden, 1)))
    return terms


@dataclass(frozen=True)
class _AttentionShape:
    """A model's attention geometry: model width ``hidden``, ``num_heads`` query heads and
    ``num_kv_heads`` KV heads of ``head_dim``, KV cache dtype ``kv_dtype``."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str


def _attention_layer(index: int, shape: _AttentionShape, *, input_width: int | None = None,
                     output_gate: bool = False, sliding_window: int | None = None,
                     extra_terms: list[tuple[str, int]] | None = None) -> LayerCost:
    """Self-attention layer (+ the feed-forward terms passed in ``extra_terms``).

    Per token (Marconi's ``8 L D^2`` with GQA, head_dim and an optional output gate):
      q_proj ``2 * Din * H * d`` (doubled with Qwen3-Next's output gate, whose
      q_proj also emits the gate), k_proj and v_proj ``2 * Din * Hkv * d`` each,
      o_proj ``2 * H * d * D``.
    Per (query, key) pair (Marconi's ``4 L^2 D``, counted over the causal
    triangle instead of the full square): ``q.k`` ``2 * d`` and ``p * v``
    ``2 * d`` for each of the ``H`` heads: ``4 * H * d``.
    KV bytes per token: ``2 * Hkv * d * kv_dtype_bytes``
    (vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes, block_size 1).
    Sources: vllm/model_executor/models/qwen3_next.py Qwen3NextAttention,
    llama.py LlamaAttention, zamba2.py Zamba2Attention (input width 2D).
    """
    hidden, num_heads, num_kv_heads, head_dim, kv_dtype = (
        shape.hidden, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.kv_dtype
    )
    d_in = input_width or hidden
    q_width = num_heads * head_dim
    kv_width = num_kv_heads * head_dim
    terms = [
        ("q_proj" + ("+gate" if output_gate else ""), _proj(d_in, q_width * (2 if output_gate else 1))),
        ("k_proj", _proj(d_in, kv_width)),
        ("v_proj", _proj(d_in, kv_width)),
        ("o_proj", _proj(q_width, hidden)),
    ]
    terms += extra_terms or []
    return LayerCost(
        kind="sliding_attention" if sliding_window else "full_attention",
        kv_bytes_per_token=2 * kv_width * DTYPE_BYTES[kv_dtype],
        state_bytes=0,
        index=index,
        sliding_window=sliding_window or None,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        kv_dtype=kv_dtype,
        flops_per_token=sum(value for _, value in terms),
        flops_per_pair=4 * num_heads * head_dim,
        flop_terms=tuple(terms),
    )


def _recurrent_layer(
    kind: str,
    index: int,
    conv_kernel: int,
    conv_channels: int,
    ssm_shape: tuple[int, ...],
    dtypes: Dtypes,
    terms: tuple[list[tuple[str, int]], list[tuple[str, int]]],
    extra_terms: list[tuple[str, int]] | None,
) -> LayerCost:
    """A recurrent layer whose conv state is vLLM's "SD" ``(conv_kernel - 1, conv_channels)``.

    Its FLOP terms: ``terms`` is the mixer's terms before and after its depthwise causal
    conv1d, which costs ``2 * conv_kernel * conv_channels`` per token and stands between
    them; then ``extra_terms``."""
    conv_shape = (conv_kernel - 1, conv_channels)
    before, after = terms
    all_terms = [*before, ("conv1d", 2 * conv_kernel * conv_channels), *after, *(extra_terms or [])]
    conv_bytes = math.prod(conv_shape) * DTYPE_BYTES[dtypes.conv]
    ssm_bytes = math.prod(ssm_shape) * DTYPE_BYTES[dtypes.ssm]
    return LayerCost(
        kind=kind,
        kv_bytes_per_token=0,
        state_bytes=conv_bytes + ssm_bytes,
        index=index,
        conv_state_shape=conv_shape,
        conv_dtype=dtypes.conv,
        ssm_state_shape=ssm_shape,
        ssm_dtype=dtypes.ssm,
        flops_per_token=sum(value for _, value in all_terms),
        flop_terms=tuple(all_terms),
    )


def _gdn_layer(index: int, *, hidden: int, num_k_heads: int, num_v_heads: int, k_head_dim: int,
               v_head_dim: int, conv_kernel: int, dtypes: Dtypes,
               extra_terms: list[tuple[str, int]]) -> LayerCost:
    """Gated DeltaNet linear-attention layer (Qwen3-Next, Qwen3.5).

    State (vLLM MambaStateShapeCalculator.gated_delta_net_state_shape, TP 1):
      conv ``(K - 1, 2 * Hk * dk + Hv * dv)``; SSM ``(Hv, dv, dk)``.
    Per token (vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py):
      in_proj_qkvz ``2 * D * (2 * Hk * dk + 2 * Hv * dv)``;
      in_proj_ba ``2 * D * 2 * Hv``;
      depthwise causal conv1d over the q, k, v channels ``2 * K * conv_dim``;
      delta-rule update per value head, on the ``dv x dk`` state S: decay
      ``g * S`` (dk*dv), retrieval ``S k`` (2 dk dv), rank-1 write
      ``S += k (beta (v - S k))^T`` (2 dk dv), read-out ``S q`` (2 dk dv):
      ``7 * Hv * dk * dv``;
      out_proj ``2 * Hv * dv * D``.
    """
    key_dim = num_k_heads * k_head_dim
    value_dim = num_v_heads * v_head_dim
    conv_dim = 2 * key_dim + value_dim
    before_conv = [
        ("in_proj_qkvz", _proj(hidden, 2 * key_dim + 2 * value_dim)),
        ("in_proj_ba", _proj(hidden, 2 * num_v_heads)),
    ]
    after_conv = [
        ("delta_rule_update", 7 * num_v_heads * k_head_dim * v_head_dim),
        ("out_proj", _proj(value_dim, hidden)),
    ]
    return _recurrent_layer("gdn", index, conv_kernel, conv_dim, (num_v_heads, v_head_dim, k_head_dim),
                            dtypes, (before_conv, after_conv), extra_terms)


def _mamba2_layer(index: int, *, hidden: int, intermediate: int, num_heads: int, head_dim: int,
                  n_groups: int, state_size: int, conv_kernel: int, dtypes: Dtypes,
                  extra_terms: list[tuple[str, int]] | None = None) -> LayerCost:
    """Mamba2 (SSD) mixer (Nemotron-H, Zamba2).

    State (vLLM MambaStateShapeCalculator.mamba2_state_shape, TP 1):
      conv ``(K - 1, I + 2 * G * N)``; SSM ``(H, P, N)``.
    Per token (vllm/model_executor/layers/mamba/mamba_mixer2.py):
      in_proj to z, x, B, C, dt: ``2 * D * (2 * I + 2 * G * N + H)``;
      conv1d over x, B, C: ``2 * K * (I + 2 * G * N)``;
      SSM step per head on the ``P x N`` state: ``h = exp(dt A) h + (dt x) B^T``
      (3 P N) and ``y = h C`` (2 P N): ``5 * H * P * N``;
      out_proj ``2 * I * D``.
    Marconi's ``12 L D^2 + 16 L D N + 10 L D`` is this with I = 2D and its own
    accounting of the B/C projections and element-wise terms.
    """
    conv_dim = intermediate + 2 * n_groups * state_size
    in_proj = ("in_proj", _proj(hidden, 2 * intermediate + 2 * n_groups * state_size + num_heads))
    after_conv = [
        ("ssm_update", 5 * num_heads * head_dim * state_size),
        ("out_proj", _proj(intermediate, hidden)),
    ]
    return _recurrent_layer("mamba2", index, conv_kernel, conv_dim, (num_heads, head_dim, state_size),
                            dtypes, ([in_proj], after_conv), extra_terms)


def _mamba1_layer(index: int, *, hidden: int, intermediate: int, state_size: int, conv_kernel: int,
                  dt_rank: int, dtypes: Dtypes, extra_terms: list[tuple[str, int]]) -> LayerCost:
    """Mamba1 (selective scan) mixer (Jamba).

    State (vLLM MambaStateShapeCalculator.mamba1_state_shape, TP 1):
      conv ``(K - 1, I)``; SSM ``(I, N)``.
    Per token (vllm/model_executor/layers/mamba/mamba_mixer.py):
      in_proj to x, z ``2 * D * 2I``; conv1d ``2 * K * I``;
      x_proj to dt, B, C ``2 * I * (R + 2N)``; dt_proj ``2 * R * I``;
      scan per (channel, state) element: ``exp(dt A)`` (2), ``(dt x) B`` (1),
      ``h = dA h + dBx`` (2), ``y += C h`` (2): ``7 * I * N``;
      out_proj ``2 * I * D``.
    """
    in_proj = ("in_proj", _proj(hidden, 2 * intermediate))
    after_conv = [
        ("x_proj", _proj(intermediate, dt_rank + 2 * state_size)),
        ("dt_proj", _proj(dt_rank, intermediate)),
        ("selective_scan", 7 * intermediate * state_size),
        ("out_proj", _proj(intermediate, hidden)),
    ]
    return _recurrent_layer("mamba1", index, conv_kernel, intermediate, (intermediate, state_size),
                            dtypes, ([in_proj], after_conv), extra_terms)


