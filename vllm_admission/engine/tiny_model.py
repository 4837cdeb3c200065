"""Small random-weight hybrid models that vLLM 0.32 runs on CPU, one per family.

Two architectures (``arch``, :data:`TINY_MODEL_ARCHS`):

* ``"qwen3-next"`` (the default): two Gated DeltaNet (linear attention,
  recurrent state) layers and two full-attention layers, each followed by a
  small MoE, as the real Qwen3-Next models (:data:`TINY_MODEL_PARAMS`);
* ``"nemotron-h"``: a Mamba2 hybrid in Nemotron-H's layout,
  ``hybrid_override_pattern`` ``"M*-M*-"`` (Mamba2, attention, MLP, twice)
  (:data:`TINY_NEMOTRON_H_PARAMS`), vLLM's ``NemotronHForCausalLM``.

Either way vLLM builds a hybrid KV cache (attention blocks plus recurrent-state
blocks) exactly as for the real models, while a forward pass costs almost
nothing. Weights are random: outputs are meaningless but deterministic under
greedy sampling.

Sizes follow the project's vLLM integration guide (``shared/guide/vllm-integration.md``
beside the repository); each one is forced by
a vLLM CPU constraint:

* ``torch_dtype`` bfloat16: the CPU GDN kernel refuses anything else.
* ``head_dim`` 64: the CPU attention backend rejects 32.
* Nemotron-H has no ``E`` (MoE) layer: vLLM's CPU fused MoE refuses Nemotron's
  non-gated relu2 experts ("is_act_and_mul=False is supported only for CUDA,
  XPU and ROCm", ``model_executor/layers/fused_moe/config.py``), so its
  feed-forward layers are ``-`` (MLP), as in Nemotron-H-8B.
* Nemotron-H's Mamba2 layers (4 heads of 64, 2 groups, state 64, conv 4,
  ``chunk_size`` 128, a power of two as ``ops/ssd_combined.py`` asserts) give
  the same state page as the Qwen3-Next recipe: conv (3, 512) bf16 plus SSM
  (4, 64, 64). The config keeps transformers' ``mamba_ssm_cache_dtype``
  "float32", which vLLM applies when the engine's setting is "auto"
  (``model_executor/models/config.py`` ``NemotronHForCausalLMConfig``): block
  size 256 by default on every CPU, 128 with ``mamba_ssm_cache_dtype="bfloat16"``.
  On vLLM's CPU platform these layers need
  :func:`vllm_admission.plugin.repairs.cpu_mamba2.install` (no prefill-checkpoint
  export), which :func:`vllm_admission.engine.llm.build_llm` and the general
  plugin install.

A byte-level BPE tokenizer with the model's 512-token vocabulary is trained
offline (``tokenizers``) on a fixed synthetic corpus and saved beside the
weights, so ``vllm serve DIR`` takes text prompts without
``skip_tokenizer_init``. Special tokens: ``<bos>`` 0, ``<eos>`` 1, ``<pad>`` 2,
matching the config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_admission.core.errors import UserError

__all__ = [
    "TINY_MODEL_ARCHS",
    "TINY_MODEL_PARAMS",
    "TINY_MODEL_SIZES",
    "BENCH_OVERRIDES",
    "TINY_NEMOTRON_H_PARAMS",
    "make_tiny_model",
    "tiny_model_config_kwargs",
    "train_tiny_tokenizer",
]

#: Bumped whenever a recipe below changes, so stale directories are rebuilt.
_RECIPE_VERSION = 3  # 2: a tokenizer is written too; 3: the arch is recorded (nemotron-h)
_MARKER = "vllm_admission_tiny_model.json"

#: The fixed part of the recipe (everything except context length and seed).
TINY_MODEL_PARAMS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "layer_types": [
        "linear_attention",
        "full_attention",
        "linear_attention",
        "full_attention",
    ],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1,
    "tie_word_embeddings": False,
}


#: The Mamba2 hybrid's recipe (``arch="nemotron-h"``): ``transformers.NemotronHConfig``
#: arguments except context length and special tokens.
TINY_NEMOTRON_H_PARAMS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "hybrid_override_pattern": "M*-M*-",
    "intermediate_size": 256,
    "mlp_hidden_act": "relu2",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_num_heads": 4,
    "mamba_head_dim": 64,
    "n_groups": 2,
    "ssm_state_size": 64,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "mamba_ssm_cache_dtype": "float32",
    "tie_word_embeddings": False,
}

#: ``arch`` name -> (transformers config class name, recipe).
_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-next": ("Qwen3NextConfig", TINY_MODEL_PARAMS),
    "nemotron-h": ("NemotronHConfig", TINY_NEMOTRON_H_PARAMS),
}

#: The architectures :func:`make_tiny_model` builds; the first is the default.
TINY_MODEL_ARCHS: tuple[str, ...] = tuple(_ARCHS)

#: ``size="bench"``: what changes from each recipe for the serving benchmark
#: (``benchmarks/serve_bench.py``). Wider and deeper feed-forward and projections, so that
#: prefill, not serving overhead, dominates time to first token on a few CPU cores; the
#: recurrent state and the attention heads are the tiny model's, so vLLM's aligned block
#: (the state page over the attention page per token) stays the same: what a hit is worth
#: grows, where hits can land does not (more layers make more KV cache groups).
BENCH_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3-next": {
        "hidden_size": 768,
        "num_hidden_layers": 8,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]
        + ["linear_attention"] * 3 + ["full_attention"],
        "intermediate_size": 1536,
        "moe_intermediate_size": 768,
        "shared_expert_intermediate_size": 768,
    },
    "nemotron-h": {
        "hidden_size": 768,
        "hybrid_override_pattern": "M-M-M*-M-M-M*-",
        "intermediate_size": 3072,
    },
}

#: The model sizes :func:`make_tiny_model` builds; the first is the default.
TINY_MODEL_SIZES: tuple[str, ...] = ("tiny", "bench")


def _recipe(arch: str, size: str = "tiny") -> tuple[str, dict[str, Any]]:
    try:
        name, params = _ARCHS[arch]
    except KeyError:
        raise UserError(f"unknown tiny model arch {arch!r} (valid: {', '.join(TINY_MODEL_ARCHS)})") from None
    if size not in TINY_MODEL_SIZES:
        raise UserError(f"unknown model size {size!r} (valid: {', '.join(TINY_MODEL_SIZES)})")
    return name, ({**params, **BENCH_OVERRIDES[arch]} if size == "bench" else params)


def tiny_model_config_kwargs(max_position_embeddings: int = 131072, *,
                             arch: str = "qwen3-next", size: str = "tiny") -> dict[str, Any]:
    """Keyword arguments for the transformers config of the tiny model of ``arch``.

    ``transformers.Qwen3NextConfig`` for ``"qwen3-next"``,
    ``transformers.NemotronHConfig`` for ``"nemotron-h"``.

    Args:
        max_position_embeddings: longest context the model declares, in tokens.
            vLLM derives its default ``max_model_len`` from it.
        arch: one of :data:`TINY_MODEL_ARCHS`.
        size: one of :data:`TINY_MODEL_SIZES` (``"bench"``: :data:`BENCH_OVERRIDES`).

    Returns:
        A fresh dict (safe to modify).

    Raises:
        UserError: unknown ``arch`` or ``size``.
    """
    kw = json.loads(json.dumps(_recipe(arch, size)[1]))
    kw["max_position_embeddings"] = int(max_position_embeddings)
    # The tokenizer's special tokens (see train_tiny_tokenizer).
    kw["bos_token_id"] = 0
    kw["eos_token_id"] = 1
    kw["pad_token_id"] = 2
    return kw


#: Special tokens in id order (ids 0, 1, 2: bos, eos, pad of the config).
_SPECIAL_TOKENS = ("<bos>", "<eos>", "<pad>")
_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
_WORDS = ["the", "a", "of", "to", "and", "in", "is", "it", "that", "for", "on", "with", "as",
          "cache", "block", "prefix", "state", "token", "model", "request", "hit", "miss",
          "layer", "attention", "recurrent", "hybrid", "admission", "eviction", "checkpoint",
          "server", "prompt", "user", "assistant", "system", "reply", "question", "answer",
          "data", "time", "number", "value"]


def _corpus(seed: int, lines: int = 2000):
    import random

    rng = random.Random(seed)
    for _ in range(lines):
        n = rng.randrange(4, 24)
        words = [rng.choice(_WORDS) for _ in range(n)]
        words.append(str(rng.randrange(0, 10_000)))
        yield " ".join(words) + rng.choice((".", "?", "!", ","))


def train_tiny_tokenizer(vocab_size: int = TINY_MODEL_PARAMS["vocab_size"], *, seed: int = 0) -> Any:
    """A byte-level BPE tokenizer of ``vocab_size`` tokens, trained offline.

    Trained with the ``tokenizers`` library on a fixed synthetic English-like
    corpus (no download). Any text encodes (byte fallback through the 256
    byte tokens); ids are ``< vocab_size``.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``<bos>`` = 0,
        ``<eos>`` = 1, ``<pad>`` = 2 and a minimal chat template.

    Raises:
        UserError: ``vocab_size`` below 256 bytes + 3 special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(_SPECIAL_TOKENS):
        raise UserError(f"vocab_size must be at least {256 + len(_SPECIAL_TOKENS)}, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    bos, eos, pad = _SPECIAL_TOKENS
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   pad_token=pad, chat_template=_CHAT_TEMPLATE)


