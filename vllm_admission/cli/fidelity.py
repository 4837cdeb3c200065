"""``vllm-admission fidelity``: the same requests through the engine and the simulator."""

from __future__ import annotations

import argparse
import sys

from vllm_admission.cli import options
from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.errors import UserError
from vllm_admission.core.settings import Settings, add_flags

__all__ = ["add_fidelity_parser", "run_fidelity_cli"]


def add_fidelity_parser(sub) -> None:
    """Add the ``fidelity`` subcommand to an ``argparse`` subparsers object."""
    p = sub.add_parser(
        "fidelity", help="replay a trace through the real engine and the simulator; compare "
                         "per-request prefix hits",
        description="For every policy pair (and pool size), replay the same requests through vLLM "
                    "with the AdmissionScheduler and through the simulator configured from that "
                    "engine; write <out>/fidelity.json and <out>/fidelity.png.")
    options.add_model_trace_policy_args(p, "comma list of")
    p.add_argument("--num-gpu-blocks", default=None,
                   help="comma list of KV block pool sizes (vLLM's num_gpu_blocks_override); "
                        "default: sized from memory (8,192 blocks on CPU with 1 GiB)")
    options.add_request_limit_args(p, max_prompt_tokens=True,
                                   mooncake_note=" and maps one hash id to one 128-token engine block")
    p.add_argument("--synthetic", action="append", default=[], metavar="KEY=VALUE",
                   help="a synthetic workload parameter (repeatable), e.g. num_requests=100 or "
                        "system_prompt_len=[600,0.5,200,1500]; values are JSON")
    p.add_argument("--mode", choices=("sequential", "timed"), default="sequential",
                   help="'sequential' (default): one request at a time; 'timed': submit at the "
                        "trace's arrival times x --time-scale, so requests overlap")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="timed mode: multiply arrival times by this (default 1)")
    options.add_policy_tuning_args(p, auto_interval=True)
    p.add_argument("--seed", type=int, default=0, help="synthetic workload and engine seed")
    add_flags(p, ["checkpoint"])
    options.add_engine_args(p)
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless every sequential record meets the fidelity bar: exact per "
                        "request for lru with none/last/vllm/dense, within 1%% of prompt tokens "
                        "for marconi and for the other evictions")
    p.add_argument("--out", required=True, help="output directory")


def _without_offload(engine_args: dict, args) -> dict:
    """The engine arguments less the connector ``--offload`` stands for (the spec
    carries the host tier as ``offload``)."""
    if options.offload_bytes(args) is not None:
        engine_args = {k: v for k, v in engine_args.items() if k != "kv_transfer_config"}
    return engine_args


def _synthetic_params(items: list[str]) -> dict:
    import json

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--synthetic {item!r}: expected KEY=VALUE")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            raise UserError(f"--synthetic {item!r}: the value is not JSON "
                            f"(numbers as 3 or 0.5, lists as [600,0.5,200,1500])") from None
    return params


def run_fidelity_cli(args: argparse.Namespace) -> int:
    """Run the comparison; print and write it; with ``--check``, exit 1 on a missed bar."""
    from vllm_admission.cli.options import parse_list
    from vllm_admission.core.eviction import engine_eviction_policies
    from vllm_admission.fidelity import (
        FidelitySpec,
        format_fidelity,
        meets_bar,
        run_fidelity,
        write_fidelity,
    )
    from vllm_admission.sim.report import check_writable

    blocks: tuple = (None,)
    if args.num_gpu_blocks is not None:
        try:
            blocks = tuple(int(b) for b in args.num_gpu_blocks.split(",") if b.strip())
        except ValueError:
            raise UserError(f"--num-gpu-blocks {args.num_gpu_blocks!r}: expected a comma list "
                            f"of integers") from None
    for name in ("max_requests", "max_prompt_tokens", "max_output_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    policy = Settings.from_args(args)
    host_policy = options.host_settings(args, policy.host_admission)
    spec = FidelitySpec(
        model=args.model, trace=args.trace,
        admissions=parse_list(args.admission, "admission policy", [*ADMISSION_POLICIES, "auto"]),
        evictions=parse_list(args.eviction, "eviction policy", [*engine_eviction_policies(), "auto"]),
        num_gpu_blocks=blocks, max_requests=args.max_requests,
        max_prompt_tokens=args.max_prompt_tokens, max_output_len=args.max_output_len,
        mooncake_block_tokens=args.mooncake_block_tokens,
        synthetic=_synthetic_params(args.synthetic), mode=args.mode, time_scale=args.time_scale,
        alpha=policy.alpha, auto_interval=policy.auto.interval, seed=args.seed,
        checkpoint=policy.checkpoint, mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype,
        engine_args=_without_offload(options.engine_args_from(args), args),
        offload=options.offload_bytes(args), host_policy=host_policy or "lru",
        host_admission=policy.host_admission)

    def progress(rec: dict) -> None:
        print(f"{rec['admission']}+{rec['eviction']} at {rec['num_blocks']} blocks: "
              f"{rec['requests_differing']} of {rec['requests']} requests differ "
              f"({100 * rec['abs_diff_fraction']:.3f}% of prompt tokens); engine hit rate "
              f"{100 * rec['engine']['token_hit_rate']:.2f}%", flush=True)

    spec.check()  # run_fidelity checks it too; here, so that bad input leaves no --out
    check_writable(args.out)  # a bad --out is one error line, before any engine starts
    doc = run_fidelity(spec, on_record=progress)
    print(format_fidelity(doc))
    js, png = write_fidelity(doc, args.out)
    print(f"wrote {js} and {png}")
    if args.check:
        failed = [r for r in doc["records"] if not meets_bar(r)]
        for r in failed:
            print(f"vllm-admission: fidelity bar missed: {r['admission']}+{r['eviction']} at "
                  f"{r['num_blocks']} blocks ({r['requests_differing']} requests differ, "
                  f"{100 * r['abs_diff_fraction']:.3f}% of prompt tokens)", file=sys.stderr)
        return 1 if failed else 0
    return 0


