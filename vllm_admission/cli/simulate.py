"""``vllm-admission simulate`` and ``demo``: trace-replay sweeps in the simulator."""

from __future__ import annotations

import argparse
import sys

from vllm_admission.cli.options import RETENTION_HELP, add_policy_tuning_args, parse_retention_interval
from vllm_admission.core.adaptive import AUTO
from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.cache.host import host_policy_names
from vllm_admission.core.costs import MAMBA_SSM_CACHE_DTYPES
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import EVICTION_POLICIES
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.core.routing import ROUTERS
from vllm_admission.core.settings import Settings, add_flags
from vllm_admission.sim.fleet import DEFAULT_PREFILL_FLOPS_PER_S
from vllm_admission.sim.sweep import EXECUTORS, RAY_INSTALL_HINT

__all__ = ["DEMO_MODEL", "MAMBA_SSM_CACHE_DTYPES", "add_simulate_args", "run_simulate"]

#: The demo's defaults: the built-in synthetic workload on Qwen3-Next.
DEMO_MODEL = "qwen3-next-80b-a3b"
DEMO_CAPACITIES = "2GiB,4GiB,8GiB,16GiB"
DEMO_ADMISSIONS = "last,vllm,marconi,dense"
DEMO_EVICTIONS = "lru,flop"
#: Pairs the demo runs besides the admission x eviction grid: the online chooser the
#: README leads with, shown beside stock ``vllm`` + ``lru``.
DEMO_PAIRS = f"{AUTO}+{AUTO}"


