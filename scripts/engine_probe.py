"""Measure the vLLM 0.32 prefix-cache facts the simulator must reproduce.

Runs the tiny random-weight Qwen3-Next hybrid model through stock vLLM
(no custom scheduler, no general plugins, prefix caching on) and prints, as
JSON lines, the engine geometry and the per-request ``num_cached_tokens`` of a
few scenarios. ``docs/engine-facts.md`` explains each number.

Usage::

    .venv/bin/python scripts/engine_probe.py [--model-dir DIR] [--json OUT]

Two engines are started one after the other in this process (about 30 s
total on a 2-core machine, plus the scenarios): one sized from memory, one
with ``num_gpu_blocks_override=64``. The SSM state is pinned to bf16
(:data:`SSM_DTYPE`): the numbers in ``docs/engine-facts.md`` are that geometry
(block 128), which vLLM's CPU platform would otherwise change on CPUs with
AVX-512 BF16 (section 0 of that page).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from pathlib import Path

#: The probe's geometry on every CPU: bf16 recurrent state, 128-token blocks.
SSM_DTYPE = "bfloat16"

# Stock vLLM: do not load this project's (or anyone's) general plugins.
os.environ.setdefault("VLLM_PLUGINS", "")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

VOCAB = 512
RESULTS: dict[str, object] = {}


def emit(key: str, value: object) -> None:
    RESULTS[key] = value
    print(f"PROBE {key} = {json.dumps(value, default=str)}", flush=True)


def toks(rng: random.Random, n: int) -> list[int]:
    # Avoid the special ids 0..2 (bos/eos/pad of the tiny config); irrelevant
    # with ignore_eos but keeps prompts "plain".
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def gen(llm, prompts: list[list[int]], max_tokens: int):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return [(int(o.num_cached_tokens or 0), list(o.outputs[0].token_ids)) for o in outs]


def one(llm, prompt: list[int], max_tokens: int) -> tuple[int, list[int]]:
    return gen(llm, [prompt], max_tokens)[0]


def block_trace(llm, prompt: list[int], max_tokens: int) -> dict[str, object]:
    """Step one request by hand and read its blocks after every engine step."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_admission.engine.llm import cached_block_positions, inprocess_scheduler

    sched = inprocess_scheduler(llm)
    kvm = sched.kv_cache_manager
    pool = kvm.block_pool
    managers = kvm.coordinator.single_type_managers
    kinds = [type(m).__name__ for m in managers]
    eng = llm.llm_engine
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    free0 = pool.get_num_free_blocks()
    eng.add_request("probe-blocks", TokensPrompt(prompt_token_ids=prompt), sp)
    steps = []
    while eng.has_unfinished_requests():
        outs = eng.step()
        rids = list(sched.requests.keys())
        row: dict[str, object] = {"free": pool.get_num_free_blocks()}
        if rids:
            req = sched.requests[rids[0]]
            row["computed"] = req.num_computed_tokens
            row["per_group"] = [
                sum(1 for b in m.req_to_blocks.get(rids[0], []) if not b.is_null) for m in managers
            ]
            row["table_len"] = [len(m.req_to_blocks.get(rids[0], [])) for m in managers]
        for o in outs:
            if o.finished:
                row["finished_cached"] = o.num_cached_tokens
        steps.append(row)
    # Compress: keep the first steps, the steps where the block counts change, and the last.
    kept, last = [], None
    for i, row in enumerate(steps):
        sig = (row.get("per_group"), row.get("free"))
        if i < 3 or sig != last or i == len(steps) - 1:
            kept.append({"step": i, **row})
        last = sig
    peak = [max((r.get("per_group") or [0] * len(managers))[g] for r in steps) for g in range(len(managers))]
    return {
        "prompt": len(prompt),
        "output": max_tokens,
        "groups": kinds,
        "free_before": free0,
        "free_after": pool.get_num_free_blocks(),
        "cached_block_entries_after": len(pool.cached_block_hash_to_block),
        "mamba_states_cached_after": next(
            v for k, v in cached_block_positions(llm).items() if k.endswith(":state")),
        "peak_per_group": peak,
        "steps_total": len(steps),
        "steps": kept,
    }


