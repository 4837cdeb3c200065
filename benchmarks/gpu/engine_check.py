"""The plugin inside vLLM's GPU engine: one prepared run for a lent GPU machine.

On the GPU machine, after unpacking the engine tree (``make_engine_tree.py``; the
``run`` tool carries ``.gpu/engine``)::

    mkdir -p /tmp/engine && tar xzf .gpu/engine/engine-tree.tar.gz -C /tmp/engine &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/engine/site \\
        /tmp/engine/wheels/*.whl &&
    PYTHONPATH=/tmp/engine/site:$PWD python3 benchmarks/gpu/engine_check.py \\
        --out $OUT/engine-check.json --budget-s 420

Here, on vLLM's CPU engine (synchronous scheduling, no stand-ins), the same steps run as
a rehearsal (``--device cpu``; ``tests/test_engine_check.py`` runs a part of it), so the
GPU minutes go to the GPU.

Steps, each timed and written to ``--out`` as soon as it ends (a step that fails is
recorded with its error and the run goes on; one that would start past the budget is
recorded as skipped):

1. ``environment``: torch, Triton, CUDA, the device, vLLM's version and file, the
   platform vLLM detected, and the stand-in ops registered for compiled ones the tree
   lacks (:mod:`vllm_admission_testing.gpu_standins`).
2. Per model (the tiny Qwen3-Next, then the tiny Nemotron-H, made here with
   :func:`~vllm_admission.engine.tiny_model.make_tiny_model`, every token routed to every
   expert as in the engine tests):

   * ``stock``: vLLM's own scheduler. Greedy tokens and the top-5 raw logits of the check
     prompts (three prompts over one shared prefix, then the first again), the reference.
   * one step per policy pair (:data:`PAIRS`): the plugin with the pair replays a
     synthetic workload in a pool small enough to evict (vLLM's async scheduling on, the
     GPU default), beside the simulator configured from the live engine
     (:func:`vllm_admission.fidelity.runner.run_pair`: per-request cached tokens, prefill
     steps, evictions, checkpoints); then, on the same engine, the check prompts, whose
     tokens and logits are compared with stock's (``tests/model_output.py``: bit for bit
     where the computation is the same, else within the rounding bound of the passes).

3. ``<model>/inpass-<admission>`` (``vllm`` and ``dense``): split against in-pass
   checkpoints (``VLLM_ADMISSION_CHECKPOINT=inpass``, whose GPU path the plugin refuses
   until this check has passed; this process lifts the refusal for itself) on the check
   prompts, block size a multiple of 64 and the SSM state in bf16: per-request hits and
   prefill passes, the outputs, and every state cached after the first prompt compared
   bit for bit; then ``qwen3-next/ttft``: time to first token, P50 and P99, of the
   synthetic workload served one request at a time, for stock vLLM and both modes of both
   policies, in this one run.
4. ``serve``: ``vllm serve`` with the plugin on the tiny Qwen3-Next from the same tree,
   three text completions over one shared prefix through the ``openai`` client: the cached
   tokens each reports (the third hits the shared prefix rounded down to a block).

The summary (``summary``) gives, per model and pair, the requests whose hits differ from
the simulator's, the prefill steps that differ, the evictions on each side and whether the
check prompts' output equals stock's.

    python benchmarks/gpu/engine_check.py --out FILE [--device cuda|cpu] [--budget-s S]
        [--models qwen3-next,nemotron-h] [--pairs vllm+lru,...] [--no-pairs] [--no-inpass]
        [--no-serve]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

#: The policy pairs the GPU engine runs: vLLM's own, Marconi's admission, a checkpoint at
#: every block, the sequence end only with S3-FIFO, and the adaptive pair.
PAIRS: tuple[tuple[str, str], ...] = (("vllm", "lru"), ("marconi", "lru"), ("dense", "lru"),
                                      ("last", "s3fifo"), ("auto", "auto"))
MODELS = ("qwen3-next", "nemotron-h")
#: Tokens the fidelity pool holds (the CPU engine tests' 40 blocks of 128 tokens); the pool
#: in blocks follows from the block size the engine chose.
POOL_TOKENS = 40 * 128
#: The synthetic workload of the fidelity steps: chats and few-shot prompts over shared
#: prefixes (``tests/test_fidelity.py``'s ``SMALL``).
WORKLOAD = {"num_requests": 24, "agent_fraction": 0, "chat_fraction": 0.6,
            "fewshot_fraction": 0.4, "system_prompt_len": [600, 0.5, 200, 1500],
            "template_len": [900, 0.5, 300, 2000], "user_message_len": [100, 1.0, 8, 600],
            "max_prompt_len": 4000}
MAX_OUTPUT_LEN = 8
#: Admission policies of the in-pass comparison and the TTFT timing: vLLM's own and a
#: checkpoint at every block (the most chunk stops split mode pays for).
INPASS_ADMISSIONS = ("vllm", "dense")
#: Engine arguments of a GPU engine without vLLM's compiled ops: vLLM's native (torch)
#: forward of its custom ops and norms, no graph compilation, the Triton attention,
#: fused-MoE and GDN prefill backends. Eager mode is
#: :func:`~vllm_admission.engine.llm.build_llm`'s own. What still needs a compiled op has a
#: stand-in (:mod:`vllm_admission_testing.gpu_standins`, installed by the tree's platform
#: plugin, with its environment settings).
GPU_ENGINE_ARGS: dict[str, Any] = {
    "compilation_config": {"mode": 0, "custom_ops": ["none"]},
    "attention_config": {"backend": "TRITON_ATTN"},
    "additional_config": {"gdn_prefill_backend": "triton"},
    "moe_backend": "triton",
    "ir_op_priority": {"rms_norm": ["native"], "fused_add_rms_norm": ["native"]},
}


def check_prompts(vocab: int, shared: int = 700, own: int = 100) -> list[list[int]]:
    """Three prompts of ``shared + own`` token ids over one shared prefix, then the first
    again (a resend): a junction, a hit at the junction and a hit near the prompt end."""
    base = [3 + (7 * i) % (vocab - 3) for i in range(shared)]
    tails = [[3 + (11 * i + 97 * k) % (vocab - 3) for i in range(own)] for k in range(3)]
    prompts = [base + t for t in tails]
    return prompts + [prompts[0]]


def pool_blocks(block_size: int) -> int:
    """Blocks of a pool holding :data:`POOL_TOKENS` tokens at ``block_size`` (at least 16)."""
    return max(16, math.ceil(POOL_TOKENS / block_size))


class Report:
    """The JSON report, written after every step."""

    def __init__(self, path: Path, budget_s: float) -> None:
        self.path = path
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.doc: dict[str, Any] = {"steps": {}, "summary": {}}
        path.parent.mkdir(parents=True, exist_ok=True)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def step(self, name: str, fn: Callable[[], Any], *, need_s: float = 0.0) -> Any:
        """Run ``fn`` as step ``name``; record its result or its error and the seconds."""
        if self.left_s() < need_s:
            self.doc["steps"][name] = {"status": "skipped", "reason": "budget",
                                       "left_s": round(self.left_s(), 1)}
            self.write()
            return None
        t0 = time.monotonic()
        try:
            result = fn()
            entry = {"status": "ok", "result": result}
        except Exception as exc:  # a failed step is the finding; the run goes on
            result = None
            entry = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:4000],
                     "traceback": traceback.format_exc()[-6000:]}
        entry["seconds"] = round(time.monotonic() - t0, 2)
        self.doc["steps"][name] = entry
        self.write()
        print(f"[engine_check] {name}: {entry['status']} in {entry['seconds']} s", flush=True)
        return result

    def write(self) -> None:
        self.doc["elapsed_s"] = round(time.monotonic() - self.start, 1)
        self.path.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")


# ---------------------------------------------------------------- steps


def environment(device: str) -> dict[str, Any]:
    import torch

    standins: list[str] = []
    if device == "cuda":   # before vLLM is imported: the ops, and the environment they need
        from vllm_admission_testing.gpu_standins import install

        standins = install()
    import vllm
    from vllm.platforms import current_platform

    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "vllm": vllm.__version__, "vllm_file": vllm.__file__,
        "platform": type(current_platform).__name__, "standins": standins,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        info["device"] = torch.cuda.get_device_name(0)
    return info


def make_models(root: Path, models: list[str]) -> dict[str, str]:
    from model_output import route_to_every_expert

    from vllm_admission.engine.tiny_model import make_tiny_model

    return {arch: str(route_to_every_expert(make_tiny_model(root / arch, arch=arch)))
            for arch in models}


def engine_args(device: str) -> dict[str, Any]:
    from model_output import LOGITS_MODE

    args: dict[str, Any] = dict(LOGITS_MODE)
    if device == "cuda":
        args.update(GPU_ENGINE_ARGS)
        args["async_scheduling"] = True
    return args


def run_stock(model: str, device: str) -> dict[str, Any]:
    """Stock vLLM on the check prompts: the reference outputs and the block size."""
    from model_output import generate

    from vllm_admission.engine.llm import EngineSettings, build_llm, engine_geometry, shutdown_llm

    settings = EngineSettings(model=model, num_gpu_blocks=512, max_model_len=4096,
                              env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
                              engine_args=engine_args(device))
    llm = build_llm(settings)
    try:
        geometry = engine_geometry(llm)
        vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
        outputs = generate(llm, check_prompts(vocab), MAX_OUTPUT_LEN)
    finally:
        shutdown_llm(llm)
        del llm
    return {"geometry": geometry.to_dict(), "vocab": vocab,
            "outputs": [o.__dict__ for o in outputs]}


def run_pair_step(model: str, device: str, admission: str, eviction: str, block_size: int,
                  stock: dict[str, Any], fitted_lengths: dict[int, int]) -> dict[str, Any]:
    """The plugin with one pair: the fidelity replay, then the check prompts on the same
    engine against stock's outputs. ``fitted_lengths`` is shared by one model's pairs
    (:func:`~vllm_admission.fidelity.runner.run_pair`)."""
    from model_output import Output, generate, output_difference

    from vllm_admission.fidelity.runner import load_trace_of, run_pair
    from vllm_admission.fidelity.spec import FidelitySpec

    blocks = pool_blocks(block_size)
    spec = FidelitySpec(model=model, trace="synthetic", pairs=((admission, eviction),),
                        num_gpu_blocks=(blocks,), max_output_len=MAX_OUTPUT_LEN,
                        synthetic=dict(WORKLOAD), engine_args=engine_args(device))
    trace = load_trace_of(spec)
    want = [Output(**o) for o in stock["outputs"]]

    def check(llm: Any) -> dict[str, Any]:
        got = generate(llm, check_prompts(stock["vocab"]), MAX_OUTPUT_LEN)
        diffs = [output_difference(w, g) for w, g in zip(want, got, strict=True)]
        return {"outputs": [o.__dict__ for o in got], "differences": diffs,
                "same_as_stock": all(d is None for d in diffs)}

    record = run_pair(spec, trace, admission, eviction, blocks, on_engine=check,
                      fitted_lengths=fitted_lengths)
    return record


def summarize(pair_record: dict[str, Any]) -> dict[str, Any]:
    eng, sim = pair_record["engine"], pair_record["simulator"]
    return {"requests": pair_record["requests"],
            "requests_differing": pair_record["requests_differing"],
            "prefill_steps_differing": pair_record["prefill_steps_differing"],
            "evictions": [eng["evictions"], sim["evictions"]],
            "state_checkpoints": [eng["state_checkpoints"], sim["state_checkpoints"]],
            "token_hit_rate": round(eng["token_hit_rate"], 4),
            "same_as_stock": pair_record["on_engine"]["same_as_stock"]}


def _p50_p99(values: list[float]) -> tuple[float | None, float | None]:
    """Median and 99th percentile of ``values`` (linear between order statistics:
    ``statistics.quantiles``' inclusive method); ``None`` for no values."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (None, None)
    return statistics.median(values), statistics.quantiles(values, n=100, method="inclusive")[98]


def _engine(model: str, device: str, *, admission: str | None, mode: str = "split") -> Any:
    """An in-process engine for the in-pass comparison: the plugin with ``admission`` (or
    stock vLLM for ``None``), block size a multiple of 64 (in-pass reads the GDN chunk
    kernel's 64-token chunk states), SSM state in bf16 (what the chunk states hold)."""
    from vllm_admission.engine.llm import EngineSettings, build_llm, plugin_settings

    if admission is None:
        settings = EngineSettings(model=model)
    else:
        settings = plugin_settings(model, admission=admission, eviction="lru")
        settings.env["VLLM_ADMISSION_CHECKPOINT"] = mode
        settings.env["VLLM_ADMISSION_LOG_INTERVAL"] = "0"
    settings.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    settings.num_gpu_blocks, settings.max_model_len = 512, 4096
    settings.block_size, settings.mamba_ssm_cache_dtype = 64, "bfloat16"
    settings.engine_args = engine_args(device)
    return build_llm(settings)


def run_inpass_step(model: str, device: str, admission: str) -> dict[str, Any]:
    """Split against in-pass checkpoints with one admission policy on the check prompts:
    per-request hits and prefill passes, the outputs, and every state cached after the
    first prompt (bit-identical expected on a GPU, where the chunk kernel's state is what
    split mode stores)."""
    from model_output import generate, output_difference, state_rows

    from vllm_admission.engine.llm import engine_geometry, shutdown_llm

    runs: dict[str, Any] = {}
    for mode in ("split", "inpass"):
        llm = _engine(model, device, admission=admission, mode=mode)
        try:
            vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
            prompts = check_prompts(vocab)
            first = generate(llm, prompts[:1], MAX_OUTPUT_LEN)
            states = state_rows(llm)
            outputs = first + generate(llm, prompts[1:], MAX_OUTPUT_LEN)
            runs[mode] = {"outputs": outputs, "states": states,
                          "block_size": engine_geometry(llm).block_size}
        finally:
            shutdown_llm(llm)
            del llm
    split, inp = runs["split"], runs["inpass"]
    keys = sorted(set(split["states"]) & set(inp["states"]))
    identical, worst = 0, 0.0
    for key in keys:
        pairs = zip(split["states"][key], inp["states"][key], strict=True)
        diffs = [float((a - b).abs().max()) for a, b in pairs]
        identical += all(d == 0.0 for d in diffs)
        worst = max(worst, *diffs)
    outputs = {m: runs[m]["outputs"] for m in runs}
    return {
        "block_size": split["block_size"],
        "hits": {m: [o.cached for o in outputs[m]] for m in outputs},
        "prefill_passes": {m: [o.passes for o in outputs[m]] for m in outputs},
        "states": {"split": len(split["states"]), "inpass": len(inp["states"]),
                   "compared": len(keys), "bit_identical": identical, "max_abs_diff": worst},
        "differences": [output_difference(a, b)
                        for a, b in zip(outputs["split"], outputs["inpass"], strict=True)],
    }


def run_ttft(model: str, device: str, admissions: list[str]) -> dict[str, Any]:
    """Time to first token (scheduled to first token, vLLM's request metrics) of the
    synthetic workload served one request at a time: stock vLLM, then split and in-pass
    checkpoints for each admission policy, all on this machine in this run, each engine
    warmed on a prompt of its own first. Seconds."""
    from model_output import generate

    from vllm_admission.core.traces import load_trace
    from vllm_admission.engine.llm import shutdown_llm
    from vllm_admission.engine.llm_replay import replay

    trace = load_trace("synthetic", **WORKLOAD).with_max_output_len(MAX_OUTPUT_LEN)
    cases = [("stock", None, "split")] + [(f"{a}/{m}", a, m) for a in admissions
                                          for m in ("split", "inpass")]
    out: dict[str, Any] = {}
    for name, admission, mode in cases:
        llm = _engine(model, device, admission=admission, mode=mode)
        try:
            vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
            # Kernels compiled and caches warmed on a prompt of its own, then forgotten.
            generate(llm, [[3 + (13 * i) % (vocab - 3) for i in range(1500)]], 2)
            llm.reset_prefix_cache()
            result = replay(llm, trace.requests, vocab_size=vocab)
        finally:
            shutdown_llm(llm)
            del llm
        ttft = [r["prefill_seconds"] for r in result.requests if r["prefill_seconds"] is not None]
        p50, p99 = _p50_p99(ttft)
        out[name] = {"p50_s": p50, "p99_s": p99,
                     "hit_tokens": result.hit_tokens, "prefill_steps": result.prefill_steps,
                     "requests": len(ttft)}
    stock = out["stock"]
    for row in out.values():
        row["p50_vs_stock"] = row["p50_s"] / stock["p50_s"] if stock["p50_s"] else None
        row["p99_vs_stock"] = row["p99_s"] / stock["p99_s"] if stock["p99_s"] else None
    return out


def serve_check(model: str, device: str, timeout_s: float) -> dict[str, Any]:
    """``vllm serve`` with the plugin: three completions over one shared prefix."""
    import socket

    import openai

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "import sys; from vllm.entrypoints.cli.main import main; "
           "sys.argv[0] = 'vllm'; main()", "serve", model,
           "--scheduler-cls", "vllm_admission.AdmissionScheduler",
           "--served-model-name", "tiny", "--enable-prefix-caching", "--port", str(port),
           "--max-model-len", "4096", "--enforce-eager"]
    if device == "cuda":
        cmd += ["--compilation-config", json.dumps(GPU_ENGINE_ARGS["compilation_config"]),
                "--attention-config", json.dumps(GPU_ENGINE_ARGS["attention_config"]),
                "--additional-config", json.dumps(GPU_ENGINE_ARGS["additional_config"]),
                "--moe-backend", GPU_ENGINE_ARGS["moe_backend"],
                "--ir-op-priority", json.dumps(GPU_ENGINE_ARGS["ir_op_priority"])]
    env = dict(os.environ, VLLM_ADMISSION_POLICY="vllm")
    log = Path(tempfile.mkdtemp(prefix="serve_")) / "server.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=60)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: "
                                   f"{log.read_text()[-3000:]}")
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not up in {timeout_s:.0f} s: "
                                       f"{log.read_text()[-3000:]}") from None
                time.sleep(2)
        shared = " ".join(f"w{(7 * i) % 97}" for i in range(900))
        cached = []
        for k in range(3):
            out = client.completions.create(model="tiny", prompt=f"{shared} q{k}",
                                            max_tokens=4, temperature=0.0)
            details = getattr(out.usage, "prompt_tokens_details", None)
            cached.append({"prompt_tokens": out.usage.prompt_tokens,
                           "cached_tokens": getattr(details, "cached_tokens", None)})
        return {"completions": cached, "log_tail": log.read_text()[-2000:]}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------- main


