"""Scheduler overhead of the AdmissionScheduler against vLLM's stock Scheduler.

vLLM 0.32's ``Scheduler`` is driven without a model
(:class:`vllm_admission_testing.harness.FakeEngine`: made-up model-runner
outputs, as vLLM's own scheduler tests do) on a hand-built hybrid KV cache
(one GDN state group and one full-attention group, block size 256), over the
first requests of the Mooncake conversation trace re-blocked at that size (or
the synthetic workload when the trace file is absent). Requests are kept
``--concurrency`` at a time in flight, in trace order, each generating its
trace output length; the pool is small enough that cached blocks get evicted.

As vLLM's ``EngineCore`` does once its scheduler is built, the start-up heap
is frozen for the garbage collector before the timed loop
(``vllm.utils.gc_utils.freeze_gc_heap``), so that collections triggered while
serving do not walk vLLM's and torch's import-time objects.

Only ``schedule()`` + ``update_from_output()`` are timed, in wall-clock and
process CPU seconds (CPU time is the steadier figure on a shared machine; it
includes the alpha tuner's thread). Variants run in the same process,
interleaved (after one untimed warm-up each), for ``--reps`` repetitions; the
table shows medians and the ratios plugin / stock: ``ratio`` (median wall),
``cpu ratio`` (median CPU), ``paired`` (median over repetitions of the CPU
ratio to the stock run of the same repetition: the steadiest on a shared
machine, and the figure compared with the targets) and ``best-of`` (fastest
run over fastest run); ``paired wall`` is the same pairing on wall seconds.
Targets: ``vllm``+``lru`` <= 1.05, ``marconi``+``flop`` <= 1.15 (alpha fixed,
so no tuning replays run; a row that tunes alpha online on its background
thread is reported for information), ``auto``+``auto`` <= 1.10: its shadow
caches run on a background thread, so what it costs the scheduler loop is the
thread's share of the GIL and CPU during the timed calls (both ratios count it). The
row ``auto+auto, margin 0.3`` is ``auto`` with the margin over stock and ``written`` among its
candidates (``docs/results.md`` 5.6: ten shadows instead of eight), held to the same target. The
row ``auto+auto, a hand-over per request`` is ``auto``+``auto`` with the finished requests handed
to that thread one at a time instead of in batches (``vllm_admission/plugin/background.py``,
``BATCH``): what batching saves the loop, measured in the same run.

With ``--async-scheduling`` the engine configuration is a GPU engine's default
(``scheduler_config.async_scheduling`` on) and ``FakeEngine`` keeps two batches in
flight as ``EngineCore.step_with_batch_queue`` does; stock is then vLLM's
``AsyncScheduler`` (the plugin builds its async variant itself), and one more row,
vLLM's plain ``Scheduler`` under the same queue, shows what a scheduler without output
placeholders costs in engine steps (the plugin before it had an async variant).

Usage::

    .venv/bin/python benchmarks/scheduler_overhead.py [--requests 60] [--reps 5] [--async-scheduling]

Writes ``benchmarks/results/scheduler_overhead.json`` (``scheduler_overhead_async.json``
with ``--async-scheduling``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_admission.core.adaptive import MARGIN_ADMISSIONS, MARGIN_SETTING  # noqa: E402
from vllm_admission.core.eviction.learned import LearnedEviction  # noqa: E402

MOONCAKE = Path("/work/shared/traces/mooncake/conversation_trace.jsonl")
VOCAB = 512

VARIANTS = [
    # name, scheduler, env
    ("stock", "stock", {}),
    ("vllm+lru", "plugin", {"VLLM_ADMISSION_POLICY": "vllm", "VLLM_ADMISSION_EVICTION": "lru"}),
    ("marconi+flop", "plugin", {"VLLM_ADMISSION_POLICY": "marconi",
                                "VLLM_ADMISSION_EVICTION": "flop", "VLLM_ADMISSION_ALPHA": "0.5"}),
    ("marconi+flop (alpha tuned online)", "plugin",
     {"VLLM_ADMISSION_POLICY": "marconi", "VLLM_ADMISSION_EVICTION": "flop"}),
    ("auto+auto", "plugin", {"VLLM_ADMISSION_POLICY": "auto", "VLLM_ADMISSION_EVICTION": "auto"}),
    # The setting to leave on (docs/results.md 5.6): a margin over stock, written a candidate.
    ("auto+auto, margin 0.3", "plugin",
     {"VLLM_ADMISSION_POLICY": "auto", "VLLM_ADMISSION_EVICTION": "auto",
      "VLLM_ADMISSION_AUTO_MARGIN": str(MARGIN_SETTING),
      "VLLM_ADMISSION_AUTO_ADMISSIONS": ",".join(MARGIN_ADMISSIONS)}),
    # The same, its finished requests handed to the controller's thread one at a time
    # (plugin/background.py BATCH = 1): what batching them saves the loop.
    ("auto+auto, a hand-over per request", "plugin-unbatched",
     {"VLLM_ADMISSION_POLICY": "auto", "VLLM_ADMISSION_EVICTION": "auto"}),
    # The learned eviction with its default schedule: no model within --requests 60, so what
    # its bookkeeping (features, samples) costs the loop ...
    ("vllm+learned", "plugin", {"VLLM_ADMISSION_POLICY": "vllm", "VLLM_ADMISSION_EVICTION": "learned"}),
    # ... and with a model trained every 10 requests (LEARNED_FAST), in the background thread,
    # and one model call per request: the cost with the model at work.
    ("vllm+learned, a model every 10 requests", "plugin-learned-fast",
     {"VLLM_ADMISSION_POLICY": "vllm", "VLLM_ADMISSION_EVICTION": "learned"}),
]
TARGETS = {"vllm+lru": 1.05, "marconi+flop": 1.15, "auto+auto": 1.10, "auto+auto, margin 0.3": 1.10,
           "vllm+learned": 1.10, "vllm+learned, a model every 10 requests": 1.10}
#: The learned eviction's schedule in the row that trains it within a short run (a short
#: boundary, so that both labels are known within a few hundred requests).
LEARNED_FAST = {"retrain_every": 10, "lag": 3, "min_samples": 40, "boundary": 0.25}


def load_workload(n: int, trace: str) -> tuple[str, list[tuple[list[int], int]]]:
    from vllm_admission.core.traces import load_trace

    spec = trace if trace != "auto" else (str(MOONCAKE) if MOONCAKE.is_file() else "synthetic")
    t = load_trace(spec, max_requests=n)
    return t.name, [(r.token_ids(VOCAB), r.output_len) for r in t.requests]


def run_once(kind: str, env: dict[str, str], workload, *, vllm_config, num_blocks: int,
             concurrency: int) -> dict:
    from vllm.utils.gc_utils import freeze_gc_heap
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_admission.plugin import background as worker
    from vllm_admission.plugin.scheduler import AdmissionScheduler
    from vllm_admission_testing.harness import FakeEngine, make_kv_cache_config, make_scheduler

    for name in ("VLLM_ADMISSION_POLICY", "VLLM_ADMISSION_EVICTION", "VLLM_ADMISSION_ALPHA",
                 "VLLM_ADMISSION_AUTO_MARGIN", "VLLM_ADMISSION_AUTO_ADMISSIONS"):
        os.environ.pop(name, None)
    os.environ.update(env)
    os.environ["VLLM_ADMISSION_LOG_INTERVAL"] = "0"
    is_async = vllm_config.scheduler_config.async_scheduling
    cls = {"stock": AsyncScheduler if is_async else Scheduler, "plain": Scheduler,
           "plugin": AdmissionScheduler, "plugin-unbatched": AdmissionScheduler,
           "plugin-learned-fast": AdmissionScheduler}[kind]
    batch = worker.BATCH
    worker.BATCH = 1 if kind == "plugin-unbatched" else batch
    learned_init = LearnedEviction.__init__
    learned: list[LearnedEviction] = []

    def keep(self: LearnedEviction, *args: object, **kwargs: object) -> None:
        if kind == "plugin-learned-fast":
            kwargs = {**kwargs, **LEARNED_FAST}
        learned_init(self, *args, **kwargs)  # type: ignore[arg-type]
        learned.append(self)

    LearnedEviction.__init__ = keep  # type: ignore[method-assign]
    try:
        sched = make_scheduler(cls, vllm_config, make_kv_cache_config(vllm_config, num_blocks))
    finally:
        worker.BATCH = batch
        LearnedEviction.__init__ = learned_init  # type: ignore[method-assign]
    engine = FakeEngine(sched, batch_queue=2 if is_async else 1)
    pending = list(workload)
    pending.reverse()
    freeze_gc_heap()   # as EngineCore does (see the module docstring)
    in_flight = 0
    try:
        while pending or engine.busy():
            while pending and in_flight < concurrency:
                prompt, out_len = pending.pop()
                engine.add(prompt, out_len)
                in_flight += 1
            in_flight -= len(engine.step())
    finally:
        gc.unfreeze()
    hits = sum(engine.cached_tokens.values())
    prompt_tokens = sum(len(p) for p, _ in workload)
    result = {"seconds": engine.seconds, "cpu_seconds": engine.cpu_seconds,
              "steps": engine.steps, "forward_passes": engine.forward_passes,
              "hit_tokens": hits,
              "token_hit_rate": hits / prompt_tokens}
    if kind.startswith("plugin"):
        ctl = sched._admission  # noqa: SLF001
        ctl.drain(timeout=600)   # the alpha tuner's or auto's thread, outside the timed calls
        stats = sched.stats()
        result["evictions"] = stats.evictions
        result["alpha"] = stats.alpha
        result["tuning_events"] = len(stats.tuning)
        result["policy_switches"] = len(stats.policy_switches) if stats.adaptive else None
        result["learned_trainings"] = learned[-1].schedule.trainings if learned else None
        sched.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=60, help="trace requests (default 60)")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    p.add_argument("--blocks", type=int, default=1200, help="KV pool blocks (default 1200)")
    p.add_argument("--block-size", type=int, default=256, help="tokens per block (default 256)")
    p.add_argument("--trace", default="auto", help="trace file, 'synthetic', or 'auto'")
    p.add_argument("--async-scheduling", action="store_true",
                   help="vLLM's async scheduling on, two batches in flight")
    p.add_argument("--variants", default=None,
                   help="the rows to run besides stock, their names separated by ';' (default: all)")
    p.add_argument("--out", default=None, help="results file (default: benchmarks/results/"
                                               "scheduler_overhead[_async].json)")
    args = p.parse_args(argv)
    if args.out is None:
        suffix = "_async" if args.async_scheduling else ""
        args.out = str(ROOT / "benchmarks" / "results" / f"scheduler_overhead{suffix}.json")
    variants = VARIANTS + ([("Scheduler (no placeholders)", "plain", {})]
                           if args.async_scheduling else [])
    if args.variants:
        wanted = {"stock", *(v.strip() for v in args.variants.split(";"))}
        unknown = wanted - {name for name, _, _ in variants}
        if unknown:
            p.error(f"unknown variants: {', '.join(sorted(unknown))}")
        variants = [v for v in variants if v[0] in wanted]

    import logging

    logging.getLogger("vllm_admission").setLevel(logging.WARNING)
    from vllm_admission_testing.harness import make_vllm_config, write_config_only_model

    t0 = time.perf_counter()
    trace_name, workload = load_workload(args.requests, args.trace)
    model_dir = write_config_only_model(tempfile.mkdtemp(prefix="tiny_config_"))
    vllm_config = make_vllm_config(model_dir, block_size=args.block_size,
                                   max_num_batched_tokens=8192, max_model_len=131072,
                                   async_scheduling=args.async_scheduling)
    block_size = vllm_config.cache_config.block_size
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    # One untimed warm-up of each variant (imports, allocator, caches).
    for _name, kind, env in variants:
        run_once(kind, env, workload[: max(4, len(workload) // 6)], vllm_config=vllm_config,
                 num_blocks=args.blocks, concurrency=args.concurrency)
    for rep in range(args.reps):
        order = variants if rep % 2 == 0 else variants[::-1]
        for name, kind, env in order:
            r = run_once(kind, env, workload, vllm_config=vllm_config, num_blocks=args.blocks,
                         concurrency=args.concurrency)
            runs[name].append(r)
            print(f"rep {rep + 1}/{args.reps} {name:34s} wall {r['seconds']:.3f} s, "
                  f"cpu {r['cpu_seconds']:.3f} s ({r['steps']} steps, "
                  f"hit rate {r['token_hit_rate']:.3f})", flush=True)
    base = {k: statistics.median(r[k] for r in runs["stock"]) for k in ("seconds", "cpu_seconds")}
    base_min = {k: min(r[k] for r in runs["stock"]) for k in ("seconds", "cpu_seconds")}
    rows = []
    for name, _, _ in variants:
        secs = [r["seconds"] for r in runs[name]]
        cpu = [r["cpu_seconds"] for r in runs[name]]
        med, cmed = statistics.median(secs), statistics.median(cpu)
        # Each repetition runs every variant back to back: the ratio to the stock run of the
        # same repetition cancels most of the drift of a shared machine.
        paired = [r["cpu_seconds"] / s["cpu_seconds"] for r, s in zip(runs[name], runs["stock"], strict=True)]
        paired_wall = [r["seconds"] / s["seconds"] for r, s in zip(runs[name], runs["stock"], strict=True)]
        rows.append({
            "variant": name, "median_seconds": med, "median_cpu_seconds": cmed,
            "all_seconds": secs, "all_cpu_seconds": cpu,
            "ratio_vs_stock": med / base["seconds"],
            "cpu_ratio_vs_stock": cmed / base["cpu_seconds"],
            "paired_cpu_ratio_vs_stock": statistics.median(paired),
            "paired_cpu_ratios": paired,
            "paired_wall_ratio_vs_stock": statistics.median(paired_wall),
            "best_of_ratio_vs_stock": min(secs) / base_min["seconds"],
            "target": TARGETS.get(name),
            "steps": runs[name][0]["steps"], "forward_passes": runs[name][0]["forward_passes"],
            "steps_ratio_vs_stock": runs[name][0]["steps"] / runs["stock"][0]["steps"],
            "token_hit_rate": runs[name][0]["token_hit_rate"],
            "evictions": runs[name][0].get("evictions"), "alpha": runs[name][-1].get("alpha"),
            "tuning_events": runs[name][-1].get("tuning_events"),
            "policy_switches": runs[name][-1].get("policy_switches"),
            "learned_trainings": runs[name][-1].get("learned_trainings"),
            "per_step_us": 1e6 * med / runs[name][0]["steps"],
        })
    print()
    print(f"{'variant':34s} {'wall s':>7s} {'us/step':>8s} {'ratio':>6s} {'cpu ratio':>9s} "
          f"{'paired':>6s} {'p. wall':>7s} {'best-of':>7s} {'target':>7s} {'hit rate':>8s} "
          f"{'evictions':>9s} {'steps':>6s} {'passes':>6s}")
    for row in rows:
        target = f"<={row['target']:.2f}" if row["target"] else ""
        ev = "" if row["evictions"] is None else str(row["evictions"])
        print(f"{row['variant']:34s} {row['median_seconds']:7.3f} {row['per_step_us']:8.1f} "
              f"{row['ratio_vs_stock']:6.3f} {row['cpu_ratio_vs_stock']:9.3f} "
              f"{row['paired_cpu_ratio_vs_stock']:6.3f} {row['paired_wall_ratio_vs_stock']:7.3f} "
              f"{row['best_of_ratio_vs_stock']:7.3f} "
              f"{target:>7s} {row['token_hit_rate']:8.3f} {ev:>9s} {row['steps']:6d} "
              f"{row['forward_passes']:6d}")
    doc = {
        "what": "schedule() + update_from_output() seconds over one workload, median of "
                "interleaved repetitions; no model runs (FakeEngine)",
        "trace": trace_name, "requests": len(workload), "concurrency": args.concurrency,
        "num_blocks": args.blocks, "block_size": block_size, "reps": args.reps,
        "async_scheduling": args.async_scheduling,
        "groups": ["state", "attention"], "max_num_batched_tokens": 8192,
        "python": platform.python_version(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(), "rows": rows,
        "wall_seconds": time.perf_counter() - t0,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {out} ({doc['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