def _marker_payload(arch: str, max_position_embeddings: int, seed: int,
                    size: str = "tiny") -> dict[str, Any]:
    payload = {
        "recipe_version": _RECIPE_VERSION,
        "arch": arch,
        "max_position_embeddings": int(max_position_embeddings),
        "seed": int(seed),
        "params": _recipe(arch, size)[1],
    }
    if size != "tiny":
        payload["size"] = size
    return payload


def make_tiny_model(
    out_dir: str | Path,
    *,
    arch: str = "qwen3-next",
    max_position_embeddings: int = 131072,
    seed: int = 0,
    mtp: bool = False,
    size: str = "tiny",
) -> Path:
    """Write the tiny random-weight hybrid model of ``arch`` to ``out_dir`` (idempotent).

    The weights depend only on ``seed`` (``torch.manual_seed`` before the model
    is built), so two calls with the same arguments give identical files. If
    ``out_dir`` already holds a model written by this function with the same
    recipe version, ``arch``, recipe, ``max_position_embeddings`` and ``seed``
    (checked through a small marker json written last), it is returned
    without rebuilding; otherwise (another arch, an older recipe) it is
    rebuilt in place.

    Writes ``config.json``, the safetensors weights, ``generation_config.json``
    and the tokenizer of :func:`train_tiny_tokenizer` (``tokenizer.json``,
    ``tokenizer_config.json``), so the directory serves text prompts
    (``vllm serve DIR``) as well as token-id prompts.

    Args:
        out_dir: directory to create or reuse.
        arch: ``"qwen3-next"`` (Gated DeltaNet hybrid) or ``"nemotron-h"``
            (Mamba2 hybrid): :data:`TINY_MODEL_ARCHS`.
        max_position_embeddings: declared context length in tokens (default
            131072, enough for the longest real-trace request of 126,195
            prompt tokens plus its output).
        seed: torch seed for the random weights.
        mtp: also write one MTP (multi-token prediction) layer, the drafter of
            vLLM's ``speculative_config={"method": "mtp", ...}``
            (``models/qwen3_next_mtp.py``, ``models/nemotron_h_mtp.py``): the
            config gets ``num_nextn_predict_layers: 1`` (Nemotron-H also
            ``mtp_layers_block_type: ["full_attention"]``, an attention layer,
            which the CPU build runs) and the weights an MTP layer, a copy of
            the model's first attention layer plus a random projection of
            ``[embedding; hidden]`` (transformers builds no MTP module).
        size: ``"tiny"`` (the default: the smallest model vLLM's CPU build runs) or
            ``"bench"`` (:data:`BENCH_OVERRIDES`: the same cache geometry with
            enough compute per token that prefill dominates time to first token).

    Returns:
        ``out_dir`` as a ``Path``, usable as ``vllm.LLM(model=str(path))``.

    Raises:
        UserError: if ``max_position_embeddings`` is not positive, ``arch`` or
            ``size`` is unknown, or ``mtp`` is asked for the ``"bench"`` size.
        ImportError: if ``torch`` or ``transformers`` is missing.
    """
    if int(max_position_embeddings) <= 0:
        raise UserError(f"max_position_embeddings must be positive, got {max_position_embeddings}")
    config_name = _recipe(arch, size)[0]
    if mtp and size != "tiny":
        raise UserError("an MTP layer is made for the tiny size only")
    out = Path(out_dir)
    marker = out / _MARKER
    want = _marker_payload(arch, max_position_embeddings, seed, size)
    if mtp:
        want["mtp"] = True
    if marker.is_file():
        try:
            have = json.loads(marker.read_text())
        except (OSError, ValueError):
            have = None
        if have == want and (out / "config.json").is_file():
            return out

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    if marker.exists():
        marker.unlink()  # a half-written rebuild must not look finished
    for stale in out.glob("*.safetensors"):
        stale.unlink()  # another arch's weights must not stay beside the new config
    config_cls = getattr(transformers, config_name)
    config = config_cls(**tiny_model_config_kwargs(max_position_embeddings, arch=arch, size=size))
    torch.manual_seed(int(seed))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    if mtp:
        _add_mtp_layer(out, arch, seed=int(seed))
    train_tiny_tokenizer(config.vocab_size, seed=int(seed)).save_pretrained(out)
    marker.write_text(json.dumps(want, indent=2, sort_keys=True) + "\n")
    return out


