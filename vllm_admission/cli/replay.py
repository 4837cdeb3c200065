"""``vllm-admission replay``: a trace through a real vLLM engine running the plugin.

Requests are sent one at a time, in trace order (each finishes before the next
is submitted), through ``vllm_admission.engine.llm_replay.replay`` with greedy
sampling and exactly ``output_len`` tokens each. Mooncake traces are re-blocked
by the trace model: ``Request.token_ids(vocab_size)`` yields token ids whose
block structure matches the trace at the engine's block size.

Writes ``<out>/results.json``:

* ``requests``: per request ``request_id``, ``prompt_tokens``, ``output_len``,
  ``cached_tokens`` (``RequestOutput.num_cached_tokens``; ``null`` if skipped),
  ``prefill_steps`` (engine steps that scheduled its prompt tokens: its prefill
  chunks; ``null`` if skipped) and ``status``;
* totals ``prompt_tokens``, ``hit_tokens``, ``token_hit_rate``, ``prefill_steps``,
  ``wall_seconds``, ``skipped`` (reason -> count, the trace loader's filters
  included) and ``mode``;
* the engine's ``geometry``, vLLM's prefix-cache counters over the replay and
  the plugin's :class:`~vllm_admission.plugin.metrics.stats.AdmissionStats`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from vllm_admission.cli import options
from vllm_admission.core.adaptive import AUTO
from vllm_admission.core.admission import (
    UnknownPolicyError,
    get_admission,
)
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import engine_eviction_policies
from vllm_admission.core.settings import Settings

__all__ = ["add_replay_parser", "run_replay"]


def add_replay_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` subcommand to an ``argparse`` subparsers object."""
    p = sub.add_parser(
        "replay", help="replay a trace through a real vLLM engine with the AdmissionScheduler",
        description="Replay a trace through vLLM with the AdmissionScheduler, one request at a "
                    "time in trace order, and write <out>/results.json.")
    options.add_model_trace_policy_args(p, "one of")
    options.add_policy_tuning_args(p, auto_interval=False)
    p.add_argument("--num-gpu-blocks", type=int, default=None,
                   help="KV block pool size (vLLM's num_gpu_blocks_override; default: from memory)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output (default: the model's, lowered to what "
                        "--num-gpu-blocks can hold)")
    options.add_request_limit_args(p, max_prompt_tokens=False)
    options.add_engine_args(p)
    p.add_argument("--seed", type=int, default=0, help="synthetic workload seed (default 0)")
    p.add_argument("--out", required=True, help="output directory for results.json")
    return p


def _check_args(args: argparse.Namespace) -> tuple[dict[str, Any], Settings]:
    """Check every option before anything loads; returns vLLM's engine arguments and the
    plugin's settings."""
    if args.admission != AUTO:
        get_admission(args.admission)
    if args.eviction not in engine_eviction_policies() and args.eviction != AUTO:
        raise UnknownPolicyError(f"eviction policy {args.eviction!r} cannot run in an engine; "
                                 f"valid: {', '.join([*engine_eviction_policies(), AUTO])}")
    policy = dataclasses.replace(Settings.from_args(args), admission=args.admission,
                                 eviction=args.eviction)
    for name in ("num_gpu_blocks", "max_model_len", "max_requests", "max_output_len",
                 "mooncake_block_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not Path(args.model).is_dir():
        raise UserError(f"--model {args.model}: not a directory")
    options.host_settings(args, policy.host_admission)
    return options.engine_args_from(args), policy


def _build(args: argparse.Namespace, engine_args: dict[str, Any], policy: Settings) -> Any:
    from vllm_admission.engine.llm import build_llm_fitting, plugin_settings

    settings = plugin_settings(args.model, policy,
                               num_gpu_blocks=args.num_gpu_blocks,
                               max_model_len=args.max_model_len, seed=args.seed)
    settings.mamba_ssm_cache_dtype = args.mamba_ssm_cache_dtype
    settings.engine_args = engine_args
    llm, note = build_llm_fitting(settings)
    if note:
        print(f"vllm-admission: {note}")
    return llm


def run_replay(args: argparse.Namespace) -> int:
    """Handler of ``vllm-admission replay``; returns the exit status.

    Raises:
        UserError (UnknownPolicyError, TraceError, ...), FileNotFoundError,
            PermissionError: bad input (the CLI prints them as one
            ``vllm-admission: error:`` line).
    """
    engine_args, policy = _check_args(args)
    from vllm_admission.core.traces import load_trace
    from vllm_admission.sim.report import check_writable

    trace = load_trace(args.trace, max_requests=args.max_requests, seed=args.seed,
                       mooncake_block_tokens=args.mooncake_block_tokens
                       ).with_max_output_len(args.max_output_len)
    out_dir = Path(args.out)
    check_writable(out_dir)  # a bad --out is one error line, before the engine starts

    from vllm_admission.engine.llm import engine_geometry, shutdown_llm
    from vllm_admission.engine.llm_replay import replay

    llm = _build(args, engine_args, policy)
    try:
        vocab = int(llm.llm_engine.vllm_config.model_config.get_vocab_size())
        geometry = engine_geometry(llm)
        result = replay(llm, trace.requests, vocab_size=vocab)
        stats: dict[str, Any] | None = None
        try:
            from vllm_admission.plugin.scheduler import admission_stats

            stats = admission_stats(llm).to_dict()
        except RuntimeError:
            stats = None
    finally:
        # Tear the engine down now, not whenever the garbage collector gets to it: an
        # in-process engine core also tears down process-wide distributed state.
        shutdown_llm(llm)
        del llm
    skipped = dict(trace.skipped)
    for reason, n in result.skipped.items():
        skipped[reason] = skipped.get(reason, 0) + n
    doc = {
        "mode": result.mode,
        "model": str(args.model),
        "trace": str(args.trace),
        "admission": args.admission,
        "eviction": args.eviction,
        "alpha": policy.alpha,
        "engine_args": engine_args,
        "host_admission": policy.host_admission,
        "geometry": geometry.to_dict(),
        "requests": [{k: r[k] for k in ("request_id", "prompt_tokens", "output_len",
                                         "cached_tokens", "prefill_steps", "status")}
                     for r in result.requests],
        "requests_run": sum(1 for r in result.requests if r["status"] == "ok"),
        "prompt_tokens": result.prompt_tokens,
        "hit_tokens": result.hit_tokens,
        "token_hit_rate": result.token_hit_rate,
        "prefill_steps": result.prefill_steps,
        "wall_seconds": result.wall_seconds,
        "skipped": skipped,
        "engine_prefix_cache_hits": result.engine_prefix_cache_hits,
        "engine_prefix_cache_queries": result.engine_prefix_cache_queries,
        "admission_stats": stats,
    }
    path = out_dir / "results.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    n_skipped = sum(skipped.values())
    print(f"mode: {result.mode}")
    print(f"admission={args.admission} eviction={args.eviction} "
          f"blocks={geometry.num_gpu_blocks} block_size={geometry.block_size}")
    print(f"requests: {doc['requests_run']} run, {n_skipped} skipped"
          + (f" ({', '.join(f'{k}: {v}' for k, v in skipped.items())})" if skipped else ""))
    print(f"hit tokens: {result.hit_tokens} of {result.prompt_tokens} prompt tokens "
          f"(token hit rate {result.token_hit_rate:.4f}); prefill steps "
          f"{result.prefill_steps}; {result.wall_seconds:.1f} s")
    print(f"wrote {path}")
    return 0
