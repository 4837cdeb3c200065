"""The ``vllm-admission`` command line.

Subcommands:

* ``simulate``: trace-replay sweeps over policies and capacities;
* ``demo``: ``simulate`` on the built-in synthetic workload and model;
* ``make-tiny-model`` / ``replay``: the real vLLM engine side (need vLLM);
* ``fidelity``: the same requests through the engine and the simulator,
  compared request by request (needs vLLM).

Bad input (unknown policy, impossible capacity, malformed trace, non-hybrid
model) ends with one ``vllm-admission: error: ...`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from vllm_admission.core.admission import ADMISSION_POLICIES, UnknownPolicyError
from vllm_admission.core.costs import ModelConfigError
from vllm_admission.core.eviction import EVICTION_POLICIES
from vllm_admission.core.geometry import CapacityError, parse_bytes
from vllm_admission.core.traces import TraceError

log = logging.getLogger("vllm_admission")

#: The demo's defaults: the built-in synthetic workload on Qwen3-Next.
DEMO_MODEL = "qwen3-next-80b-a3b"
DEMO_CAPACITIES = "2GiB,4GiB,8GiB,16GiB"
DEMO_ADMISSIONS = "last,vllm,marconi,dense"
DEMO_EVICTIONS = "lru,flop"

#: Values of ``--mamba-ssm-cache-dtype`` (vLLM 0.32 ``MambaDType``, vllm/config/cache.py).
MAMBA_SSM_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")

USER_ERRORS = (UnknownPolicyError, ModelConfigError, CapacityError, TraceError, ValueError, OSError)


def _add_simulate_args(p: argparse.ArgumentParser, *, demo: bool) -> None:
    p.add_argument("--trace", default="synthetic",
                   help="a Mooncake or token JSONL file, or 'synthetic' (default)")
    p.add_argument("--model", default=DEMO_MODEL,
                   help=f"a Hugging Face config.json, or a built-in name (default {DEMO_MODEL})")
    p.add_argument("--capacity", default=DEMO_CAPACITIES,
                   help="comma list of KV cache sizes, e.g. 4GiB,16GiB "
                        f"(default {DEMO_CAPACITIES})")
    p.add_argument("--admission", default=DEMO_ADMISSIONS,
                   help=f"comma list of: {', '.join(ADMISSION_POLICIES)} (default {DEMO_ADMISSIONS})")
    p.add_argument("--eviction", default=DEMO_EVICTIONS,
                   help=f"comma list of: {', '.join(EVICTION_POLICIES)} (default {DEMO_EVICTIONS})")
    p.add_argument("--mamba-ssm-cache-dtype", choices=MAMBA_SSM_CACHE_DTYPES, default="auto",
                   help="dtype of the recurrent (SSM / GDN) state, as vLLM's flag of that name: "
                        "'auto' (default) resolves per model as vLLM does on a GPU; vLLM's CPU "
                        "platform uses float32 on CPUs with AVX-512 BF16. A float32 state doubles "
                        "the state page and so raises the block size")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="prefill tokens per step, vLLM's max_num_batched_tokens (default 8192)")
    p.add_argument("--alpha", type=float, default=None,
                   help="fix flop eviction's alpha instead of tuning it online")
    p.add_argument("--tune-grid", choices=("coarse", "paper"), default="coarse",
                   help="alphas flop eviction tries on its bootstrap window: 'coarse' "
                        "(0, 0.1, 0.2, 0.5, 1, 2; default) or Marconi's 'paper' grid (0 to 2 by 0.1)")
    p.add_argument("--max-requests", type=int, default=None,
                   help="replay only the first K requests (the rest are counted as skipped)")
    p.add_argument("--seed", type=int, default=0, help="synthetic workload seed (default 0)")
    p.add_argument("--outputs", choices=("trace", "unique"), default="trace",
                   help="hash output blocks as the trace's later turns see them ('trace', "
                        "default; needs a trace that records outputs, like the synthetic one) or "
                        "as unique content, like an engine replay ('unique')")
    p.add_argument("--jobs", type=int, default=2 if demo else 1,
                   help=f"processes for the sweep (default {2 if demo else 1})")
    p.add_argument("--out", default="out/demo" if demo else None, required=not demo,
                   help="output directory for results.json and hit_rate.png")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-admission",
        description="Prefix-cache admission and eviction for hybrid models in vLLM: "
                    "simulate policies on traces, or run them in a real engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="replay a trace through the cache model for "
                                          "every (admission, eviction, capacity)")
    _add_simulate_args(sim, demo=False)
    demo = sub.add_parser("demo", help="simulate the built-in synthetic workload on Qwen3-Next")
    _add_simulate_args(demo, demo=True)

    tiny = sub.add_parser("make-tiny-model",
                          help="write a small random-weight Qwen3-Next hybrid that runs on CPU vLLM")
    tiny.add_argument("dir", help="output directory")
    tiny.add_argument("--max-model-len", type=int, default=131072)
    tiny.add_argument("--seed", type=int, default=0)

    from vllm_admission.plugin.replay_cli import add_replay_parser

    add_replay_parser(sub)
    _add_fidelity_parser(sub)
    return parser


def _add_fidelity_parser(sub) -> None:
    from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES

    p = sub.add_parser(
        "fidelity", help="replay a trace through the real engine and the simulator; compare "
                         "per-request prefix hits",
        description="For every policy pair (and pool size), replay the same requests through vLLM "
                    "with the AdmissionScheduler and through the simulator configured from that "
                    "engine; write <out>/fidelity.json and <out>/fidelity.png.")
    p.add_argument("--model", required=True,
                   help="model directory (e.g. from 'vllm-admission make-tiny-model DIR')")
    p.add_argument("--trace", default="synthetic",
                   help="a Mooncake or token JSONL file, or 'synthetic' (default)")
    p.add_argument("--admission", default="vllm",
                   help=f"comma list of: {', '.join(ADMISSION_POLICIES)} (default vllm)")
    p.add_argument("--eviction", default="lru",
                   help=f"comma list of: {', '.join(ENGINE_EVICTION_POLICIES)} (default lru)")
    p.add_argument("--num-gpu-blocks", default=None,
                   help="comma list of KV block pool sizes (vLLM's num_gpu_blocks_override); "
                        "default: sized from memory (8,192 blocks on CPU with 1 GiB)")
    p.add_argument("--max-requests", type=int, default=None,
                   help="replay only the first K requests of the trace")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="drop requests with longer prompts (counted as skipped)")
    p.add_argument("--max-output-len", type=int, default=None,
                   help="cap each request's output tokens (default: as in the trace)")
    p.add_argument("--mooncake-block-tokens", type=int, default=512,
                   help="tokens per Mooncake hash id (default 512, the trace's own; 128 shrinks "
                        "prompts 4x and maps one hash id to one 128-token engine block)")
    p.add_argument("--synthetic", action="append", default=[], metavar="KEY=VALUE",
                   help="a synthetic workload parameter (repeatable), e.g. num_requests=100 or "
                        "system_prompt_len=[600,0.5,200,1500]; values are JSON")
    p.add_argument("--mode", choices=("sequential", "timed"), default="sequential",
                   help="'sequential' (default): one request at a time; 'timed': submit at the "
                        "trace's arrival times x --time-scale, so requests overlap")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="timed mode: multiply arrival times by this (default 1)")
    p.add_argument("--alpha", type=float, default=None,
                   help="fix flop eviction's alpha in both (default: tuned online in both)")
    p.add_argument("--seed", type=int, default=0, help="synthetic workload and engine seed")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless every sequential record meets the fidelity bar: exact per "
                        "request for lru with none/last/vllm/dense, within 1%% of prompt tokens "
                        "for marconi and flop")
    p.add_argument("--out", required=True, help="output directory")


def _synthetic_params(items: list[str]) -> dict:
    import json

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--synthetic {item!r}: expected KEY=VALUE")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--synthetic {item!r}: the value is not JSON "
                             f"(numbers as 3 or 0.5, lists as [600,0.5,200,1500])") from None
    return params


def _fidelity(args: argparse.Namespace) -> int:
    from vllm_admission.core.eviction import ENGINE_EVICTION_POLICIES
    from vllm_admission.fidelity import (
        FidelitySpec,
        format_fidelity,
        meets_bar,
        run_fidelity,
        write_fidelity,
    )
    from vllm_admission.sim.sweep import parse_list

    blocks: tuple = (None,)
    if args.num_gpu_blocks is not None:
        try:
            blocks = tuple(int(b) for b in args.num_gpu_blocks.split(",") if b.strip())
        except ValueError:
            raise ValueError(f"--num-gpu-blocks {args.num_gpu_blocks!r}: expected a comma list "
                             f"of integers") from None
    for name in ("max_requests", "max_prompt_tokens", "max_output_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    spec = FidelitySpec(
        model=args.model, trace=args.trace,
        admissions=parse_list(args.admission, "admission policy", list(ADMISSION_POLICIES)),
        evictions=parse_list(args.eviction, "eviction policy", list(ENGINE_EVICTION_POLICIES)),
        num_gpu_blocks=blocks, max_requests=args.max_requests,
        max_prompt_tokens=args.max_prompt_tokens, max_output_len=args.max_output_len,
        mooncake_block_tokens=args.mooncake_block_tokens,
        synthetic=_synthetic_params(args.synthetic), mode=args.mode, time_scale=args.time_scale,
        alpha=args.alpha, seed=args.seed)

    def progress(rec: dict) -> None:
        print(f"{rec['admission']}+{rec['eviction']} at {rec['num_blocks']} blocks: "
              f"{rec['requests_differing']} of {rec['requests']} requests differ "
              f"({100 * rec['abs_diff_fraction']:.3f}% of prompt tokens); engine hit rate "
              f"{100 * rec['engine']['token_hit_rate']:.2f}%", flush=True)

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


def _simulate(args: argparse.Namespace) -> int:
    from vllm_admission.sim.simulator import DEFAULT_CHUNK_SIZE
    from vllm_admission.sim.sweep import SweepSpec, format_table, parse_list, run_sweep, write_results

    capacities = tuple(parse_bytes(c.strip()) for c in args.capacity.split(",") if c.strip())
    if not capacities:
        raise ValueError("no capacity given, e.g. --capacity 4GiB,16GiB")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    spec = SweepSpec(
        trace=args.trace, model=args.model, capacities=capacities,
        admissions=parse_list(args.admission, "admission policy", list(ADMISSION_POLICIES)),
        evictions=parse_list(args.eviction, "eviction policy", list(EVICTION_POLICIES)),
        chunk_size=args.chunk_size or DEFAULT_CHUNK_SIZE, alpha=args.alpha,
        max_requests=args.max_requests, seed=args.seed, outputs=args.outputs,
        tune_grid=args.tune_grid, mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype)
    costs = spec.load_costs()
    if not costs.is_hybrid:
        print(f"vllm-admission: {costs.name} has no recurrent layers; prefix caching already "
              "works block by block for it, so there is nothing for admission to do.")
        return 0
    doc = run_sweep(spec, jobs=args.jobs, progress=not args.no_progress)
    print(format_table(doc))
    res, png = write_results(doc, args.out)
    print(f"wrote {res} and {png}")
    return 0


def _make_tiny_model(args: argparse.Namespace) -> int:
    from vllm_admission.engine.tiny_model import make_tiny_model

    path = make_tiny_model(args.dir, max_position_embeddings=args.max_model_len, seed=args.seed)
    print(f"tiny hybrid model in {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    parser = build_parser()
    args = parser.parse_args(argv)
    from vllm_admission.plugin.replay_cli import run_replay

    handlers = {"simulate": _simulate, "demo": _simulate, "make-tiny-model": _make_tiny_model,
                "replay": run_replay, "fidelity": _fidelity}
    try:
        return handlers[args.command](args)
    except USER_ERRORS as exc:
        print(f"vllm-admission: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vllm-admission: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