def add_simulate_args(p: argparse.ArgumentParser, *, demo: bool) -> None:
    """The options of ``simulate`` (``demo``: the demo's defaults)."""
    p.add_argument("--trace", default="synthetic",
                   help="a Mooncake or token JSONL file, or 'synthetic' (default)")
    p.add_argument("--model", default=DEMO_MODEL,
                   help=f"a Hugging Face config.json, or a built-in name (default {DEMO_MODEL})")
    p.add_argument("--capacity", default=DEMO_CAPACITIES,
                   help="comma list of KV cache sizes, e.g. 4GiB,16GiB "
                        f"(default {DEMO_CAPACITIES})")
    p.add_argument("--admission", default=DEMO_ADMISSIONS,
                   help=f"comma list of: {', '.join(ADMISSION_POLICIES)}, {AUTO} "
                        f"(default {DEMO_ADMISSIONS}); '{AUTO}' chooses online by shadow replay")
    p.add_argument("--eviction", default=DEMO_EVICTIONS,
                   help=f"comma list of: {', '.join(EVICTION_POLICIES)}, {AUTO} "
                        f"(default {DEMO_EVICTIONS}); '{AUTO}' chooses online by shadow replay")
    p.add_argument("--pairs", default=DEMO_PAIRS if demo else "",
                   help="comma list of ADMISSION+EVICTION pairs to run besides the "
                        "--admission x --eviction grid, e.g. auto+auto "
                        f"(default {DEMO_PAIRS if demo else 'none'})")
    p.add_argument("--mamba-ssm-cache-dtype", choices=MAMBA_SSM_CACHE_DTYPES, default="auto",
                   help="dtype of the recurrent (SSM / GDN) state, as vLLM's flag of that name: "
                        "'auto' (default) resolves per model as vLLM does on a GPU; vLLM's CPU "
                        "platform uses float32 on CPUs with AVX-512 BF16. A float32 state doubles "
                        "the state page and so raises the block size")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="prefill tokens per step, vLLM's max_num_batched_tokens (default 8192)")
    add_flags(p, ["checkpoint"])
    p.add_argument("--retention-interval", "--prefix-cache-retention-interval",
                   dest="retention_interval", default="0", metavar="0|N|none",
                   help=RETENTION_HELP)
    p.add_argument("--block-size", type=int, default=None, metavar="T",
                   help="vLLM's --block-size before its hybrid alignment (default 16, the CUDA "
                        "default); the aligned block is a multiple of it, so a --prefix-match-unit "
                        "that does not divide the default block can divide this one")
    p.add_argument("--prefix-match-unit", type=int, default=None, metavar="T",
                   help="vLLM's prefix_match_unit: tokens per block hash, a divisor of the "
                        "block size; below it a hit may end inside a block (default: the block "
                        "size; split checkpoint mode only)")
    p.add_argument("--num-speculative-tokens", type=int, default=0, metavar="K",
                   help="EAGLE/MTP speculative decoding with K draft tokens per step, as in "
                        "vLLM's --speculative-config (the lookup drops the last matched block, "
                        "prompt checkpoints move a block lower, K more state blocks and "
                        "lookahead slots per request; default 0: none)")
    p.add_argument("--hidden-states", type=int, default=0, metavar="N",
                   help="vLLM's hidden-state cache (--speculative-config method "
                        "extract_hidden_states) with N hidden-state layers: a KV cache group "
                        "of kind 'hidden', N x hidden_size values per token (default 0: none)")
    p.add_argument("--async-scheduling", action="store_true",
                   help="vLLM's async scheduling, the GPU engine's default (a step is "
                        "scheduled while the previous one runs, so a retired state block "
                        "returns to the pool a step late); default: synchronous, as vLLM's "
                        "CPU engine runs")
    host = p.add_argument_group(
        "host tier", "a second tier in host memory beside every capacity, as vLLM's "
        "OffloadingConnector runs it: prompt blocks and the states the GPU cache keeps are "
        "copied there and loaded back on a hit (docs/simulator.md)")
    host.add_argument("--host-capacity", default="0", metavar="BYTES",
                      help="its size, the connector's cpu_bytes_to_use, e.g. 1TiB (default 0: none)")
    host.add_argument("--host-policy", choices=host_policy_names(), default="lru",
                      help="its eviction policy, the connector's eviction_policy: vLLM's lru "
                           "(default) or one of the project's, which the plugin runs in vLLM "
                           "through cache_policy_module_path")
    add_flags(host, ["host_admission"])
    host.add_argument("--host-bandwidth", default="64GB", metavar="BYTES",
                      help="host-to-device bytes per second that prices its loads (default 64GB: "
                           "an H100's PCIe 5.0 x16 link, one direction)")
    add_policy_tuning_args(p, auto_interval=True)
    add_flags(p, ["tune_grid", "auto.shadow_rate", "auto.margin", "auto.admissions"])
    fleet = p.add_argument_group(
        "fleet", "replicas of the cache behind a router, at the trace's arrival times; each "
        "replica runs the pair's policies, the router sees each one's attention-KV hit, hybrid "
        "hit and blocks in flight (docs/fleet.md); writes fleet.json instead of results.json")
    fleet.add_argument("--replicas", type=int, default=None, metavar="N",
                       help="replay through N replicas of each capacity (default: one cache, no router)")
    fleet.add_argument("--router", default=",".join(ROUTERS), metavar="NAMES",
                       help=f"with --replicas: comma list of routing policies, of "
                            f"{', '.join(ROUTERS)} (default: all)")
    fleet.add_argument("--replica-flops", type=float, default=DEFAULT_PREFILL_FLOPS_PER_S,
                       metavar="FLOP/S",
                       help=f"with --replicas: one replica's prefill throughput, which prices "
                            f"its queue and time to first token (default "
                            f"{DEFAULT_PREFILL_FLOPS_PER_S:.3g}: 40%% of an H100's BF16 peak)")
    fleet.add_argument("--overlap-weight", type=float, default=None, metavar="W",
                       help="with --replicas: for kv_prefix and hybrid, the weight of the blocks "
                            "left to prefill against the blocks in flight (Dynamo's "
                            "--kv-overlap-score-weight; default 1)")
    p.add_argument("--resample", type=int, default=None, metavar="N",
                   help="replay N requests: the trace repeated pass after pass, its content "
                        "renamed in each pass except shared prefixes (a long trace with the "
                        "trace's statistics, streamed: memory bounded by the trace, not N)")
    p.add_argument("--max-requests", type=int, default=None,
                   help="replay only the first K requests (the rest are counted as skipped)")
    p.add_argument("--seed", type=int, default=0, help="synthetic workload seed (default 0)")
    p.add_argument("--outputs", choices=("trace", "unique"), default="trace",
                   help="hash output blocks as the trace's later turns see them ('trace', "
                        "default; needs a trace that records outputs, like the synthetic one) or "
                        "as unique content, like an engine replay ('unique')")
    p.add_argument("--jobs", type=int, default=None,
                   help=f"with --executor process: worker processes for the sweep (default "
                        f"{2 if demo else 1}); with --executor ray: the CPUs of the local Ray "
                        "instance, hence runs at once (default: all of this machine's), "
                        "ignored with --ray-address (the cluster's CPUs decide)")
    p.add_argument("--executor", choices=EXECUTORS, default="process",
                   help="where the runs execute: 'process' (default), a pool of --jobs local "
                        "processes, each reading the trace; 'ray', one Ray task per run, the "
                        "trace and model put in Ray's object store once (needs Ray: "
                        f"{RAY_INSTALL_HINT}); results.json is the same but for run times")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="with --executor ray: the Ray cluster to run on, as ray.init's address "
                        "('auto' from a node of the cluster, HOST:6379, ray://HOST:10001); "
                        "default: start a local Ray instance for the sweep")
    p.add_argument("--out", default="out/demo" if demo else None, required=not demo,
                   help="output directory for results.json and hit_rate.png")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(process_jobs=2 if demo else 1)


