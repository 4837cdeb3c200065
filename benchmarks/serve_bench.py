"""Time to first token under ``vllm serve``, stock vLLM against the plugin (issue 35 part 1).

Each configuration serves a bench-size hybrid model (``make-tiny-model --size bench``:
the tiny model's block size, with enough compute per token that prefill dominates
TTFT on CPU) and is driven by vLLM's own ``vllm bench serve`` with its ``timed_trace``
dataset, which sends pre-tokenized prompts built from per-chunk hash ids (a chunk of
``--chunk`` tokens per id, so prompts that share ids share tokens). The requests are a
trace's, converted: the project's synthetic workload (system prompts, templates,
multi-turn chats) or Mooncake's conversation trace scaled to the engine (one hash id per
``--chunk`` tokens).

Per configuration three runs, the prefix cache reset before each (vLLM's
``/reset_prefix_cache``, dev mode):

* ``sequential``: one request at a time, in trace order (``--max-concurrency 1``);
* ``rate``: Poisson arrivals at ``--rate`` requests per second;
* ``saturation``: every request at once.

The Mooncake workload can be a sample of its conversations (``--sample K:R``: the
requests whose conversation key hashes to ``R`` modulo ``K``), so that a few hundred
requests keep the trace's own reuse: a conversation's turns are all kept or all left out,
and the shared prefixes (the system prompt) stay shared. A conversation's key is the
first span key of a request that is not a shared prefix
(:func:`~vllm_admission.core.traces.resample.shared_prefix_keys`). This is SHARDS-style
spatial sampling (Waldspurger et al., FAST 2015), keyed on conversations instead of
blocks so that a sampled request keeps its whole prefix.

Reported per run: ``vllm bench serve``'s TTFT mean / P50 / P99, ITL mean / P99, request
throughput; the prompt tokens the server computed (``vllm:prompt_tokens`` less
``vllm:prompt_tokens_cached``, from ``/metrics``); and beside it the simulator's prediction
for the same requests with the engine's geometry, one request at a time (so it is the
prediction of the ``sequential`` run; under concurrency the engine departs from it, and the
table says by how much).

Stock vLLM runs with the plugin's CPU fixes of vLLM 0.32 (``VLLM_ADMISSION_CPU_FIXES=1``:
without the block-size fix a CPU server never writes a prompt-end state, engine-facts
section 11), so the comparison is of policies, not of a CPU bug.

Usage: ``python benchmarks/serve_bench.py [--arch qwen3-next] [--workload synthetic]
[--sample K:R] [--configs stock,vllm,vllm-inpass,marconi-inpass,auto] [--requests 96]
[--runs sequential,rate,saturation] [--out FILE]`` (``make bench-serve`` runs both
architectures on the synthetic workload, about 35 minutes for Qwen3-Next and 20 for
Nemotron-H on 2 cores, then Qwen3-Next on a Mooncake sample, about 50 minutes).
Results: ``benchmarks/results/serve_<arch>_<workload>.json``, docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path

from vllm_admission.core.adaptive import MARGIN_ADMISSIONS, MARGIN_SETTING

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
BIN = Path(sys.executable).parent

#: name -> (scheduler plugin?, admission, eviction, checkpoint mode)
CONFIGS = {
    "stock": (False, "vllm", "lru", "split"),
    "vllm": (True, "vllm", "lru", "split"),
    "vllm-inpass": (True, "vllm", "lru", "inpass"),
    "marconi": (True, "marconi", "lru", "split"),
    "marconi-inpass": (True, "marconi", "lru", "inpass"),
    "auto": (True, "auto", "auto", "split"),
    # auto with its shadow process at the server's own priority (VLLM_ADMISSION_SHADOW_NICE=0)
    "auto-nice0": (True, "auto", "auto", "split"),
    "vllm-reuse": (True, "vllm", "reuse", "split"),
    "last-reuse": (True, "last", "reuse", "split"),
    "vllm-lfu": (True, "vllm", "lfu", "split"),
    # auto with the margin over stock and written among its candidates (results 5.6)
    "auto-margin": (True, "auto", "auto", "split"),
}
#: Extra plugin settings per configuration.
CONFIG_ENV = {"auto-nice0": {"VLLM_ADMISSION_SHADOW_NICE": "0"},
              "auto-margin": {"VLLM_ADMISSION_AUTO_MARGIN": str(MARGIN_SETTING),
                              "VLLM_ADMISSION_AUTO_ADMISSIONS": ",".join(MARGIN_ADMISSIONS)}}
#: The same settings for the simulator's prediction (SimulationSettings fields).
CONFIG_SIM = {"auto-margin": {"auto_margin": MARGIN_SETTING, "auto_admissions": MARGIN_ADMISSIONS}}
#: The synthetic workload: short system prompts and templates, chats of a few turns.
SYNTHETIC = {"agent_fraction": 0.0, "chat_fraction": 0.6, "fewshot_fraction": 0.4,
             "system_prompt_len": [600, 0.5, 200, 1500], "template_len": [900, 0.5, 300, 2000],
             "user_message_len": [100, 1.0, 8, 600], "max_prompt_len": 3000}
SSM_DTYPE = {"qwen3-next": "bfloat16", "nemotron-h": "float32"}


# -- the workload ---------------------------------------------------------------
def sample_conversations(trace, modulus: int, residue: int, max_prompt: int) -> list:
    """The requests of ``trace`` whose conversation key is ``residue`` modulo ``modulus``
    (CRC-32 of the key's decimal text; see the module docstring), in trace order, those
    longer than ``max_prompt`` tokens left out."""
    from vllm_admission.core.traces.resample import shared_prefix_keys

    shared = shared_prefix_keys(trace)

    def conversation(req) -> int:
        keys = [k for k, _ in req.prompt.spans]
        return next((k for k in keys if k not in shared), keys[-1])

    return [r for r in trace.requests
            if r.prompt_len <= max_prompt
            and zlib.crc32(str(conversation(r)).encode()) % modulus == residue]


def load_workload(name: str, n: int, chunk: int, output_len: int,
                  sample: tuple[int, int] | None = None, max_prompt: int = 4000):
    """The trace's first ``n`` requests (of its sampled conversations with ``sample``:
    ``(modulus, residue)``), as ``(timed_trace rows, simulator Trace)``.

    Each prompt becomes its chained hash per ``chunk`` tokens (the last chunk partial);
    ``timed_trace`` expands each id to ``chunk`` random tokens (``f"{id}:{size}"`` seeds
    them), and the simulator gets token prompts with the same structure: a chunk's tokens
    depend on its id and size only."""
    from vllm_admission.core.traces import Request, Trace, load_trace
    from vllm_admission.core.traces.prompts import TokenPrompt

    if name == "synthetic":
        trace = load_trace("synthetic", seed=0, num_requests=n, **SYNTHETIC)
    elif name == "mooncake" and sample is not None:
        full = load_trace(str(MOONCAKE), mooncake_block_tokens=chunk)
        trace = Trace(name=full.name, requests=sample_conversations(full, *sample, max_prompt))
    elif name == "mooncake":
        trace = load_trace(str(MOONCAKE), max_requests=n, mooncake_block_tokens=chunk)
    else:
        raise SystemExit(f"unknown workload {name!r} (synthetic, mooncake)")
    rows, requests = [], []
    for req in trace.requests[:n]:
        P = req.prompt_len
        ids = req.prompt.block_hashes(chunk, include_partial=True)
        assert len(ids) == -(-P // chunk)
        out = min(req.output_len or output_len, output_len)
        rows.append({"timestamp": 0.0, "input_length": P, "output_length": out,
                     "hash_ids": [int(h) for h in ids]})
        tokens: list[int] = []
        for j, h in enumerate(ids):
            size = min(chunk, P - j * chunk)
            rng = random.Random(f"{h}:{size}")
            tokens += [rng.randrange(3, 500) for _ in range(size)]
        requests.append(Request(req.request_id, TokenPrompt(tuple(tokens)), out, None, None))
    return rows, Trace(name=f"{name}-{n}", requests=requests)


def predict(trace, model: Path, arch: str, config: str, *, num_blocks: int, budget: int
            ) -> dict:
    """The simulator on ``trace`` with the engine's geometry, one request at a time."""
    from vllm_admission.core.costs import ModelCosts
    from vllm_admission.core.geometry import CPU_BLOCK_SIZE, CPU_KERNEL_BLOCK_SIZE, aligned_block_size
    from vllm_admission.sim.simulator import SimulationSettings, simulate

    _, admission, eviction, checkpoint = CONFIGS[config]
    costs = ModelCosts.from_config(str(model / "config.json"), mamba_ssm_cache_dtype=SSM_DTYPE[arch])
    B = aligned_block_size(costs, CPU_BLOCK_SIZE, kernel_block_size=CPU_KERNEL_BLOCK_SIZE)
    res = simulate(trace, costs, SimulationSettings.of(admission, eviction, num_blocks=num_blocks,
                                                    block_size=B, chunk_size=budget, outputs="unique", per_request=True,
                                                    checkpoint=checkpoint, retune_every=0,
                                                    **CONFIG_SIM.get(config, {})))
    prompt = sum(r.prompt_len for r in trace.requests)
    return {"block_size": B, "prompt_tokens": prompt, "hit_tokens": res.hit_tokens,
            "computed_tokens": prompt - res.hit_tokens, "token_hit_rate": res.token_hit_rate,
            "prefill_steps": res.prefill_steps}


