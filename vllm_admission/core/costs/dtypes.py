"""Dtype names and sizes, and the four dtypes a model's costs are computed in.

:func:`~vllm_admission.core.costs.config.resolve_dtypes` fills a :class:`Dtypes` from a
config and vLLM's flags (vLLM 0.32's rules); the layer builders read it. Imports nothing
of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CANONICAL_DTYPE", "DTYPE_BYTES", "MAMBA_SSM_CACHE_DTYPES", "NEMOTRON_H", "QWEN3_5",
           "Dtypes"]

#: Bytes per element of the dtype names that appear in HF configs and vLLM flags
#: (``vllm/utils/torch_utils.py``: ``STR_DTYPE_TO_TORCH_DTYPE``).
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
#: Aliases of :data:`DTYPE_BYTES` -> the name they stand for.
CANONICAL_DTYPE = {"float": "float32", "half": "float16"}

#: Values of vLLM 0.32's ``mamba_ssm_cache_dtype`` (``MambaDType``, vllm/config/cache.py).
MAMBA_SSM_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")

#: Architectures whose SSM state dtype a per-model hook of vLLM sets
#: (``vllm/model_executor/models/config.py``): Nemotron-H ...
NEMOTRON_H = ("NemotronHForCausalLM",)
#: ... and Qwen3.5.
QWEN3_5 = (
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM",
)


@dataclass(frozen=True)
class Dtypes:
    """The dtypes of one model, as vLLM 0.32 resolves them (names of :data:`DTYPE_BYTES`,
    canonical).

    Attributes:
        model: weights and activations (vLLM's ``--dtype``).
        kv: attention KV cache (``--kv-cache-dtype``).
        conv: recurrent conv state (``--mamba-cache-dtype``).
        ssm: recurrent SSM / GDN state (``--mamba-ssm-cache-dtype``).
    """

    model: str
    kv: str
    conv: str
    ssm: str