def _bandwidth(text: str) -> float:
    value = parse_bytes(text)
    if value <= 0:
        raise UserError(f"--host-bandwidth must be > 0 bytes per second, got {text!r}")
    return float(value)


def run_simulate(args: argparse.Namespace) -> int:
    """Run a sweep; print the table; write results.json and the plot."""
    from vllm_admission.cli.options import parse_list
    from vllm_admission.core.eviction import eviction_class
    from vllm_admission.sim.report import check_writable, format_table, write_results
    from vllm_admission.sim.simulator import DEFAULT_CHUNK_SIZE
    from vllm_admission.sim.sweep import SweepSpec, run_sweep

    capacities = tuple(parse_bytes(c.strip()) for c in args.capacity.split(",") if c.strip())
    if not capacities:
        raise UserError("no capacity given, e.g. --capacity 4GiB,16GiB")
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    if args.ray_address and args.executor != "ray":
        raise UserError("--ray-address needs --executor ray")
    jobs = args.jobs
    if args.executor == "process" and jobs is None:
        jobs = getattr(args, "process_jobs", 1)
    if args.chunk_size is not None and args.chunk_size < 1:
        raise UserError(f"--chunk-size must be >= 1 token, got {args.chunk_size}")
    if args.num_speculative_tokens < 0:
        raise UserError(f"--num-speculative-tokens must be >= 0, got {args.num_speculative_tokens}")
    if args.hidden_states < 0:
        raise UserError(f"--hidden-states must be >= 0, got {args.hidden_states}")
    if args.hidden_states and args.num_speculative_tokens:
        raise UserError("--hidden-states is vLLM's extract_hidden_states speculative method; "
                        "it cannot run beside --num-speculative-tokens (another method)")
    if args.block_size is not None and args.block_size < 1:
        raise UserError(f"--block-size must be >= 1 token, got {args.block_size}")
    if args.resample is not None and args.resample < 1:
        raise UserError(f"--resample must be >= 1 request, got {args.resample}")
    policy = Settings.from_args(args)
    admissions = parse_list(args.admission, "admission policy", [*ADMISSION_POLICIES, AUTO])
    pairs = parse_pairs(args.pairs)
    auto_admissions = policy.auto.admissions
    if auto_admissions is not None and AUTO not in (*admissions, *(a for a, _ in pairs)):
        raise UserError(f"--auto-admissions names the policies admission {AUTO!r} chooses "
                        f"among, and no run here has admission {AUTO!r}")
    retention = parse_retention_interval(args.retention_interval)
    spec = SweepSpec(
        trace=args.trace, model=args.model, capacities=capacities,
        admissions=admissions,
        evictions=parse_list(args.eviction, "eviction policy", [*EVICTION_POLICIES, AUTO]),
        pairs=pairs,
        chunk_size=args.chunk_size or DEFAULT_CHUNK_SIZE, alpha=policy.alpha,
        max_requests=args.max_requests, seed=args.seed, outputs=args.outputs,
        resample=args.resample,
        tune_grid=policy.tune_grid, auto_interval=policy.auto.interval,
        shadow_rate=policy.auto.shadow_rate, auto_margin=policy.auto.margin,
        auto_admissions=auto_admissions,
        mamba_ssm_cache_dtype=args.mamba_ssm_cache_dtype, checkpoint=policy.checkpoint,
        retention_interval=retention, hash_block_size=args.prefix_match_unit,
        block_size=args.block_size, num_speculative_tokens=args.num_speculative_tokens,
        hidden_states=args.hidden_states, host_bytes=parse_bytes(args.host_capacity),
        host_policy=args.host_policy, host_bandwidth=_bandwidth(args.host_bandwidth),
        host_admission=policy.host_admission, async_scheduling=args.async_scheduling)
    if policy.alpha is not None:
        names = {e for _, e, _ in spec.runs()} - {AUTO}
        if not any(eviction_class(e).tunable for e in names):
            print(f"vllm-admission: --alpha {policy.alpha:g} has no effect: no eviction policy run "
                  f"here has an alpha ({', '.join(sorted(names)) or AUTO}; flop has one)",
                  file=sys.stderr)
    if args.replicas is not None:
        return _run_fleet(args, spec)
    costs = spec.load_costs()
    if not costs.is_hybrid:
        print(f"vllm-admission: {costs.name} has no recurrent layers; prefix caching already "
              "works block by block for it, so there is nothing for admission to do.")
        return 0
    if args.executor == "ray" and args.ray_address and args.jobs is not None:
        print("vllm-admission: --jobs is ignored with --ray-address: the cluster's CPUs decide",
              file=sys.stderr)
    check_writable(args.out)
    doc = run_sweep(spec, jobs=jobs, progress=not args.no_progress, executor=args.executor,
                    ray_address=args.ray_address)
    print(format_table(doc))
    res, png = write_results(doc, args.out)
    print(f"wrote {res} and {png}")
    return 0