def parse_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        admission, _, eviction = item.strip().partition("+")
        if not admission or not eviction:
            raise SystemExit(f"engine_check: a pair is ADMISSION+EVICTION, got {item!r}")
        pairs.append((admission, eviction))
    return pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON report to write")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda (the GPU machine) or cpu (a rehearsal on vLLM's CPU engine)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds after which no new step starts (default 420)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated tiny models")
    ap.add_argument("--pairs", default=",".join(f"{a}+{e}" for a, e in PAIRS),
                    help="comma-separated ADMISSION+EVICTION pairs")
    ap.add_argument("--no-pairs", action="store_true",
                    help="leave out stock and the policy pairs (to rerun the later steps alone)")
    ap.add_argument("--no-serve", action="store_true", help="leave out the vllm serve step")
    ap.add_argument("--no-inpass", action="store_true",
                    help="leave out the in-pass comparison and the TTFT timing")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise SystemExit(f"engine_check: unknown model(s) {unknown}; known: {list(MODELS)}")
    pairs = parse_pairs(args.pairs)
    report = Report(args.out, args.budget_s)
    report.doc["settings"] = {"device": args.device, "models": models,
                              "pairs": [list(p) for p in pairs],
                              "engine_args": engine_args(args.device),
                              "pool_tokens": POOL_TOKENS, "workload": WORKLOAD}
    if report.step("environment", lambda: environment(args.device)) is None:
        return 1
    paths = report.step("models", lambda: make_models(Path(tempfile.mkdtemp()), models))
    if paths is None:
        return 1
    for arch in [] if args.no_pairs else models:
        stock = report.step(f"{arch}/stock", lambda arch=arch: run_stock(paths[arch], args.device),
                            need_s=30)
        if stock is None:
            continue
        block_size = int(stock["geometry"]["block_size"])
        fitted: dict[int, int] = {}
        for admission, eviction in pairs:
            name = f"{arch}/{admission}+{eviction}"
            rec = report.step(name, lambda a=admission, e=eviction, arch=arch, b=block_size,
                              ref=stock, f=fitted: run_pair_step(paths[arch], args.device, a,
                                                                 e, b, ref, f),
                              need_s=30)
            if rec is not None:
                report.doc["summary"][name] = summarize(rec)
                report.write()
    for arch in [] if args.no_inpass else models:
        for admission in INPASS_ADMISSIONS:
            name = f"{arch}/inpass-{admission}"
            rec = report.step(name, lambda a=admission, arch=arch: run_inpass_step(
                paths[arch], args.device, a), need_s=40)
            if rec is not None:
                report.doc["summary"][name] = {
                    "hits_equal": rec["hits"]["split"] == rec["hits"]["inpass"],
                    "prefill_passes": [sum(rec["prefill_passes"]["split"]),
                                       sum(rec["prefill_passes"]["inpass"])],
                    "states_bit_identical": [rec["states"]["bit_identical"],
                                             rec["states"]["compared"]],
                    "outputs_equal": all(d is None for d in rec["differences"])}
                report.write()
    if "qwen3-next" in paths and not args.no_inpass:
        report.step("qwen3-next/ttft", lambda: run_ttft(paths["qwen3-next"], args.device,
                                                        list(INPASS_ADMISSIONS)), need_s=90)
    if not args.no_serve and "qwen3-next" in paths:
        report.step("serve", lambda: serve_check(paths["qwen3-next"], args.device,
                                                 timeout_s=max(60.0, report.left_s() - 30)),
                    need_s=90)
    failed = [n for n, s in report.doc["steps"].items() if s["status"] == "error"]
    print(f"[engine_check] wrote {args.out}; failed steps: {failed or 'none'}")
    print(json.dumps(report.doc["summary"], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