#: Per arch: (weight prefix of the first attention layer, MTP projection name, MTP norm
#: names, the final norm they start from): the names vLLM's MTP loaders read.
_MTP_LAYOUT = {
    "qwen3-next": ("model.layers.1.", "mtp.fc.weight",
                   ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                    "mtp.norm.weight"), "model.norm.weight"),
    "nemotron-h": ("backbone.layers.1.", "mtp.layers.0.eh_proj.weight",
                   ("mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight",
                    "mtp.layers.0.final_layernorm.weight"), "backbone.norm_f.weight"),
}


def _add_mtp_layer(out: Path, arch: str, *, seed: int) -> None:
    """Add one MTP layer to the model written in ``out`` (``make_tiny_model(mtp=True)``)."""
    import torch
    from safetensors.torch import load_file, save_file

    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["num_nextn_predict_layers"] = 1
    if arch == "nemotron-h":
        config["mtp_layers_block_type"] = ["full_attention"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (weights_path,) = sorted(out.glob("*.safetensors"))
    weights = load_file(weights_path)
    layer, projection, norms, final_norm = _MTP_LAYOUT[arch]
    for name in list(weights):
        if name.startswith(layer):
            weights["mtp.layers.0." + name[len(layer):]] = weights[name].clone()
    hidden = int(config["hidden_size"])
    generator = torch.Generator().manual_seed(seed + 1)
    weights[projection] = (torch.randn(hidden, 2 * hidden, generator=generator)
                           * 0.02).to(torch.bfloat16)
    for name in norms:
        weights[name] = weights[final_norm].clone()
    save_file(weights, weights_path, metadata={"format": "pt"})
