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

The package is split along those lines: :mod:`~.dtypes` (dtype names and sizes, the
resolved :class:`~.dtypes.Dtypes`), :mod:`~.layers` (the layer record and the FLOP
terms of each layer family), :mod:`~.config` (reading configs, vLLM's dtype rules),
:mod:`~.architectures` (one builder per architecture), :mod:`~.model` (``ModelCosts``,
``load_model``).
"""

from vllm_admission.core.costs.architectures import SUPPORTED_ARCHITECTURES
from vllm_admission.core.costs.dtypes import MAMBA_SSM_CACHE_DTYPES
from vllm_admission.core.costs.layers import (
    ATTENTION_KINDS,
    FFN_ONLY_KINDS,
    LAYER_KINDS,
    RECURRENT_KINDS,
    LayerCost,
    ModelConfigError,
)
from vllm_admission.core.costs.model import BUILTIN_MODELS, ModelCosts, load_model

__all__ = [
    "ATTENTION_KINDS",
    "BUILTIN_MODELS",
    "FFN_ONLY_KINDS",
    "LAYER_KINDS",
    "MAMBA_SSM_CACHE_DTYPES",
    "RECURRENT_KINDS",
    "SUPPORTED_ARCHITECTURES",
    "LayerCost",
    "ModelConfigError",
    "ModelCosts",
    "load_model",
]
