"""The whole model: :class:`ModelCosts` and :func:`load_model`."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from vllm_admission.core.costs.architectures import BUILDERS, SUPPORTED_ARCHITECTURES
from vllm_admission.core.costs.config import ConfigFields, display_name, read_json, resolve_dtypes
from vllm_admission.core.costs.dtypes import DTYPE_BYTES
from vllm_admission.core.costs.layers import (
    LayerCost,
    ModelConfigError,
    _causal_pairs,
)

_BUILTIN_DIR = Path(__file__).resolve().parents[1] / "model_configs"
#: Short builtin names accepted by :func:`load_model` -> (file, display name).
BUILTIN_MODELS: dict[str, tuple[str, str]] = {
    "qwen3-next-80b-a3b": ("qwen3-next-80b-a3b.json", "Qwen3-Next-80B-A3B-Instruct"),
}

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

    def hidden_state_bytes_per_token(self, num_layers: int) -> int:
        """Bytes per token vLLM's ``extract_hidden_states`` caches for ``num_layers``
        hidden-state layers: ``num_layers x hidden_size x`` the model dtype's bytes (its
        ``CacheOnlyAttentionLayer`` holds one head per layer, ``hidden_size`` wide, in
        the KV cache dtype, here the model's: ``model_executor/models/extract_hidden_states.py``)."""
        return num_layers * self.hidden_size * self.dtype_bytes

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
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        name: str | None = None,
        dtype: str | None = None,
        kv_cache_dtype: str = "auto",
        mamba_cache_dtype: str = "auto",
        mamba_ssm_cache_dtype: str = "auto",
        mtp: bool = False,
    ) -> ModelCosts:
        """Build the cost model from a Hugging Face ``config.json`` (path or parsed dict).

        ``mtp``: the model serves with its MTP drafter (vLLM's ``speculative_config``
        method ``mtp``), whose layers vLLM gives KV cache too: one attention layer
        per ``num_nextn_predict_layers`` of the config (``models/qwen3_next_mtp.py``,
        ``models/nemotron_h_mtp.py``), a copy of the first attention layer's costs
        appended after the decoder layers; none where the config declares none.

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
            raw = read_json(path)
        if not isinstance(raw, dict):
            raise ModelConfigError(f"{label}: top level must be a JSON object, got {type(raw).__name__}")
        top = ConfigFields(raw, label)
        architectures = top.get("architectures")
        if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
            raise ModelConfigError(
                f"{label}: field 'architectures' must be a non-empty list of names; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        architecture = architectures[0]
        builder = BUILDERS.get(architecture)
        if builder is None:
            raise ModelConfigError(
                f"{label}: architecture '{architecture}' is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        text = top.sub("text_config") if "text_config" in raw else top
        dtypes = resolve_dtypes(
            top, text, dtype, kv_cache_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype, architecture
        )
        layers, num_decoder_layers = builder(text, dtypes)
        if mtp:
            first = next((layer for layer in layers if layer.is_attention), None)
            count = text.int("num_nextn_predict_layers", 0, minimum=0)
            if first is not None and count > 0:
                layers = [*layers, *([first] * count)]
        return cls(
            name=name or display_name(raw, path, architecture),
            architecture=architecture,
            layers=tuple(layers),
            hidden_size=text.int("hidden_size"),
            dtype_bytes=DTYPE_BYTES[dtypes.model],
            dtype=dtypes.model,
            model_type=str(text.get("model_type") or top.get("model_type") or ""),
            num_decoder_layers=num_decoder_layers,
            vocab_size=text.int("vocab_size", 0),
            source=str(path) if path is not None else None,
            mamba_ssm_cache_dtype=str(mamba_ssm_cache_dtype),
        )


def load_model(spec: str | os.PathLike[str], **overrides: Any) -> ModelCosts:
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


def _check_range(total: int, part: int, total_name: str, part_name: str) -> None:
    for value, value_name in ((total, total_name), (part, part_name)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{value_name} must be an integer, got {value!r}")
    if not 0 <= part <= total:
        raise ValueError(f"need 0 <= {part_name} <= {total_name}, got {part_name}={part}, {total_name}={total}")