# -- the server -------------------------------------------------------------------
def _get(url: str, data: bytes | None = None, timeout: float = 10.0) -> str:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def prompt_counters(base: str) -> tuple[float, float]:
    """``vllm:prompt_tokens`` and ``vllm:prompt_tokens_cached`` totals from ``/metrics``."""
    total = cached = 0.0
    for line in _get(f"{base}/metrics").splitlines():
        if line.startswith("vllm:prompt_tokens_total"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prompt_tokens_cached_total"):
            cached += float(line.rsplit(" ", 1)[1])
    return total, cached


class Server:
    """``vllm serve`` of one configuration, in its own process group."""

    def __init__(self, model: Path, arch: str, config: str, *, port: int, num_blocks: int,
                 budget: int, log: Path) -> None:
        plugin, admission, eviction, checkpoint = CONFIGS[config]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_ADMISSION_")}
        env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="2",
                   VLLM_ADMISSION_LOG_INTERVAL="0")
        args = [str(BIN / "vllm"), "serve", str(model), "--served-model-name", "bench",
                "--port", str(port), "--dtype", "bfloat16",
                "--mamba-ssm-cache-dtype", SSM_DTYPE[arch], "--enable-prefix-caching",
                "--max-model-len", "4096", "--max-num-batched-tokens", str(budget),
                "--num-gpu-blocks-override", str(num_blocks), "--disable-log-stats"]
        if plugin:
            args += ["--scheduler-cls", "vllm_admission.AdmissionScheduler"]
            env.update(VLLM_ADMISSION_POLICY=admission, VLLM_ADMISSION_EVICTION=eviction,
                       VLLM_ADMISSION_CHECKPOINT=checkpoint, **CONFIG_ENV.get(config, {}))
        else:
            env["VLLM_ADMISSION_CPU_FIXES"] = "1"
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(log, "w")  # noqa: SIM115 - open for the server's life, closed by close()
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}; see {log}")
            try:
                _get(f"{self.base}/health", timeout=2)
                return
            except OSError:
                time.sleep(2)
        raise RuntimeError(f"vllm serve did not start in 600 s; see {log}")

    def reset(self) -> None:
        _get(f"{self.base}/reset_prefix_cache", data=b"")

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def bench(server: Server, model: Path, dataset: Path, n: int, chunk: int, *, rate: str,
          concurrency: int | None, out: Path) -> dict:
    """One ``vllm bench serve`` run; its saved result."""
    args = [str(BIN / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", server.base,
            "--model", "bench", "--tokenizer", str(model), "--dataset-name", "timed_trace",
            "--dataset-path", str(dataset), "--timed-trace-chunk-hash-size", str(chunk),
            "--num-prompts", str(n), "--no-self-timed", "--request-rate", rate, "--seed", "0",
            "--percentile-metrics", "ttft,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
            "--disable-tqdm"]
    if concurrency is not None:
        args += ["--max-concurrency", str(concurrency)]
    env = dict(os.environ, PYTHONHASHSEED="0")  # timed_trace seeds each chunk with hash(str)
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


RUNS = {"sequential": ("inf", 1), "rate": (None, None), "saturation": ("inf", None)}
KEEP = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms",
        "mean_e2el_ms", "request_throughput", "duration", "completed")


