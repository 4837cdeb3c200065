"""``inpass`` against ``split`` on the CPU engine: time to first token, interleaved.

The junction case (``tests/junction_case.py``: one 1,500-token prefix, ten 1,801-token
prompts that differ in one token after it, one request at a time, one output token) runs
under each admission policy in both checkpoint modes (``VLLM_ADMISSION_CHECKPOINT``). Each
repeat starts one engine per mode, each in a fresh subprocess, the modes in alternating
order (``split`` first in even repeats, ``inpass`` first in odd ones), so that a slow
stretch of a shared machine hits both modes alike. Inside an engine, a warm-up prompt runs
first; then, per policy, the prefix cache is reset and the ten prompts are timed one by one
(``LLM.generate`` with ``max_tokens=1``: the time to first token of a lone request).

The SSM state dtype is pinned (``mamba_ssm_cache_dtype``), so the geometry is the same on
every CPU: bf16 for the tiny Qwen3-Next (``--arch qwen3-next``, Gated DeltaNet, B = 128),
float32 for the tiny Nemotron-H (``--arch nemotron-h``, Mamba2, its config's dtype, B = 256);
``--ssm-dtype`` overrides. Reported per policy and mode: the prefill steps per
prompt, the cached tokens per prompt and the greedy first token (both must match between
modes), the median TTFT per repeat, and the ratio ``inpass / split`` as the median of the
per-repeat ratios of summed TTFT (each repeat's two runs are adjacent in time).

Usage: ``python benchmarks/inpass_engine_bench.py [--arch qwen3-next|nemotron-h] [--model DIR]
[--ssm-dtype bfloat16|float32] [--repeats N] [--policies vllm,marconi,dense,last] [--out FILE]``
(default out: ``benchmarks/results/inpass_engine_cpu.json``, ``inpass_engine_cpu_mamba2.json``
for ``nemotron-h``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("split", "inpass")
POLICIES = ("vllm", "marconi", "dense", "last")
#: Per ``--arch``: the default model directory, SSM state dtype and results file.
ARCHS = {"qwen3-next": ("tiny-model", "bfloat16", "inpass_engine_cpu.json"),
         "nemotron-h": ("tiny-nemotron-h", "float32", "inpass_engine_cpu_mamba2.json")}


def junction_prompts() -> list[list[int]]:
    """The junction case's ten prompts (the seeds of ``tests/junction_case.py``)."""
    def toks(seed: int, n: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(3, 512) for _ in range(n)]

    prefix, suffix = toks(2, 1500), toks(3, 300)
    return [prefix + [3 + i] + suffix for i in range(10)]


