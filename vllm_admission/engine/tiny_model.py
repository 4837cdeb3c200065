"""A small random-weight Qwen3-Next hybrid model that vLLM 0.32 runs on CPU.

The model has two Gated DeltaNet (linear attention, recurrent state) layers and
two full-attention layers, so vLLM builds a hybrid KV cache (attention blocks
plus recurrent-state blocks) exactly as for the real Qwen3-Next models, while a
forward pass costs almost nothing. Its weights are random: outputs are
meaningless but deterministic under greedy sampling.

Sizes follow ``/work/shared/guide/vllm-integration.md``; each one is forced by
a vLLM CPU constraint:

* ``torch_dtype`` bfloat16: the CPU GDN kernel refuses anything else.
* ``head_dim`` 64: the CPU attention backend rejects 32.

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

__all__ = ["TINY_MODEL_PARAMS", "make_tiny_model", "tiny_model_config_kwargs", "train_tiny_tokenizer"]

#: Bumped whenever the recipe below changes, so stale directories are rebuilt.
_RECIPE_VERSION = 2  # 2: a tokenizer is written too
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


def tiny_model_config_kwargs(max_position_embeddings: int = 131072) -> dict[str, Any]:
    """Keyword arguments for ``transformers.Qwen3NextConfig`` of the tiny model.

    Args:
        max_position_embeddings: longest context the model declares, in tokens.
            vLLM derives its default ``max_model_len`` from it.

    Returns:
        A fresh dict (safe to modify).
    """
    kw = json.loads(json.dumps(TINY_MODEL_PARAMS))
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
_WORDS = (
    "the a of to and in is it that for on with as cache block prefix state token model "
    "request hit miss layer attention recurrent hybrid admission eviction checkpoint "
    "server prompt user assistant system reply question answer data time number value"
).split()


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
        ValueError: ``vocab_size`` below 256 bytes + 3 special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(_SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be at least {256 + len(_SPECIAL_TOKENS)}, got {vocab_size}")
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


def _marker_payload(max_position_embeddings: int, seed: int) -> dict[str, Any]:
    return {
        "recipe_version": _RECIPE_VERSION,
        "max_position_embeddings": int(max_position_embeddings),
        "seed": int(seed),
        "params": TINY_MODEL_PARAMS,
    }


def make_tiny_model(
    out_dir: str | Path,
    *,
    max_position_embeddings: int = 131072,
    seed: int = 0,
) -> Path:
    """Write the tiny random-weight Qwen3-Next model to ``out_dir`` (idempotent).

    The weights depend only on ``seed`` (``torch.manual_seed`` before the model
    is built), so two calls with the same arguments give identical files. If
    ``out_dir`` already holds a model written by this function with the same
    recipe, ``max_position_embeddings`` and ``seed`` (checked through a small
    marker json written last), it is returned without rebuilding.

    Writes ``config.json``, the safetensors weights, ``generation_config.json``
    and the tokenizer of :func:`train_tiny_tokenizer` (``tokenizer.json``,
    ``tokenizer_config.json``), so the directory serves text prompts
    (``vllm serve DIR``) as well as token-id prompts.

    Args:
        out_dir: directory to create or reuse.
        max_position_embeddings: declared context length in tokens (default
            131072, enough for the longest real-trace request of 126,195
            prompt tokens plus its output).
        seed: torch seed for the random weights.

    Returns:
        ``out_dir`` as a ``Path``, usable as ``vllm.LLM(model=str(path))``.

    Raises:
        ValueError: if ``max_position_embeddings`` is not positive.
        ImportError: if ``torch`` or ``transformers`` is missing.
    """
    if int(max_position_embeddings) <= 0:
        raise ValueError(f"max_position_embeddings must be positive, got {max_position_embeddings}")
    out = Path(out_dir)
    marker = out / _MARKER
    want = _marker_payload(max_position_embeddings, seed)
    if marker.is_file():
        try:
            have = json.loads(marker.read_text())
        except (OSError, ValueError):
            have = None
        if have == want and (out / "config.json").is_file():
            return out

    import torch
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    out.mkdir(parents=True, exist_ok=True)
    if marker.exists():
        marker.unlink()  # a half-written rebuild must not look finished
    config = Qwen3NextConfig(**tiny_model_config_kwargs(max_position_embeddings))
    torch.manual_seed(int(seed))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    train_tiny_tokenizer(config.vocab_size, seed=int(seed)).save_pretrained(out)
    marker.write_text(json.dumps(want, indent=2, sort_keys=True) + "\n")
    return out