def _run_fleet(args: argparse.Namespace, spec) -> int:
    """``simulate --replicas N``: every capacity x pair x router through a fleet; prints a
    table, writes ``fleet.json``."""
    import json
    from pathlib import Path

    from vllm_admission.cli.options import parse_list
    from vllm_admission.core.traces import load_trace
    from vllm_admission.sim.fleet import FleetSettings, simulate_fleet
    from vllm_admission.sim.report import check_writable
    from vllm_admission.sim.simulator import cache_requests

    routers = parse_list(args.router, "routing policy", list(ROUTERS))
    fleets = [FleetSettings(args.replicas, router, prefill_flops_per_s=args.replica_flops,
                            overlap_weight=args.overlap_weight) for router in routers]
    for fleet in fleets:
        fleet.check()
    if spec.resample:
        raise UserError("--replicas replays the trace as it is; --resample is for one cache")
    costs = spec.load_costs()
    if not costs.is_hybrid:
        print(f"vllm-admission: {costs.name} has no recurrent layers; prefix caching already "
              "works block by block for it, so there is nothing for admission to do.")
        return 0
    check_writable(args.out)
    trace = load_trace(spec.trace, max_requests=spec.max_requests, seed=spec.seed)
    records = []
    lines = ["| capacity | pair | router | token hit rate | load spread | TTFT P50 / P99 (s) |",
             "|---|---|---|---|---|---|"]
    by_block_size: dict[int, list] = {}     # the trace's cache requests, one list per block size
    for admission, eviction, capacity in spec.runs():
        settings = spec.settings(costs, admission, eviction, capacity)
        block_size = spec.geometry(costs, capacity).block_size
        if block_size not in by_block_size:
            by_block_size[block_size] = cache_requests(trace, block_size, spec.outputs,
                                                       spec.hash_block_size)
        requests = by_block_size[block_size]
        for fleet in fleets:
            router = fleet.router
            res = simulate_fleet(trace, costs, settings, fleet, requests=requests)
            records.append({"capacity_bytes": capacity, **res.to_record()})
            lines.append(f"| {capacity / (1 << 30):g} GiB | {admission}+{eviction} | {router} | "
                         f"{100 * res.token_hit_rate:.2f} % | {res.load_spread:.2f} | "
                         f"{res.ttft_p50_s:.3f} / {res.ttft_p99_s:.3f} |")
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"trace": spec.trace, "model": costs.name, "replicas": args.replicas,
           "prefill_flops_per_s": args.replica_flops, "overlap_weight": args.overlap_weight,
           "records": records}
    (out / "fleet.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'fleet.json'}")
    return 0


def parse_pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``"auto+auto,last+reuse"`` -> ``(("auto", "auto"), ("last", "reuse"))``.

    Raises:
        UnknownPolicyError: a pair without ``+`` or with an unknown name (one line).
    """
    from vllm_admission.cli.options import parse_list
    from vllm_admission.core.admission import UnknownPolicyError

    pairs = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        admission, plus, eviction = item.partition("+")
        if not plus:
            raise UnknownPolicyError(f"--pairs wants ADMISSION+EVICTION, got {item!r}")
        pairs.append((parse_list(admission, "admission policy", [*ADMISSION_POLICIES, AUTO])[0],
                      parse_list(eviction, "eviction policy", [*EVICTION_POLICIES, AUTO])[0]))
    return tuple(pairs)