def machine() -> dict:
    """The CPU's model name and whether it has AVX-512 BF16 (vLLM then uses its C++ GDN conv
    and, unless pinned, a float32 state)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
                platform.processor() or platform.machine())
    return {"cpu": name, "avx512_bf16": "avx512_bf16" in info, "cores": os.cpu_count(),
            "python": platform.python_version()}


def worker(model: str, mode: str, policies: list[str], ssm_dtype: str) -> dict:
    """One engine in ``mode``: every policy's ten prompts, timed one by one."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_admission.engine.llm import (
        EngineSettings,
        PrefillStepCounter,
        build_llm,
        inprocess_scheduler,
        shutdown_llm,
    )

    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ADMISSION_LOG_INTERVAL": "0",
           "VLLM_ADMISSION_POLICY": policies[0], "VLLM_ADMISSION_EVICTION": "lru",
           "VLLM_ADMISSION_CHECKPOINT": mode}
    settings = EngineSettings(model=model, env=env, max_model_len=4096, num_gpu_blocks=160,
                              mamba_ssm_cache_dtype=ssm_dtype,
                              scheduler_cls="vllm_admission.AdmissionScheduler")
    llm = build_llm(settings)
    try:
        sched = inprocess_scheduler(llm)
        block_size = int(llm.llm_engine.vllm_config.cache_config.block_size)
        sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)

        def one(prompt: list[int]) -> tuple[float, int, int]:
            t0 = time.perf_counter()
            (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
            return time.perf_counter() - t0, int(out.num_cached_tokens), int(out.outputs[0].token_ids[0])

        one([7] * 1801)                       # warm-up: first-call costs out of the timings
        result = {"block_size": block_size, "policies": {}}
        for policy in policies:
            assert llm.reset_prefix_cache()
            sched.set_admission_policy(policy)
            with PrefillStepCounter(llm) as counter:
                runs = [one(p) for p in junction_prompts()]
            result["policies"][policy] = {"ttft_s": [r[0] for r in runs], "cached": [r[1] for r in runs],
                                          "first_token": [r[2] for r in runs],
                                          "steps": list(counter.counts.values())}
        return result
    finally:
        shutdown_llm(llm)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=sorted(ARCHS), default="qwen3-next",
                   help="tiny model family: qwen3-next (Gated DeltaNet) or nemotron-h (Mamba2)")
    p.add_argument("--model", help="model directory (the tiny model of --arch is made there if "
                   "missing; default out/tiny-model or out/tiny-nemotron-h)")
    p.add_argument("--ssm-dtype", choices=("bfloat16", "float32"),
                   help="pinned SSM state dtype (default: bfloat16 for qwen3-next, float32 for nemotron-h)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", help="results file (default per --arch, under benchmarks/results/)")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    model_name, dtype, out_name = ARCHS[args.arch]
    args.model = args.model or str(ROOT / "out" / model_name)
    args.ssm_dtype = args.ssm_dtype or dtype
    args.out = args.out or str(ROOT / "benchmarks" / "results" / out_name)
    policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    if args.worker:
        print("RESULT " + json.dumps(worker(args.model, args.worker, policies, args.ssm_dtype)), flush=True)
        return 0
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if not (Path(args.model) / "config.json").exists():
        from vllm_admission.engine.tiny_model import make_tiny_model

        make_tiny_model(args.model, arch=args.arch)

    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            proc = subprocess.run([sys.executable, __file__, "--worker", mode, "--model", args.model,
                                   "--ssm-dtype", args.ssm_dtype, "--policies", ",".join(policies)],
                                  capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not lines:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
                raise SystemExit(f"the {mode} engine failed in repeat {r}")
            runs[mode].append(json.loads(lines[-1][len("RESULT "):]))
            print(f"repeat {r + 1}/{args.repeats} {mode}: " + ", ".join(
                f"{pol} {sum(v['ttft_s']):.2f} s" for pol, v in runs[mode][-1]["policies"].items()),
                flush=True)

    summary = {}
    for policy in policies:
        per = {m: [run["policies"][policy] for run in runs[m]] for m in MODES}
        same = all(a["cached"] == b["cached"] and a["first_token"] == b["first_token"]
                   for a, b in zip(per["split"], per["inpass"], strict=True))
        ratios = [sum(b["ttft_s"]) / sum(a["ttft_s"]) for a, b in zip(per["split"], per["inpass"], strict=True)]
        summary[policy] = {
            "steps": {m: per[m][0]["steps"] for m in MODES},
            "cached": per["split"][0]["cached"],
            "same_cached_and_tokens": same,
            "median_ttft_s": {m: statistics.median(statistics.median(x["ttft_s"]) for x in per[m])
                              for m in MODES},
            "total_ttft_s": {m: [sum(x["ttft_s"]) for x in per[m]] for m in MODES},
            "inpass_over_split": statistics.median(ratios),
            "ratios": ratios,
        }
    doc = {"model": args.model, "arch": args.arch, "ssm_dtype": args.ssm_dtype, "repeats": args.repeats,
           "block_size": runs["split"][0]["block_size"],
           "machine": machine(), "summary": summary, "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"\n| policy | steps per prompt split / inpass | median TTFT split | median TTFT inpass "
          f"| inpass / split (median of {args.repeats} paired) | same hits and tokens |")
    print("|---|---|---|---|---|---|")
    for policy, s in summary.items():
        steps = {m: sum(v) / len(v) for m, v in s["steps"].items()}
        print(f"| {policy} | {steps['split']:.1f} / {steps['inpass']:.1f} "
              f"| {1000 * s['median_ttft_s']['split']:.0f} ms | {1000 * s['median_ttft_s']['inpass']:.0f} ms "
              f"| {s['inpass_over_split']:.3f} | {'yes' if s['same_cached_and_tokens'] else 'NO'} |")
    print(f"wrote {args.out}")
    return 0 if all(s["same_cached_and_tokens"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
