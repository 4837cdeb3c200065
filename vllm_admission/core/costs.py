"""Cost model of a hybrid (attention + recurrent) model, read from its config.json.

What a prefix-cache policy needs to know about a model, and nothing else:

* bytes: how much KV cache one token costs in the attention layers, and how
  large one sequence's recurrent state (SSM / linear-attention state plus the
  short-convolution state) is in the recurrent layers;
* FLOPs: how much prefill work a cache hit of ``k`` tokens saves.

The byte figures follow what vLLM 0.32 allocates (tensor parallel size 1):
state shapes come from ``MambaStateShapeCalculator`` and state dtypes from
``MambaStateDtypeCalculator`` in ``vllm/model_executor/layers/mamba/mamba_utils.py``
as each model's ``get_mamba_state_shape_from_config`` /
``get_mamba_state_dtype_from_config`` calls them, with the per-model dtype
hooks of ``vllm/model_executor/models/config.py``. ``tests/test_costs.py``
checks them against those very functions.

The FLOP model is the one of Marconi (Pan et al., MLSys 2025, section 4),
rewritten for real configs: grouped-query attention with its own head_dim,
causal masking, gated MLPs, mixture-of-experts with only the active experts,
and the projections of Gated DeltaNet / Mamba2 / Mamba1 mixers. Every term is
documented where it is computed and in ``docs/cost-model.md``. Conventions:

* a multiply-add counts 2 FLOPs, so a dense projection from ``m`` to ``n``
  features costs ``2*m*n`` FLOPs per token;
* element-wise work whose size does not involve a state dimension
  (activations, gates, norms, residuals, biases, RoPE, softmax) is ignored; it
  is far below 1 % of the terms that are kept;
* the embedding lookup and the LM head are ignored (vLLM computes logits for
  the last prompt token only, so the LM head does not depend on how many
  tokens a hit skips);
* recurrent mixers are counted in their recurrent (token by token) form; the
  chunked prefill kernels do somewhat more arithmetic, so those figures are a
  lower bound.

Nothing here imports vllm or torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = [
    "ATTENTION_KINDS",
    "BUILTIN_MODELS",
    "FFN_ONLY_KINDS",
    "LAYER_KINDS",
    "RECURRENT_KINDS",
    "SUPPORTED_ARCHITECTURES",
    "LayerCost",
    "ModelConfigError",
    "ModelCosts",
    "load_model",
]


class ModelConfigError(ValueError):
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

_BUILTIN_DIR = Path(__file__).resolve().parent / "model_configs"
#: Short builtin names accepted by :func:`load_model` -> (file, display name).
BUILTIN_MODELS: dict[str, tuple[str, str]] = {
    "qwen3-next-80b-a3b": ("qwen3-next-80b-a3b.json", "Qwen3-Next-80B-A3B-Instruct"),
}

# Bytes per element of the dtype names that appear in HF configs and vLLM flags
# (vllm/utils/torch_utils.py: STR_DTYPE_TO_TORCH_DTYPE).
_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
_CANONICAL_DTYPE = {"float": "float32", "half": "float16"}


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
# Whole model
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ModelCosts:
    """Memory and FLOP costs of one model, as vLLM 0.32 would run it (TP = 1).

    Attributes:
        name: free-text display name (from ``name=``, ``_name_or_path`` or the
            file name).
        architecture: the HF ``architectures[0]`` string.
        layers: one :class:`LayerCost` per decoder layer, in order. Exception:
            a Zamba2 "hybrid" decoder layer runs the shared attention block and
            a Mamba2 mixer, and every Falcon-H1 decoder layer runs attention
            and Mamba2 in parallel, so those layers contribute two entries
            with the same ``index`` (attention first).
        hidden_size: model width D.
        dtype_bytes: bytes per element of the model (activation / weight) dtype.
        dtype: that dtype's name (``"bfloat16"``...).
        model_type: HF ``model_type`` of the (text) config.
        num_decoder_layers: number of decoder layers.
        vocab_size: vocabulary size (not used in any cost).
        source: the file the config was read from, or None for a dict.
        mamba_ssm_cache_dtype: the ``mamba_ssm_cache_dtype`` this model was
            built with, as requested (``"auto"`` unresolved); the dtype it
            resolved to is :attr:`ssm_dtype`.
    """

    name: str
    architecture: str
    layers: tuple[LayerCost, ...]
    hidden_size: int
    dtype_bytes: int
    dtype: str = "bfloat16"
    model_type: str = ""
    num_decoder_layers: int = 0
    vocab_size: int = 0
    source: str | None = None
    mamba_ssm_cache_dtype: str = "auto"

    # ---- memory ----------------------------------------------------------- #

    @property
    def attention_layers(self) -> tuple[LayerCost, ...]:
        return tuple(layer for layer in self.layers if layer.is_attention)

    @property
    def recurrent_layers(self) -> tuple[LayerCost, ...]:
        return tuple(layer for layer in self.layers if layer.is_recurrent)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token costs, summed over all attention layers.

        Sliding-window layers are counted like full attention (per token), but
        they only keep the last ``sliding_window`` tokens; see
        :attr:`LayerCost.sliding_window`.
        """
        return sum(layer.kv_bytes_per_token for layer in self.attention_layers)

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state over all recurrent layers (SSM + conv)."""
        return sum(layer.state_bytes for layer in self.recurrent_layers)

    @property
    def ssm_dtype(self) -> str | None:
        """Resolved dtype name of the recurrent layers' SSM (temporal) state.

        ``"bfloat16"``, ``"float32"``...: what ``mamba_ssm_cache_dtype``
        (``"auto"`` or explicit) resolved to, as vLLM allocates it on a GPU.
        None without recurrent layers. All recurrent layers share it.
        """
        return next((layer.ssm_dtype for layer in self.recurrent_layers), None)

    @property
    def is_hybrid(self) -> bool:
        """True when the model has both attention and recurrent layers."""
        return bool(self.attention_layers) and bool(self.recurrent_layers)

    @property
    def state_tokens_equivalent(self) -> float:
        """How many tokens of KV cache take as much memory as one recurrent state.

        ``state_bytes / kv_bytes_per_token``; ``inf`` without attention layers.
        """
        if self.kv_bytes_per_token == 0:
            return math.inf
        return self.state_bytes / self.kv_bytes_per_token

    def layer_counts(self) -> dict[str, int]:
        """Number of entries of each kind in :attr:`layers` (kinds with 0 omitted)."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return counts

    # ---- compute ---------------------------------------------------------- #

    @cached_property
    def _flop_coefficients(self) -> tuple[int, tuple[tuple[int | None, int], ...]]:
        linear = sum(layer.flops_per_token for layer in self.layers)
        per_window: dict[int | None, int] = {}
        for layer in self.attention_layers:
            per_window[layer.sliding_window] = (
                per_window.get(layer.sliding_window, 0) + layer.flops_per_pair
            )
        return linear, tuple(per_window.items())

    @property
    def flops_per_token(self) -> int:
        """FLOPs per prompt token of all terms linear in the token count."""
        return self._flop_coefficients[0]

    @property
    def flops_per_pair(self) -> int:
        """Attention FLOPs per (query, key) pair, summed over attention layers."""
        return sum(coefficient for _, coefficient in self._flop_coefficients[1])

    def prefill_flops(self, num_tokens: int, num_cached: int = 0) -> float:
        """FLOPs to prefill tokens ``[num_cached, num_tokens)`` of a prompt.

        The first ``num_cached`` tokens come from the cache. Linear terms
        (projections, MLP / active MoE experts, recurrent mixers) count the
        ``num_tokens - num_cached`` new tokens; the attention term counts, for
        each new query at position ``t``, its ``t + 1`` causal keys (at most
        ``sliding_window``). Formulas: see :class:`LayerCost` and
        ``docs/cost-model.md`` (Marconi, MLSys 2025, section 4, generalised).

        The total is computed with exact integers and returned as a float; it
        is exact while below 2**53 (about 9e15 FLOPs). Because every token's
        cost depends only on its own position,
        ``prefill_flops(n, 0) - prefill_flops(n, k) == prefill_flops(k, 0)``.

        Raises:
            ValueError: unless ``0 <= num_cached <= num_tokens`` (integers).
        """
        _check_range(num_tokens, num_cached, "num_tokens", "num_cached")
        linear, per_window = self._flop_coefficients
        total = linear * (num_tokens - num_cached)
        for window, coefficient in per_window:
            pairs = _causal_pairs(num_tokens, window) - _causal_pairs(num_cached, window)
            total += coefficient * pairs
        return float(total)

    def saved_flops(self, hit_tokens: int, prompt_tokens: int) -> float:
        """FLOPs a cache hit on the first ``hit_tokens`` of a ``prompt_tokens``-token prompt saves.

        Equal to ``prefill_flops(prompt_tokens, 0) - prefill_flops(prompt_tokens, hit_tokens)``.

        Raises:
            ValueError: unless ``0 <= hit_tokens <= prompt_tokens`` (integers).
        """
        _check_range(prompt_tokens, hit_tokens, "prompt_tokens", "hit_tokens")
        return self.prefill_flops(prompt_tokens, 0) - self.prefill_flops(prompt_tokens, hit_tokens)

    def summary(self) -> dict[str, Any]:
        """Headline figures as plain values (for the CLI and the docs table)."""
        return {
            "name": self.name,
            "architecture": self.architecture,
            "layers": self.layer_counts(),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "state_bytes": self.state_bytes,
            "ssm_dtype": self.ssm_dtype,
            "state_tokens_equivalent": self.state_tokens_equivalent,
            "is_hybrid": self.is_hybrid,
            "flops_per_token": self.flops_per_token,
            "flops_per_pair": self.flops_per_pair,
        }

    # ---- construction ----------------------------------------------------- #

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike | Mapping[str, Any],
        *,
        name: str | None = None,
        dtype: str | None = None,
        kv_cache_dtype: str = "auto",
        mamba_cache_dtype: str = "auto",
        mamba_ssm_cache_dtype: str = "auto",
    ) -> "ModelCosts":
        """Build the cost model from a Hugging Face ``config.json`` (path or parsed dict).

        The keyword arguments mirror vLLM's engine flags of the same names
        (``--dtype``, ``--kv-cache-dtype``, ``--mamba-cache-dtype``,
        ``--mamba-ssm-cache-dtype``); ``"auto"`` / None resolve as vLLM 0.32
        does: model dtype from ``torch_dtype`` / ``dtype`` (float32 or missing
        becomes bfloat16, as vLLM does on GPUs); KV and conv state in the model
        dtype; SSM state in the conv-state dtype, except Nemotron-H (the
        config's ``mamba_ssm_cache_dtype``, default float32) and Qwen3.5 (its
        ``mamba_ssm_dtype``). The value given is kept as
        :attr:`mamba_ssm_cache_dtype`, the resolved one is :attr:`ssm_dtype`.
        Note: vLLM's CPU platform (``vllm/platforms/cpu.py``,
        ``CpuPlatform.check_and_update_config``) resets
        ``mamba_ssm_cache_dtype`` to float32 on CPUs with AVX-512 BF16 unless
        bfloat16 / float16 was asked for and the accelerated GDN backend takes
        it; pass ``mamba_ssm_cache_dtype="float32"`` to model such an engine.

        Raises:
            ModelConfigError: unreadable file, invalid JSON, missing or invalid
                field, unsupported architecture or dtype (one-line message that
                names the file and the field). A config without recurrent
                layers is accepted (``is_hybrid`` is then False).
        """
        if isinstance(source, Mapping):
            raw: dict[str, Any] = dict(source)
            label, path = "<dict>", None
        else:
            path = Path(os.fspath(source))
            label = str(path)
            raw = _read_json(path)
        if not isinstance(raw, dict):
            raise ModelConfigError(f"{label}: top level must be a JSON object, got {type(raw).__name__}")
        top = _Fields(raw, label)
        architectures = top.get("architectures")
        if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
            raise ModelConfigError(
                f"{label}: field 'architectures' must be a non-empty list of names; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        architecture = architectures[0]
        builder = _BUILDERS.get(architecture)
        if builder is None:
            raise ModelConfigError(
                f"{label}: architecture '{architecture}' is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        text = top.sub("text_config") if "text_config" in raw else top
        dtypes = _Dtypes.resolve(
            top, text, dtype, kv_cache_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype, architecture
        )
        layers, num_decoder_layers = builder(text, dtypes)
        return cls(
            name=name or _display_name(raw, path, architecture),
            architecture=architecture,
            layers=tuple(layers),
            hidden_size=text.int("hidden_size"),
            dtype_bytes=_DTYPE_BYTES[dtypes.model],
            dtype=dtypes.model,
            model_type=str(text.get("model_type") or top.get("model_type") or ""),
            num_decoder_layers=num_decoder_layers,
            vocab_size=text.int("vocab_size", 0),
            source=str(path) if path is not None else None,
            mamba_ssm_cache_dtype=str(mamba_ssm_cache_dtype),
        )


def load_model(spec: str | os.PathLike, **overrides: Any) -> ModelCosts:
    """Load a :class:`ModelCosts` from a builtin short name or a path to a config.json.

    ``spec`` is first looked up in :data:`BUILTIN_MODELS`
    (``"qwen3-next-80b-a3b"``); otherwise it is read as a file path (a
    directory is taken to contain ``config.json``). ``overrides`` are passed
    to :meth:`ModelCosts.from_config` (``name``, ``dtype``, ``kv_cache_dtype``,
    ``mamba_cache_dtype``, ``mamba_ssm_cache_dtype``).

    Raises:
        ModelConfigError: unknown name / missing file / invalid JSON / invalid
            config; the message lists the builtin names.
    """
    text = os.fspath(spec)
    if text in BUILTIN_MODELS:
        file_name, display = BUILTIN_MODELS[text]
        overrides.setdefault("name", display)
        return ModelCosts.from_config(_BUILTIN_DIR / file_name, **overrides)
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelConfigError(
            f"unknown model '{text}': not a builtin name and no such file "
            f"(builtins: {', '.join(BUILTIN_MODELS)})"
        )
    try:
        return ModelCosts.from_config(path, **overrides)
    except ModelConfigError as exc:
        raise ModelConfigError(f"{exc} (builtins: {', '.join(BUILTIN_MODELS)})") from None


# --------------------------------------------------------------------------- #
# Reading configs
# --------------------------------------------------------------------------- #


def _read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    try:
        # json accepts the non-standard tokens Infinity / NaN that some
        # Nemotron-H configs contain (time_step_limit).
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None


def _display_name(raw: Mapping[str, Any], path: Path | None, architecture: str) -> str:
    name_or_path = raw.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path.strip("/"):
        return name_or_path.rstrip("/").rsplit("/", 1)[-1]
    if path is not None:
        stem = path.stem
        if stem == "config" and path.parent.name:
            return path.parent.name
        # "Org__Model.json" (the naming of /work/shared/model_configs) -> "Model"
        return stem.split("__", 1)[-1]
    return architecture


_MISSING = object()


class _Fields:
    """Typed access to one JSON object, with one-line errors naming file and field."""

    def __init__(self, data: Mapping[str, Any], label: str, prefix: str = "") -> None:
        self.data = data
        self.label = label
        self.prefix = prefix

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def _error(self, key: str, problem: str) -> ModelConfigError:
        return ModelConfigError(f"{self.label}: field '{self.prefix}{key}' {problem}")

    def sub(self, key: str) -> "_Fields":
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            raise self._error(key, "must be a JSON object")
        return _Fields(value, self.label, f"{self.prefix}{key}.")

    def int(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self._error(key, "is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise self._error(key, f"must be an integer, got {value!r}")
        if int(value) < minimum:
            raise self._error(key, f"must be >= {minimum}, got {value!r}")
        return int(value)

    def first_int(self, keys: tuple[str, ...], default: Any = _MISSING, *, minimum: int = 1) -> int:
        """The first of ``keys`` that is present and not null."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.int(key, minimum=minimum)
        if default is _MISSING:
            raise self._error(keys[0], "is missing" + (f" (also tried {', '.join(keys[1:])})" if keys[1:] else ""))
        return default

    def list(self, key: str, default: Any = _MISSING) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self._error(key, "is missing")
            return default
        if not isinstance(value, list):
            raise self._error(key, f"must be a list, got {type(value).__name__}")
        return value

    def str(self, key: str, default: Any = _MISSING) -> str:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self._error(key, "is missing")
            return default
        if not isinstance(value, str):
            raise self._error(key, f"must be a string, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._error(key, f"must be true or false, got {value!r}")
        return value


# --------------------------------------------------------------------------- #
# dtypes (vLLM 0.32 rules)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Dtypes:
    model: str
    kv: str
    conv: str
    ssm: str

    @staticmethod
    def resolve(
        top: _Fields,
        text: _Fields,
        dtype: str | None,
        kv_cache_dtype: str,
        mamba_cache_dtype: str,
        mamba_ssm_cache_dtype: str,
        architecture: str,
    ) -> "_Dtypes":
        """Resolve the four dtypes as vLLM 0.32 does (file references in the body)."""
        # Model dtype: vllm/config/model.py _get_and_verify_dtype / _resolve_auto_dtype:
        # "auto" takes the config's dtype, and float32 checkpoints are served in
        # the platform's preferred half type (bfloat16 on current GPUs).
        if dtype is None or dtype == "auto":
            config_dtype = None
            for fields in (text, top):
                for key in ("torch_dtype", "dtype"):
                    if isinstance(fields.get(key), str):
                        config_dtype = fields.get(key)
                        break
                if config_dtype is not None:
                    break
            model = _dtype_name(config_dtype or "float32", top.label, "torch_dtype")
            if model == "float32":
                model = "bfloat16"
        else:
            model = _dtype_name(dtype, top.label, "dtype (argument)")
        if model not in ("bfloat16", "float16", "float32"):
            raise ModelConfigError(f"{top.label}: model dtype '{model}' is not a float dtype")

        # KV cache: vllm/config/cache.py cache_dtype; "auto" = model dtype.
        kv = model if kv_cache_dtype == "auto" else _dtype_name(kv_cache_dtype, top.label, "kv_cache_dtype (argument)")
        # Conv state: MambaStateDtypeCalculator._mamba_state_dtype ->
        # get_kv_cache_torch_dtype(mamba_cache_dtype, model_dtype).
        conv = (
            model
            if mamba_cache_dtype == "auto"
            else _dtype_name(mamba_cache_dtype, top.label, "mamba_cache_dtype (argument)")
        )
        # SSM state: "auto" = the conv-state dtype, after the per-model hooks of
        # vllm/model_executor/models/config.py have replaced "auto":
        #   NemotronHForCausalLMConfig: hf_config.mamba_ssm_cache_dtype, default float32
        #   Qwen3_5ForConditionalGenerationConfig: hf_text_config.mamba_ssm_dtype
        ssm_choice = mamba_ssm_cache_dtype
        if ssm_choice == "auto":
            if architecture in _NEMOTRON_H:
                ssm_choice = text.str("mamba_ssm_cache_dtype", "float32")
            elif architecture in _QWEN3_5 and text.get("mamba_ssm_dtype") is not None:
                ssm_choice = text.str("mamba_ssm_dtype")
        ssm = conv if ssm_choice == "auto" else _dtype_name(ssm_choice, top.label, "mamba_ssm_cache_dtype")
        return _Dtypes(model=model, kv=kv, conv=conv, ssm=ssm)


def _dtype_name(value: str, label: str, field_name: str) -> str:
    name = str(value).lower().replace("torch.", "")
    if name not in _DTYPE_BYTES:
        raise ModelConfigError(
            f"{label}: field '{field_name}' has unsupported dtype {value!r}; "
            f"known: {', '.join(sorted(_DTYPE_BYTES))}"
        )
    return _CANONICAL_DTYPE.get(name, name)


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


def _attention_layer(
    index: int,
    *,
    hidden: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype: str,
    input_width: int | None = None,
    output_gate: bool = False,
    sliding_window: int | None = None,
    extra_terms: list[tuple[str, int]] | None = None,
) -> LayerCost:
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
        kv_bytes_per_token=2 * kv_width * _DTYPE_BYTES[kv_dtype],
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
    conv_shape: tuple[int, int],
    ssm_shape: tuple[int, ...],
    dtypes: _Dtypes,
    terms: list[tuple[str, int]],
) -> LayerCost:
    conv_bytes = math.prod(conv_shape) * _DTYPE_BYTES[dtypes.conv]
    ssm_bytes = math.prod(ssm_shape) * _DTYPE_BYTES[dtypes.ssm]
    return LayerCost(
        kind=kind,
        kv_bytes_per_token=0,
        state_bytes=conv_bytes + ssm_bytes,
        index=index,
        conv_state_shape=conv_shape,
        conv_dtype=dtypes.conv,
        ssm_state_shape=ssm_shape,
        ssm_dtype=dtypes.ssm,
        flops_per_token=sum(value for _, value in terms),
        flop_terms=tuple(terms),
    )


def _gdn_layer(
    index: int,
    *,
    hidden: int,
    num_k_heads: int,
    num_v_heads: int,
    k_head_dim: int,
    v_head_dim: int,
    conv_kernel: int,
    dtypes: _Dtypes,
    extra_terms: list[tuple[str, int]],
) -> LayerCost:
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
    terms = [
        ("in_proj_qkvz", _proj(hidden, 2 * key_dim + 2 * value_dim)),
        ("in_proj_ba", _proj(hidden, 2 * num_v_heads)),
        ("conv1d", 2 * conv_kernel * conv_dim),
        ("delta_rule_update", 7 * num_v_heads * k_head_dim * v_head_dim),
        ("out_proj", _proj(value_dim, hidden)),
    ] + extra_terms
    return _recurrent_layer(
        "gdn",
        index,
        (conv_kernel - 1, conv_dim),
        (num_v_heads, v_head_dim, k_head_dim),
        dtypes,
        terms,
    )


def _mamba2_layer(
    index: int,
    *,
    hidden: int,
    intermediate: int,
    num_heads: int,
    head_dim: int,
    n_groups: int,
    state_size: int,
    conv_kernel: int,
    dtypes: _Dtypes,
    extra_terms: list[tuple[str, int]] | None = None,
) -> LayerCost:
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
    terms = [
        ("in_proj", _proj(hidden, 2 * intermediate + 2 * n_groups * state_size + num_heads)),
        ("conv1d", 2 * conv_kernel * conv_dim),
        ("ssm_update", 5 * num_heads * head_dim * state_size),
        ("out_proj", _proj(intermediate, hidden)),
    ] + (extra_terms or [])
    return _recurrent_layer(
        "mamba2",
        index,
        (conv_kernel - 1, conv_dim),
        (num_heads, head_dim, state_size),
        dtypes,
        terms,
    )


def _mamba1_layer(
    index: int,
    *,
    hidden: int,
    intermediate: int,
    state_size: int,
    conv_kernel: int,
    dt_rank: int,
    dtypes: _Dtypes,
    extra_terms: list[tuple[str, int]],
) -> LayerCost:
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
    terms = [
        ("in_proj", _proj(hidden, 2 * intermediate)),
        ("conv1d", 2 * conv_kernel * intermediate),
        ("x_proj", _proj(intermediate, dt_rank + 2 * state_size)),
        ("dt_proj", _proj(dt_rank, intermediate)),
        ("selective_scan", 7 * intermediate * state_size),
        ("out_proj", _proj(intermediate, hidden)),
    ] + extra_terms
    return _recurrent_layer(
        "mamba1",
        index,
        (conv_kernel - 1, intermediate),
        (intermediate, state_size),
        dtypes,
        terms,
    )


# --------------------------------------------------------------------------- #
# Architectures
# --------------------------------------------------------------------------- #

Builder = Callable[[_Fields, _Dtypes], tuple[list[LayerCost], int]]


def _head_dim(cfg: _Fields, hidden: int, num_heads: int) -> int:
    if cfg.get("head_dim") is not None:
        return cfg.int("head_dim")
    if cfg.get("attention_head_dim") is not None:
        return cfg.int("attention_head_dim")
    if hidden % num_heads:
        raise cfg._error("head_dim", f"is missing and hidden_size {hidden} is not a multiple of num_attention_heads {num_heads}")
    return hidden // num_heads


def _qwen_layer_types(cfg: _Fields, num_layers: int) -> list[str]:
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


def _build_qwen_gdn(cfg: _Fields, dtypes: _Dtypes) -> tuple[list[LayerCost], int]:
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
    num_heads = cfg.int("num_attention_heads")
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    head_dim = _head_dim(cfg, hidden, num_heads)
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
            ffn = _moe_terms(
                hidden,
                cfg.int("num_experts"),
                cfg.int("num_experts_per_tok"),
                cfg.int("moe_intermediate_size"),
                gated=True,
                shared_intermediate=cfg.int("shared_expert_intermediate_size", 0, minimum=0),
                shared_gate=True,
            )
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
                    hidden=hidden,
                    num_heads=num_heads,
                    num_kv_heads=num_kv_heads,
                    head_dim=head_dim,
                    kv_dtype=dtypes.kv,
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


def _build_nemotron_h(cfg: _Fields, dtypes: _Dtypes) -> tuple[list[LayerCost], int]:
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

    num_heads = cfg.int("num_attention_heads")
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    head_dim = _head_dim(cfg, hidden, num_heads)
    window = cfg.int("sliding_window", None)
    layers: list[LayerCost] = []
    mlp_index = 0
    for i, kind in enumerate(kinds):
        if kind == "mamba2":
            num_m_heads = cfg.int("mamba_num_heads")
            m_head_dim = cfg.int("mamba_head_dim")
            layers.append(
                _mamba2_layer(
                    i,
                    hidden=hidden,
                    intermediate=num_m_heads * m_head_dim,
                    num_heads=num_m_heads,
                    head_dim=m_head_dim,
                    n_groups=cfg.int("n_groups"),
                    state_size=cfg.int("ssm_state_size"),
                    conv_kernel=cfg.int("conv_kernel"),
                    dtypes=dtypes,
                )
            )
        elif kind == "full_attention":
            layers.append(
                _attention_layer(
                    i,
                    hidden=hidden,
                    num_heads=num_heads,
                    num_kv_heads=num_kv_heads,
                    head_dim=head_dim,
                    kv_dtype=dtypes.kv,
                    sliding_window=window,
                )
            )
        elif kind == "mlp":
            intermediate = cfg.get("intermediate_size")
            if isinstance(intermediate, list):
                if not intermediate:
                    raise cfg._error("intermediate_size", "is an empty list")
                intermediate = intermediate[0] if len(intermediate) == 1 else intermediate[mlp_index]
                width = _Fields({"intermediate_size": intermediate}, cfg.label, cfg.prefix).int("intermediate_size")
            else:
                width = cfg.int("intermediate_size")
            mlp_index += 1
            layers.append(_ffn_only_layer("mlp", i, _mlp_terms(hidden, width, gated=False)))
        else:
            latent = cfg.int("moe_latent_size", None)
            expert_width = latent or hidden
            terms = _moe_terms(
                expert_width,
                cfg.int("n_routed_experts"),
                cfg.int("num_experts_per_tok"),
                cfg.int("moe_intermediate_size"),
                gated=False,
            )
            # The router reads the full hidden state even with latent experts.
            terms[0] = ("moe_router", _proj(hidden, cfg.int("n_routed_experts")))
            shared = cfg.int("n_shared_experts", 0, minimum=0)
            if shared:
                terms += _mlp_terms(
                    hidden, cfg.int("moe_shared_expert_intermediate_size") * shared, gated=False, prefix="moe_shared_expert"
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


def _build_zamba2(cfg: _Fields, dtypes: _Dtypes) -> tuple[list[LayerCost], int]:
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
    head_dim = cfg.int("attention_head_dim")
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
            layers.append(
                _attention_layer(
                    i,
                    hidden=hidden,
                    num_heads=num_heads,
                    num_kv_heads=num_heads,
                    head_dim=head_dim,
                    kv_dtype=dtypes.kv,
                    input_width=attn_width,
                    extra_terms=extra,
                )
            )
        layers.append(
            _mamba2_layer(
                i,
                hidden=hidden,
                intermediate=mamba_intermediate,
                num_heads=cfg.int("n_mamba_heads"),
                head_dim=cfg.int("mamba_headdim"),
                n_groups=cfg.int("mamba_ngroups", 1),
                state_size=cfg.int("mamba_d_state"),
                conv_kernel=cfg.int("mamba_d_conv"),
                dtypes=dtypes,
            )
        )
    return layers, len(block_types)


def _build_jamba(cfg: _Fields, dtypes: _Dtypes) -> tuple[list[LayerCost], int]:
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
    num_heads = cfg.int("num_attention_heads")
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    head_dim = _head_dim(cfg, hidden, num_heads)
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
            layers.append(
                _attention_layer(
                    i,
                    hidden=hidden,
                    num_heads=num_heads,
                    num_kv_heads=num_kv_heads,
                    head_dim=head_dim,
                    kv_dtype=dtypes.kv,
                    sliding_window=window,
                    extra_terms=ffn,
                )
            )
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


def _build_granite_hybrid(cfg: _Fields, dtypes: _Dtypes) -> tuple[list[LayerCost], int]:
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
                _mamba2_layer(
                    i,
                    hidden=hidden,
                    intermediate=cfg.int("mamba_expand") * hidden,
                    num_heads=cfg.int("mamba_n_heads"),
                    head_dim=cfg.int("mamba_d_head"),
                    n_groups=cfg.int("mamba_n_groups", 1),
                    state_size=cfg.int("mamba_d_state"),
                    conv_kernel=cfg.int("mamba_d_conv"),
                    dtypes=dtypes,
                    extra_terms=list(ffn),
                )
            )
        elif layer_type in ("attention", "full_attention"):
            layers.append(
                _attention_layer(
                    i,
                    hidden=hidden,
                    num_heads=num_heads,
                    num_kv_heads=num_kv_heads,
                    head_dim=hidden // num_heads,
                    kv_dtype=dtypes.kv,
                    extra_terms=list(ffn),
                )
            )
        else:
            raise cfg._error(key, f"has unknown entry {layer_type!r} (expected mamba or attention)")
    return layers, len(types)


def _build_falcon_h1(cfg: _Fields, dtypes: _Dtypes) -> tuple[list[LayerCost], int]:
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
    head_dim = cfg.int("head_dim", None) or _head_dim(_Fields({}, cfg.label, cfg.prefix), hidden, num_heads)
    d_ssm = cfg.int("mamba_d_ssm", None) or int(cfg.int("mamba_expand") * hidden)
    layers: list[LayerCost] = []
    for i in range(num_layers):
        layers.append(
            _attention_layer(
                i,
                hidden=hidden,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                kv_dtype=dtypes.kv,
                extra_terms=_mlp_terms(hidden, cfg.int("intermediate_size"), gated=True),
            )
        )
        layers.append(
            _mamba2_layer(
                i,
                hidden=hidden,
                intermediate=d_ssm,
                num_heads=cfg.int("mamba_n_heads"),
                head_dim=cfg.int("mamba_d_head"),
                n_groups=cfg.int("mamba_n_groups", 1),
                state_size=cfg.int("mamba_d_state"),
                conv_kernel=cfg.int("mamba_d_conv"),
                dtypes=dtypes,
            )
        )
    return layers, num_layers


def _build_dense(cfg: _Fields, dtypes: _Dtypes) -> tuple[list[LayerCost], int]:
    """Plain decoder-only transformers (Llama, Mistral, Qwen2/3, Qwen3-MoE): no recurrent layer.

    Accepted so that a non-hybrid model gives ``is_hybrid == False`` instead of
    an error. Source: vllm/model_executor/models/llama.py, qwen2.py, qwen3.py,
    qwen3_moe.py (MoE when ``num_experts > 0``, ``(i + 1) % decoder_sparse_step
    == 0`` and i not in ``mlp_only_layers``). A ``sliding_window`` applies to
    every layer when set (Mistral; Qwen2/3 only with ``use_sliding_window``).
    """
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    num_heads = cfg.int("num_attention_heads")
    num_kv_heads = cfg.int("num_key_value_heads", num_heads)
    head_dim = _head_dim(cfg, hidden, num_heads)
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
        layers.append(
            _attention_layer(
                i,
                hidden=hidden,
                num_heads=num_heads,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                kv_dtype=dtypes.kv,
                sliding_window=window,
                extra_terms=ffn,
            )
        )
    return layers, num_layers


_NEMOTRON_H = ("NemotronHForCausalLM",)
_QWEN3_5 = (
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM",
)
_BUILDERS: dict[str, Builder] = {
    "Qwen3NextForCausalLM": _build_qwen_gdn,
    **{arch: _build_qwen_gdn for arch in _QWEN3_5},
    **{arch: _build_nemotron_h for arch in _NEMOTRON_H},
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
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_BUILDERS)


def _check_range(total: int, part: int, total_name: str, part_name: str) -> None:
    for value, value_name in ((total, total_name), (part, part_name)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value_name} must be an integer, got {value!r}")
    if not 0 <= part <= total:
        raise ValueError(f"need 0 <= {part_name} <= {total_name}, got {part_name}={part}, {total_name}={total}")
