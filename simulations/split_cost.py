"""What vLLM's checkpoint chunk splits cost in prefill time on the CPU engine (docs/checkpoints.md).

With prefix caching on, vLLM 0.32 runs hybrid models in ``align`` mode and ends a prefill
chunk at every position whose recurrent state it keeps: the prompt checkpoint
``floor((P - 1) / B) * B`` and a junction (docs/engine-facts.md rule 6). With prefix caching
off there is no such stop; a prompt is cut only by the token budget. This script replays the
same requests through both engines, one request at a time, and records per request the
engine steps that scheduled prompt tokens (``prefill_steps``, counted in the live scheduler)
and the prefill seconds (vLLM's ``first_token_ts - scheduled_ts``):

* ``on``: prefix caching on, the ``AdmissionScheduler`` with ``vllm`` + ``lru`` (stock
  behaviour), a fresh engine (empty cache) per replay;
* ``off``: prefix caching off, stock scheduler: no splits, no hits;
* ``off-split``: prefix caching off, but the scheduler's own chunk split forced on
  (``Scheduler.need_mamba_block_aligned_split = True``): chunks end at each prompt's
  checkpoint as with caching on, nothing is cached, nothing hits. Against ``off`` this is
  the cost of the extra forward passes alone, without align mode's state copies or the
  block hashing of prefix caching.

Workloads: ``junction`` (tests/junction_case.py), ``synthetic`` (simulations/engine_study.py's
SHARED_PROMPTS, 100 requests), ``mooncake`` (first 100 requests of the Mooncake conversation
trace at 128 tokens per trace block) and ``unique``: prompts of random tokens that share
nothing, so no request can hit and both engines compute the same tokens; only the number of
steps differs (caching on still ends a chunk at each prompt's checkpoint, whose state it
keeps). ``unique`` isolates the cost of the splits; the others add the hits' savings.

Configurations alternate (their order rotates from one repeat to the next) within one
process; every replay starts a new engine and first runs one short unrelated warm-up request. Each workload's table row
gives medians over the repeats.

Usage: ``python simulations/split_cost.py [NAME ...] [--repeats N] [--model DIR] [--out DIR]``.
Writes ``<out>/split-cost.json`` (merged with the workloads already there) and prints a table.
Needs vLLM; on a 2-core CPU machine ``junction`` and ``unique`` take a few minutes, ``synthetic``
about 5 and ``mooncake`` about 10 per repeat.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "simulations"))

from engine_study import MOONCAKE, SHARED_PROMPTS  # noqa: E402
from junction_case import junction_prompts  # noqa: E402

CONFIGS = ("on", "off", "off-split")
#: Prompt lengths of the ``unique`` workload (tokens), each sent ``UNIQUE_PER_LENGTH`` times
#: with fresh random tokens: below one block's split, typical chats, and one past the
#: 4,096-token budget (three chunks with caching on, two without).
UNIQUE_LENGTHS = (300, 1000, 1801, 3000, 5000)
UNIQUE_PER_LENGTH = 4
DEFAULT_REPEATS = {"junction": 5, "unique": 5, "synthetic": 2, "mooncake": 1}


@dataclasses.dataclass(frozen=True)
class TokenRequest:
    """A request given by its token ids (what :func:`vllm_admission.engine.llm_replay.replay` needs)."""

    request_id: str
    ids: tuple[int, ...]
    output_len: int
    arrival_s: float | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.ids)

    def token_ids(self, vocab_size: int) -> list[int]:
        return list(self.ids)


def _random_tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]  # the tiny model's vocabulary is 512


def workload(name: str, output_len: int) -> list[Any]:
    """The requests of workload ``name`` (see the module docstring), ``output_len`` tokens each.

    Raises:
        ValueError: unknown name.
    """
    from vllm_admission.core.traces import load_trace

    if name == "junction":
        return [TokenRequest(f"j{i}", tuple(p), output_len)
                for i, p in enumerate(junction_prompts(_random_tokens))]
    if name == "unique":
        out = []
        for k in range(UNIQUE_PER_LENGTH):
            for n in UNIQUE_LENGTHS:
                out.append(TokenRequest(f"u{n}-{k}", tuple(_random_tokens(1000 * n + k, n)),
                                        output_len))
        return out
    if name == "synthetic":
        trace = load_trace("synthetic", seed=0, **SHARED_PROMPTS)
    elif name == "mooncake":
        trace = load_trace(str(MOONCAKE), max_requests=100, mooncake_block_tokens=128)
    else:
        raise ValueError(f"unknown workload {name!r}; known: junction, unique, synthetic, mooncake")
    return [dataclasses.replace(r, output_len=min(r.output_len, output_len)) for r in trace.requests]


def _settings(config: str, model: str) -> Any:
    from vllm_admission.engine.llm import EngineSettings, plugin_settings

    if config == "on":
        settings = plugin_settings(model, admission="vllm", eviction="lru")
    elif config in ("off", "off-split"):
        settings = EngineSettings(model=model, enable_prefix_caching=False)
    else:
        raise ValueError(f"unknown configuration {config!r}; known: {', '.join(CONFIGS)}")
    settings.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the step counter reads the scheduler
    return settings


def replay_once(config: str, model: str, requests: list[Any]) -> dict[str, Any]:
    """One fresh engine of ``config`` (one of :data:`CONFIGS`), one warm-up request, then ``requests``.

    Returns ``geometry`` (:func:`~vllm_admission.engine.llm.engine_geometry`, the
    ``mamba_cache_mode`` included), ``build_s`` and per request ``prompt_tokens``,
    ``cached_tokens``, ``prefill_steps`` and ``prefill_seconds``.
    """
    from vllm_admission.engine.llm import (
        build_llm,
        engine_geometry,
        inprocess_scheduler,
        shutdown_llm,
    )
    from vllm_admission.engine.llm_replay import replay

    t0 = time.perf_counter()
    llm = build_llm(_settings(config, model))
    build_s = time.perf_counter() - t0
    if config == "off-split":
        # vLLM's own split (v1/core/sched/scheduler.py _mamba_block_aligned_split), which
        # only align mode turns on; without hits or a junction it stops at the checkpoint.
        inprocess_scheduler(llm).need_mamba_block_aligned_split = True
    try:
        vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
        replay(llm, [TokenRequest("warm-up", tuple(_random_tokens(99, 200)), 2)], vocab_size=vocab)
        llm.reset_prefix_cache()
        geometry = engine_geometry(llm)
        result = replay(llm, requests, vocab_size=vocab)
    finally:
        shutdown_llm(llm)
        del llm
        gc.collect()
    if result.skipped:
        raise RuntimeError(f"{config}: requests skipped: {result.skipped}")
    rows = [{k: r[k] for k in ("prompt_tokens", "cached_tokens", "prefill_steps",
                               "prefill_seconds")} for r in result.requests]
    return {"geometry": {k: getattr(geometry, k) for k in ("block_size", "num_gpu_blocks",
                                                           "max_num_batched_tokens", "mamba_cache_mode",
                                                           "ssm_state_dtype")},
            "build_s": build_s, "requests": rows}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over repeats, per configuration, and each configuration against ``off``.

    Per configuration: ``requests``, ``prompt_tokens``, ``hit_tokens``,
    ``prefill_steps`` (total; identical in every repeat, checked),
    ``steps_per_request``, ``prefill_seconds`` (median over repeats of the
    total, seconds), ``seconds_per_request``, ``seconds_per_repeat`` (every
    repeat's total). ``on`` and ``off-split`` also get ``vs_off``:
    ``seconds_ratio`` (median over median of ``off``),
    ``seconds_ratio_per_repeat`` (within each repeat), ``extra_steps``
    (steps minus ``off``'s), ``cost_fraction`` (``(this - off) / this``: the
    part of this configuration's prefill seconds that ``off`` does not spend;
    the splits' cost where both computed the same tokens) and
    ``seconds_per_extra_step`` (``None`` without extra steps).

    Raises:
        RuntimeError: a configuration's step counts or hits differ between repeats.
    """
    out: dict[str, Any] = {}
    for config, reps in runs.items():
        steps = {tuple(r["prefill_steps"] for r in rep["requests"]) for rep in reps}
        hits = {tuple(r["cached_tokens"] for r in rep["requests"]) for rep in reps}
        if len(steps) != 1 or len(hits) != 1:
            raise RuntimeError(f"{config}: prefill steps or hits differ between repeats")
        rows = reps[0]["requests"]
        totals = [sum(r["prefill_seconds"] for r in rep["requests"]) for rep in reps]
        n = len(rows)
        out[config] = {
            "requests": n,
            "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
            "hit_tokens": sum(r["cached_tokens"] for r in rows),
            "prefill_steps": sum(r["prefill_steps"] for r in rows),
            "steps_per_request": sum(r["prefill_steps"] for r in rows) / n,
            "prefill_seconds": statistics.median(totals),
            "seconds_per_request": statistics.median(totals) / n,
            "seconds_per_repeat": totals,
        }
    off = out.get("off")
    for config in ("on", "off-split"):
        this = out.get(config)
        if this is None or off is None:
            continue
        extra = this["prefill_steps"] - off["prefill_steps"]
        delta = this["prefill_seconds"] - off["prefill_seconds"]
        this["vs_off"] = {
            "seconds_ratio": this["prefill_seconds"] / off["prefill_seconds"],
            "seconds_ratio_per_repeat": [a / b for a, b in zip(this["seconds_per_repeat"],
                                                               off["seconds_per_repeat"], strict=True)],
            "extra_steps": extra,
            "cost_fraction": delta / this["prefill_seconds"],
            "seconds_per_extra_step": delta / extra if extra else None,
        }
    return out