def engine_default(model: str) -> None:
    from vllm_admission.engine.llm import (
        EngineSettings,
        build_llm,
        cached_block_positions,
        engine_geometry,
        prefix_cache_counters,
    )

    def mamba_positions() -> list[int]:
        return next(v for k, v in cached_block_positions(llm).items() if k.endswith(":state"))

    t = time.perf_counter()
    llm = build_llm(EngineSettings(model=model, mamba_ssm_cache_dtype=SSM_DTYPE))
    emit("engine_start_seconds_default", round(time.perf_counter() - t, 1))
    geo = engine_geometry(llm)
    emit("geometry_default", geo.to_dict())
    bs = geo.block_size

    # --- repeated prompt
    rng = random.Random(1)
    for p_len in (1000, 1024, 1025):
        llm.reset_prefix_cache()
        p = toks(rng, p_len)
        c1, o1 = one(llm, p, 4)
        c2, o2 = one(llm, p, 4)
        emit(f"repeat_P{p_len}", {"first": c1, "second": c2, "same_output": o1 == o2,
                                   "floor((P-1)/B)*B": (p_len - 1) // bs * bs})

    # --- junction (guide's experiment), variant 1: prefix alone first, then 10 sequential
    def junction(send_prefix_first: bool, batched: bool, tag: str) -> None:
        llm.reset_prefix_cache()
        r = random.Random(2)
        prefix = toks(r, 1500)
        suffix = toks(r, 300)
        prompts = [prefix + [3 + i] + suffix for i in range(10)]
        h0, q0 = prefix_cache_counters(llm)
        res = {}
        if send_prefix_first:
            res["prefix"] = one(llm, prefix, 4)[0]
        if batched:
            res["prompts"] = [c for c, _ in gen(llm, prompts, 4)]
        else:
            res["prompts"] = [one(llm, q, 4)[0] for q in prompts]
        h1, q1 = prefix_cache_counters(llm)
        res["engine_hits"] = h1 - h0
        res["engine_queries"] = q1 - q0
        res["mamba_states_cached_after"] = mamba_positions()
        emit(f"junction_{tag}", res)

    junction(True, False, "prefix_then_10_sequential")
    junction(False, False, "10_sequential_no_prefix")
    junction(True, True, "prefix_then_10_batched")
    junction(False, True, "10_batched_no_prefix")

    # --- multi-turn: second turn = first prompt (+ its output) + 700 new tokens
    for p_len, o_len in ((1000, 100), (1024, 100), (1000, 30)):
        llm.reset_prefix_cache()
        r = random.Random(3)
        a = toks(r, p_len)
        more = toks(r, 700)
        ca, out_a = one(llm, a, o_len)
        after_turn1 = cached_block_positions(llm)
        c_prompt_only, _ = one(llm, a + more, 4)
        llm.reset_prefix_cache()
        ca2, out_a2 = one(llm, a, o_len)
        c_with_output, _ = one(llm, a + out_a2 + more, 4)
        mamba_after_turn2 = mamba_positions()
        c_turn2_again, _ = one(llm, a + out_a2 + more, 4)
        computed = p_len + o_len - 1  # KV written for prompt + all but the last sampled token
        emit(f"turn2_P{p_len}_O{o_len}", {
            "first_turn_cached": [ca, ca2],
            "turn2_prompt_plus_700": c_prompt_only,
            "turn2_prompt_output_plus_700": c_with_output,
            "cached_after_turn1": after_turn1,
            "mamba_states_after_turn2_with_output": mamba_after_turn2,
            "turn2_with_output_sent_again": c_turn2_again,
            "last_prompt_boundary floor((P-1)/B)*B": (p_len - 1) // bs * bs,
            "prompt floor(P/B)*B": p_len // bs * bs,
            "decode boundary floor((P+O-1)/B)*B": computed // bs * bs,
        })

    # --- a long prompt is prefilled in chunks: is the state at a chunk end cached?
    llm.reset_prefix_cache()
    r = random.Random(6)
    a = toks(r, 5000)
    c0 = one(llm, a, 4)[0]
    after = cached_block_positions(llm)
    c_div_4200 = one(llm, a[:4200] + toks(r, 800), 4)[0]
    mamba_after_div = mamba_positions()
    c_div_4200_again = one(llm, a[:4200] + toks(r, 800), 4)[0]
    c_ext = one(llm, a + toks(r, 800), 4)[0]
    emit("chunked_prefill_P5000", {
        "first": c0,
        "mamba_states_after_first": next(v for k, v in after.items() if k.endswith(":state")),
        "attention_blocks_after_first": len(next(v for k, v in after.items() if k.endswith("attention"))),
        "diverge_at_4200_hit": c_div_4200,
        "mamba_states_after_divergent": mamba_after_div,
        "another_divergent_at_4200_hit": c_div_4200_again,
        "extend_5000_plus_800_hit": c_ext,
        "attention_entries_incl_duplicates": len(next(
            v for k, v in cached_block_positions(llm).items() if k.endswith("attention"))),
    })

    # --- blocks held by one running request, per group
    llm.reset_prefix_cache()
    r = random.Random(4)
    emit("blocks_P1000_O150", block_trace(llm, toks(r, 1000), 150))
    llm.reset_prefix_cache()
    emit("blocks_P5000_O20", block_trace(llm, toks(r, 5000), 20))
    # same prompt again while its blocks are cached: how many new blocks does a hit need?
    llm.reset_prefix_cache()
    p = toks(r, 1000)
    one(llm, p, 4)
    emit("blocks_P1000_O150_after_cached_copy", block_trace(llm, p, 150))

    llm = None  # the engine goes; the closures above are done with it
    gc.collect()


def engine_small(model: str) -> None:
    from vllm_admission.engine.llm import EngineSettings, build_llm, engine_geometry

    # With 64 blocks, vLLM refuses max_model_len 131072; find what it accepts.
    try:
        build_llm(EngineSettings(model=model, num_gpu_blocks=64, mamba_ssm_cache_dtype=SSM_DTYPE))
        emit("small_pool_default_len", "started")
    except ValueError as e:
        emit("small_pool_default_len", f"refused: {str(e)[:400]}")
        gc.collect()
    t = time.perf_counter()
    llm = build_llm(EngineSettings(model=model, num_gpu_blocks=64, max_model_len=7808,
                                   mamba_ssm_cache_dtype=SSM_DTYPE))
    emit("engine_start_seconds_small", round(time.perf_counter() - t, 1))
    geo = engine_geometry(llm)
    emit("geometry_blocks64", geo.to_dict())
    r = random.Random(5)
    # Exactly the largest request vLLM planned for: 61 attention blocks + 2 Mamba blocks + null = 64.
    c, out = one(llm, toks(r, 7700), 108)
    emit("blocks64_request_7808_tokens", {"cached": c, "generated": len(out)})
    emit("blocks64_largest_request_trace", block_trace(llm, toks(r, 7600), 208))
    llm = None  # the engine goes; the closures above are done with it
    gc.collect()


_MP_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
from vllm_admission.engine.llm import EngineSettings, build_llm, engine_geometry
if __name__ == "__main__":
    t1 = time.perf_counter()
    llm = build_llm(EngineSettings(model=sys.argv[1], env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
                                   mamba_ssm_cache_dtype=SSM_DTYPE))
    t2 = time.perf_counter()
    geo = engine_geometry(llm)
    print("MPRESULT " + json.dumps({"import_s": round(t1 - t0, 1), "build_s": round(t2 - t1, 1),
          "num_gpu_blocks": geo.num_gpu_blocks, "block_size": geo.block_size,
          "inprocess": geo.inprocess}), flush=True)
"""


def engine_multiprocess(model: str) -> None:
    """Time vLLM's default layout (engine core in its own process) in a fresh interpreter."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_MP_CHILD)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, f.name, model], env=env, capture_output=True, text=True)
    total = time.perf_counter() - t
    os.unlink(f.name)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MPRESULT ")), None)
    res = json.loads(line[len("MPRESULT "):]) if line else {"error": proc.stderr[-1500:]}
    res["process_total_s"] = round(total, 1)
    emit("engine_start_multiprocess", res)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default="/tmp/vllm_admission_tiny_model")
    ap.add_argument("--json", default=None, help="also write all results to this JSON file")
    ap.add_argument("--skip-small", action="store_true", help="do not start the 64-block engine")
    ap.add_argument("--skip-mp", action="store_true",
                    help="do not time an engine start with a separate engine-core process")
    args = ap.parse_args()

    from vllm_admission.engine.tiny_model import make_tiny_model

    t = time.perf_counter()
    model = str(make_tiny_model(args.model_dir))
    emit("model", {"path": model, "make_seconds": round(time.perf_counter() - t, 1)})
    t = time.perf_counter()
    import vllm

    emit("vllm_import_seconds", round(time.perf_counter() - t, 1))
    emit("vllm_version", vllm.__version__)
    engine_default(model)
    if not args.skip_small:
        engine_small(model)
    if not args.skip_mp:
        engine_multiprocess(model)
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