def run_config(config: str, args, model: Path, dataset: Path, work: Path) -> dict:
    server = Server(model, args.arch, config, port=args.port, num_blocks=args.num_blocks,
                    budget=args.budget, log=work / f"serve-{config}.log")
    runs = {}
    try:
        # Warm-up: one short request, then an empty cache.
        warm = work / "warm.jsonl"
        warm.write_text(json.dumps({"timestamp": 0.0, "input_length": 64, "output_length": 2,
                                    "hash_ids": [7, 8, 9, 10]}) + "\n")
        bench(server, model, warm, 1, 16, rate="inf", concurrency=1, out=work / "warm.json")
        for run in args.runs.split(","):
            rate, conc = RUNS[run]
            server.reset()
            before = prompt_counters(server.base)
            res = bench(server, model, dataset, args.requests, args.chunk,
                        rate=rate or str(args.rate), concurrency=conc,
                        out=work / f"{config}-{run}.json")
            after = prompt_counters(server.base)
            prompt, cached = after[0] - before[0], after[1] - before[1]
            runs[run] = {**{k: res.get(k) for k in KEEP}, "prompt_tokens": prompt,
                         "cached_tokens": cached, "computed_tokens": prompt - cached}
            print(f"  {config:15s} {run:10s} TTFT mean {res['mean_ttft_ms']:8.1f} ms "
                  f"p50 {res['median_ttft_ms']:8.1f} p99 {res['p99_ttft_ms']:8.1f}  "
                  f"computed {prompt - cached:8.0f} of {prompt:8.0f}", flush=True)
    finally:
        server.close()
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen3-next", choices=tuple(SSM_DTYPE))
    ap.add_argument("--workload", default="synthetic", choices=("synthetic", "mooncake"))
    ap.add_argument("--configs", default="stock,vllm,vllm-inpass,marconi-inpass,auto",
                    help=f"comma-separated, of: {', '.join(CONFIGS)}")
    ap.add_argument("--requests", type=int, default=96, help="at most this many requests")
    ap.add_argument("--sample", default=None, metavar="K:R",
                    help="mooncake: keep the conversations whose key is R modulo K (all requests)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    ap.add_argument("--chunk", type=int, default=16, help="tokens per hash id")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--rate", type=float, default=1.0, help="requests per second (rate run)")
    ap.add_argument("--num-blocks", type=int, default=40,
                    help="KV cache blocks (small enough that eviction decides)")
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--port", type=int, default=18230)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown} (valid: {', '.join(CONFIGS)})")
    if args.workload == "mooncake" and not MOONCAKE.exists():
        ap.error(f"mooncake trace not found at {MOONCAKE}")
    bad_runs = [r for r in args.runs.split(",") if r not in RUNS]
    if bad_runs:
        ap.error(f"unknown runs {bad_runs} (valid: {', '.join(RUNS)})")
    sample = None
    if args.sample is not None:
        try:
            k, r = (int(x) for x in args.sample.split(":"))
        except ValueError:
            k = r = -1
        if args.workload != "mooncake" or not 0 <= r < k:
            ap.error(f"--sample K:R needs the mooncake workload and 0 <= R < K, got {args.sample!r}")
        sample = (k, r)
    from vllm_admission.engine.tiny_model import make_tiny_model

    work = Path(tempfile.mkdtemp(prefix="serve_bench_"))
    model = make_tiny_model(args.model_dir or work / "model", arch=args.arch, size="bench",
                            max_position_embeddings=8192)
    rows, trace = load_workload(args.workload, args.requests, args.chunk, args.output_len, sample)
    dataset = work / "requests.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = {"arch": args.arch, "workload": args.workload, "sample": args.sample, "requests": len(rows),
           "chunk_tokens": args.chunk, "output_len": args.output_len, "rate": args.rate,
           "num_gpu_blocks": args.num_blocks, "max_num_batched_tokens": args.budget,
           "date": time.strftime("%Y-%m-%d"), "configs": {}}
    print(f"{args.arch}, {args.workload}: {len(rows)} requests, "
          f"{sum(r['input_length'] for r in rows)} prompt tokens; work dir {work}", flush=True)
    for config in configs:
        pred = predict(trace, model, args.arch, config, num_blocks=args.num_blocks,
                       budget=args.budget)
        runs = run_config(config, args, model, dataset, work)
        doc["configs"][config] = {"predicted": pred, "runs": runs}
        if "sequential" in runs:
            seq = runs["sequential"]["computed_tokens"]
            doc["configs"][config]["sequential_vs_predicted"] = seq / pred["computed_tokens"] - 1
    name = args.workload if sample is None else f"{args.workload}-sample{sample[0]}-{sample[1]}"
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"serve_{args.arch}_{name}.json")
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
