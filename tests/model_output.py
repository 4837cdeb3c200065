"""Comparing two engines' greedy outputs: the same computation, or the same model output.

Two runs of one model give the same bytes only when they compute the same thing in the
same order. A prefix hit, a chunk stop at a checkpoint, a state loaded from the host tier or
captured inside the pass changes how a prompt is cut into prefill passes, and vLLM's CPU
kernels may round differently for a different cut: how a GEMM or a scan is blocked, and so
the order of its sums, depends on the number of tokens in the pass and on the CPU (its
instruction set and cache sizes). On one AVX-512 machine the tiny models give the same bytes
for every cut; on an AVX2-only EPYC a chunk stop moved a greedy token. So an engine test
states one of two promises:

* **the same computation** (the same prefill passes): the same tokens and the same logits,
  bit for bit (:func:`assert_same_output` with ``exact=True``);
* **the same model output** (other passes): the logits of each generated position equal to
  within the rounding of the model's dtype, and the greedy tokens equal up to the first
  position where the two runs' top two logits are within that rounding of each other (a
  near-tie, after which the runs condition on different tokens and are not compared).

The rounding bound. The logits come out of the model in its dtype (bfloat16 for the tiny
models, whose logits lie below 1 in magnitude), whose unit roundoff is
``u = 2**-(mantissa bits + 1)`` (``2**-8`` for bfloat16, ``torch.finfo(dtype).eps / 2``).
Each prefill pass boundary by which the two runs differ can change the rounding of every
activation once; we allow one rounding of the largest logit's size per prefill pass of
either run: ``tol = (passes of run 1 + passes of run 2) * u * max |logit|`` at that
position. Where the two runs also decode differently (speculative decoding verifies a
draft and a token in one pass, plain decoding one token), every decode step is another pass
of each run, so position ``i`` adds ``2 * i``. A wrong state (a row of another block, a conv
window shifted by a token, a stale host copy) moves the logits by far more than that:
``tests/test_offload_engine.py`` and ``tests/test_model_output.py`` show the comparison
rejects them.

One more discrete choice would defeat any rounding bound: a mixture-of-experts router picks
its top experts by an argmax, and a near-tie there turns one rounding into a jump. Measured on
the tiny Qwen3-Next (top 2 of 4 experts): the last layer's router scored experts 0 and 1 at
-0.0344 / -0.0342 in one run and -0.0337 / -0.0347 in the other (a prefix hit of 1,280
tokens against none), picked the other expert, and one logit moved by 0.0586 (15 bfloat16
steps) while every other position stayed bit-identical. So the engine tests' tiny models route
every token to every expert (:func:`route_to_every_expert`): the router's weights stay, its
choice goes, and the sampler's argmax is the only discrete step left.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Raw logits of the top tokens per generated position (vLLM's ``logprobs_mode``).
LOGITS_MODE = {"logprobs_mode": "raw_logits"}
#: How many top logits each position returns (the chosen token's comes on top of them).
TOP_K = 5


@dataclass
class Output:
    """One request's greedy output.

    Attributes:
        cached: prompt tokens served from the cache (vLLM's ``num_cached_tokens``).
        tokens: generated token ids.
        logits: per generated position, ``{token id: raw logit}`` of the top
            :data:`TOP_K` tokens and the chosen one.
        passes: prefill passes (engine steps that scheduled prompt tokens) of the request.
        u: unit roundoff of the dtype the engine computed the logits in
            (:func:`logit_roundoff`); ``None`` where unknown.
    """

    cached: int
    tokens: list[int]
    logits: list[dict[int, float]] = field(default_factory=list)
    passes: int = 1
    u: float | None = None


def serve_one_at_a_time(llm, prompts: Sequence[Sequence[int]], max_tokens: int) -> list:
    """Serve ``prompts`` one at a time on ``llm`` (an in-process engine built with
    :data:`LOGITS_MODE`), greedy with the top :data:`TOP_K` logits; returns
    ``(Output, vLLM's RequestOutput)`` per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_admission.engine.llm import PrefillStepCounter

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                        detokenize=False, logprobs=TOP_K)
    out, u = [], logit_roundoff(llm)
    for p in prompts:
        with PrefillStepCounter(llm) as counter:
            (o,) = llm.generate([TokensPrompt(prompt_token_ids=list(p))], sp, use_tqdm=False)
        c = o.outputs[0]
        logits = [{int(t): float(v.logprob) for t, v in pos.items()} for pos in c.logprobs]
        out.append((Output(int(o.num_cached_tokens), list(c.token_ids), logits,
                           sum(counter.counts.values()), u), o))
    return out


def generate(llm, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[Output]:
    """:func:`serve_one_at_a_time`, each request's :class:`Output` only."""
    return [output for output, _ in serve_one_at_a_time(llm, prompts, max_tokens)]


def unit_roundoff(dtype) -> float:
    """``u`` of a floating dtype, a ``torch.dtype`` or its name (bfloat16 -> 2**-8,
    float32 -> 2**-24)."""
    import torch

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return float(torch.finfo(dtype).eps) / 2


def logit_roundoff(llm) -> float:
    """``u`` of the dtype a started ``vllm.LLM`` computes its logits in (the model's)."""
    return unit_roundoff(llm.llm_engine.vllm_config.model_config.dtype)


def route_to_every_expert(model_dir: str | Path) -> Path:
    """Make a model directory's mixture-of-experts layers route every token to all experts
    (``num_experts_per_tok = num_experts`` in ``config.json``; the weights do not change
    shape). A model without experts is left as it is. Returns the directory."""
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text())
    if config.get("num_experts") and config.get("num_experts_per_tok") != config["num_experts"]:
        config["num_experts_per_tok"] = config["num_experts"]
        path.write_text(json.dumps(config, indent=2))
    return Path(model_dir)


def output_difference(want: Output, got: Output, u: float | None = None, *,
                      exact: bool = False, decode_differs: bool = False) -> str | None:
    """Why ``got`` is not ``want``'s model output, or ``None`` when it is (module docstring).

    Args:
        want, got: the two runs' outputs of one request.
        u: unit roundoff of the dtype the logits are computed in (:func:`unit_roundoff`);
            ``None``: the larger of the two outputs' own.
        exact: the same computation: tokens and logits must be equal bit for bit.
        decode_differs: the runs decode in other passes (speculative against plain):
            generated position ``i`` adds ``2 * i`` passes to the bound.
    """
    if u is None:
        u = max(want.u or 0.0, got.u or 0.0)
        assert u > 0, "no unit roundoff given and none recorded with the outputs"
    if len(want.tokens) != len(got.tokens):
        return f"{len(got.tokens)} tokens against {len(want.tokens)}"
    if exact:
        if want.tokens != got.tokens or want.logits != got.logits:
            return f"not bit-identical: {got.tokens} against {want.tokens}"
        return None
    passes = want.passes + got.passes
    for i, (a, b) in enumerate(zip(want.tokens, got.tokens, strict=True)):
        lw, lg = want.logits[i], got.logits[i]
        scale = max(abs(v) for v in (*lw.values(), *lg.values()))
        tol = (passes + (2 * i if decode_differs else 0)) * u * scale
        if a == b:
            drift = abs(lw[a] - lg[a])
            if drift > tol:
                return (f"position {i}: the chosen token's logit moved by {drift:.3g} "
                        f"(bound {tol:.3g})")
            continue
        # The runs part: each must have had the other's token within the bound of its own.
        if b not in lw or a not in lg:
            return f"position {i}: {b} against {a}, not among each other's top {TOP_K}"
        margins = (lw[a] - lw[b], lg[b] - lg[a])
        if max(margins) > tol:
            return (f"position {i}: {b} against {a} with margins {margins[0]:.3g} / "
                    f"{margins[1]:.3g} (bound {tol:.3g}): not a near-tie")
        return None  # a near-tie: from here the runs condition on different tokens
    return None


def assert_same_output(want: Sequence[Output], got: Sequence[Output], u: float | None = None,
                       *, exact: bool = False, decode_differs: bool = False,
                       label: object = "") -> None:
    """:func:`output_difference` for every request; fails naming the first that differs."""
    assert len(want) == len(got), label
    for r, (w, g) in enumerate(zip(want, got, strict=True)):
        why = output_difference(w, g, u, exact=exact, decode_differs=decode_differs)
        assert why is None, f"{label} request {r}: {why}"


def first_tokens(output: Output, n: int) -> Output:
    """``output`` cut to its first ``n`` generated tokens (the same prefill, fewer decode steps)."""
    return Output(output.cached, output.tokens[:n], output.logits[:n], output.passes, output.u)


def state_rows(llm) -> dict:
    """``{(layer name, position): (conv row, ssm row)}`` of every cached recurrent state (float32
    copies), read from the GDN layers' state tensors by the cached blocks' ids."""
    from vllm.v1.core.kv_cache_utils import get_group_id

    from vllm_admission.engine.llm import inprocess_scheduler
    from vllm_admission.plugin.boundary.hooks import cached_blocks
    from vllm_admission.plugin.kv_cache import group_kinds

    sched = inprocess_scheduler(llm)
    kinds = group_kinds(sched.kv_cache_manager.coordinator.single_type_managers)
    groups = sched.kv_cache_config.kv_cache_groups
    layers = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    rows = {}
    for key, block in cached_blocks(sched.kv_cache_manager.block_pool):
        g = get_group_id(key)
        if kinds[g] != "state":
            continue
        for name in groups[g].layer_names:
            conv, ssm = layers[name].kv_cache[0], layers[name].kv_cache[1]
            rows[(name, int(block.block_hash_num_tokens))] = (
                conv[block.block_id].float().clone(), ssm[block.block_id].float().clone())
    return rows


def greedy_one_at_a_time(model, scheduler: str | None, env: dict, *, engine_args: dict,
                         prompts: Sequence[Sequence[int]], max_tokens: int,
                         ssm_dtype: str = "float32", check=None) -> list:
    """Start an in-process engine on ``model`` (stock vLLM when ``scheduler`` is None:
    no general plugin), serve ``prompts`` one at a time with greedy decoding, shut it
    down. ``check(llm)`` runs on the started engine first. Returns a
    ``model_output.Output`` per prompt (cached tokens, tokens, top logits, prefill passes),
    to compare with ``model_output.assert_same_output``."""
    from vllm_admission.engine.llm import EngineSettings, build_llm, shutdown_llm

    settings = EngineSettings(model=str(model), scheduler_cls=scheduler, max_model_len=4096,
                              mamba_ssm_cache_dtype=ssm_dtype,
                              engine_args={**LOGITS_MODE, **engine_args},
                              env={"VLLM_PLUGINS": "" if scheduler is None else None, **env})
    llm = build_llm(settings)
    try:
        if check is not None:
            check(llm)
        return generate(llm, prompts, max_tokens)
    finally:
        shutdown_llm(llm)
        del llm
        gc.collect()