def predicted_steps(requests: list[Any], model: str, geometry: dict[str, Any],
                    vocab_size: int = 512) -> list[int]:
    """The core model's prefill steps for ``requests`` served one at a time by ``vllm`` + ``lru``.

    The cache is built like the ``on`` engine reported in ``geometry`` (block size, pool,
    token budget, SSM state dtype); block hashes chain the token ids the engine was sent
    (``token_ids(vocab_size)``), as vLLM's do.

    Raises:
        ModelConfigError: unreadable ``model/config.json``.
    """
    from vllm_admission.core.admission import get_admission
    from vllm_admission.core.cache import HybridPrefixCache
    from vllm_admission.core.costs import ModelCosts
    from vllm_admission.core.eviction import get_eviction
    from vllm_admission.core.geometry import geometry_from_blocks
    from vllm_admission.core.layout import CacheLayout, PoolSpec, SchedulingSpec
    from vllm_admission.sim.simulator import group_kinds

    B, nb = int(geometry["block_size"]), int(geometry["num_gpu_blocks"])  # noqa: N806
    costs = ModelCosts.from_config(Path(model) / "config.json",
                                   mamba_ssm_cache_dtype=geometry.get("ssm_state_dtype") or "auto")
    layout = CacheLayout(PoolSpec(num_blocks=nb, block_size=B,
                                  group_kinds=group_kinds(costs, geometry_from_blocks(costs, nb, B))),
                         SchedulingSpec(chunk_size=int(geometry["max_num_batched_tokens"])))
    cache = HybridPrefixCache(layout, admission=get_admission("vllm"), eviction=get_eviction("lru"))
    steps = []
    for r, req in enumerate(requests):
        ids = req.token_ids(vocab_size)
        hashes, h = [], 0
        for i in range(len(ids) // B):
            h = hash((h, tuple(ids[i * B:(i + 1) * B])))
            hashes.append(h)
        steps.append(cache.serve(hashes, len(ids), req.output_len, rid=r, now=float(r)).prefill_steps)
    return steps


def add_prediction(record: dict[str, Any], model: str) -> None:
    """Put the simulator's prefill steps for the ``on`` runs into ``record["summary"]["on"]``:
    ``simulator_prefill_steps`` (total) and ``simulator_steps_differing`` (requests whose
    count differs from the engine's)."""
    run = record["runs"]["on"][0]
    requests = workload(record["workload"], record["output_len"])
    sim = predicted_steps(requests, model, run["geometry"])
    engine = [r["prefill_steps"] for r in run["requests"]]
    on = record["summary"]["on"]
    on["simulator_prefill_steps"] = sum(sim)
    on["simulator_steps_differing"] = sum(a != b for a, b in zip(engine, sim, strict=True))


def run_workload(name: str, model: str, repeats: int, output_len: int) -> dict[str, Any]:
    """Alternate the configurations ``repeats`` times on workload ``name``; the JSON record."""
    requests = workload(name, output_len)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    for rep in range(repeats):
        k = rep % len(CONFIGS)
        for config in CONFIGS[k:] + CONFIGS[:k]:
            run = replay_once(config, model, requests)
            runs[config].append(run)
            total = sum(r["prefill_seconds"] for r in run["requests"])
            steps = sum(r["prefill_steps"] for r in run["requests"])
            print(f"[{name}] repeat {rep + 1}/{repeats} {config:>9}: {steps} prefill steps, "
                  f"{total:.2f} prefill s (engine built in {run['build_s']:.1f} s)", flush=True)
    record = {"workload": name, "repeats": repeats, "output_len": output_len,
              "summary": summarise(runs), "runs": runs}
    add_prediction(record, model)
    return record


def table(records: dict[str, dict[str, Any]]) -> str:
    """The markdown table of docs/checkpoints.md from the workload records."""
    lines = ["| workload | requests | prompt tokens | hit tokens (on) | prefill steps per request, "
             "on / off / off-split | simulator's steps (on) | prefill s per request, "
             "on / off / off-split | on / off | "
             "off-split / off | split cost (% of off-split) | ms per extra step | repeats |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rec in records.items():
        s = rec["summary"]
        on, off, split = s["on"], s["off"], s["off-split"]
        per_step = split["vs_off"]["seconds_per_extra_step"]
        lines.append(
            f"| {name} | {on['requests']} | {on['prompt_tokens']:,} | {on['hit_tokens']:,} | "
            f"{on['steps_per_request']:.2f} / {off['steps_per_request']:.2f} / "
            f"{split['steps_per_request']:.2f} | {_predicted(on)} | "
            f"{on['seconds_per_request']:.3f} / {off['seconds_per_request']:.3f} / "
            f"{split['seconds_per_request']:.3f} | {on['vs_off']['seconds_ratio']:.3f} | "
            f"{split['vs_off']['seconds_ratio']:.3f} | "
            f"{100 * split['vs_off']['cost_fraction']:.1f} | "
            f"{'-' if per_step is None else f'{1000 * per_step:.1f}'} | {rec['repeats']} |")
    return "\n".join(lines)


def by_length(record: dict[str, Any]) -> str:
    """Markdown table: per prompt length, prefill steps and median prefill milliseconds per
    request in each configuration (medians over the requests of that length and the repeats)."""
    lengths = sorted({r["prompt_tokens"] for r in record["runs"]["on"][0]["requests"]})
    lines = ["| prompt tokens | steps, on / off / off-split | prefill ms, on / off / off-split | "
             "off-split / off |", "|---|---|---|---|"]
    for n in lengths:
        steps, ms = [], []
        for config in CONFIGS:
            reps = record["runs"][config]
            rows = [r for rep in reps for r in rep["requests"] if r["prompt_tokens"] == n]
            steps.append(statistics.median(r["prefill_steps"] for r in rows))
            ms.append(1000 * statistics.median(r["prefill_seconds"] for r in rows))
        lines.append(f"| {n:,} | {' / '.join(f'{x:g}' for x in steps)} | "
                     f"{' / '.join(f'{x:.1f}' for x in ms)} | {ms[2] / ms[1]:.3f} |")
    return "\n".join(lines)


def _predicted(on: dict[str, Any]) -> str:
    if "simulator_prefill_steps" not in on:
        return "-"
    return (f"{on['simulator_prefill_steps']:,} of {on['prefill_steps']:,} "
            f"({on['simulator_steps_differing']} requests differ)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="workloads (default: junction unique synthetic "
                                                 "mooncake)")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"on/off pairs per workload (default: {DEFAULT_REPEATS})")
    parser.add_argument("--max-output-len", type=int, default=4,
                        help="output tokens per request (default 4; prefill time does not "
                             "depend on it)")
    parser.add_argument("--model", default=str(ROOT / "out" / "tiny-model"),
                        help="tiny model directory (made if missing)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "split-cost"))
    parser.add_argument("--table", action="store_true",
                        help="only print the table from the JSON already written")
    parser.add_argument("--predict", action="store_true",
                        help="only (re)compute the simulator's prefill steps for the runs "
                             "already written, then print the table")
    args = parser.parse_args(argv)
    path = Path(args.out) / "split-cost.json"
    records: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
    if args.predict:
        for record in records.values():
            add_prediction(record, args.model)
        path.write_text(json.dumps(records, indent=1) + "\n")
    if args.table or args.predict:
        print(table(records))
        if "unique" in records:
            print(by_length(records["unique"]))
        return 0
    names = args.names or list(DEFAULT_REPEATS)
    unknown = [n for n in names if n not in DEFAULT_REPEATS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(DEFAULT_REPEATS)}")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not (Path(args.model) / "config.json").exists():
        from vllm_admission.engine.tiny_model import make_tiny_model

        make_tiny_model(args.model)
    for name in names:
        repeats = args.repeats or DEFAULT_REPEATS[name]
        records[name] = run_workload(name, args.model, repeats, args.max_output_len)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records, indent=1) + "\n")
        print(f"wrote {path}", flush=True)
    print(table(records))
    if "unique" in records:
        print(by_length(records["unique"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
