"""Policy study and simulator fidelity on the real vLLM engine (``make engine-study``).

Runs :func:`vllm_admission.fidelity.run_fidelity` on the tiny random-weight
Qwen3-Next model (CPU vLLM 0.32) for the workloads below, and on the tiny
Nemotron-H (Mamba2) model for the ``mamba2-*`` ones, and writes each
``fidelity.json`` / ``fidelity.png`` under ``docs/results/engine/<name>/``.
``docs/results.md`` ("On the real engine") is written from them.

Each workload runs its pairs at an ample pool (8,192 blocks, no eviction) and a
tight one (evictions on most requests), one pair after another in one process,
so the prefill-time ratios to stock are measured in one run.

Usage: ``python simulations/engine_study.py [NAME ...] [--model DIR] [--mamba2-model DIR] [--out DIR]``
(NAME: one of the workloads below; default all). Needs vLLM; about an hour on a
2-core CPU machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from vllm_admission.fidelity import FidelitySpec, format_fidelity, run_fidelity, write_fidelity

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"

STUDY_PAIRS = (("vllm", "lru"), ("marconi", "flop"), ("last", "lru"), ("dense", "lru"))
#: ``auto`` beside stock, in one run (prefill seconds are compared as a ratio).
AUTO_PAIRS = (("vllm", "lru"), ("auto", "auto"))
#: Each eviction policy beyond ``lru`` with stock admission (issue 9: each runs in the
#: engine exactly as in the simulator).
EVICTION_PAIRS = (("vllm", "lru"), ("vllm", "lfu"), ("vllm", "reuse"))
#: ``s3fifo`` (issue 24): every admission policy with it, beside stock.
S3FIFO_PAIRS = (("vllm", "lru"), *((a, "s3fifo") for a in ("none", "last", "vllm", "marconi", "dense")))
#: ``conversation`` (issue 24): every admission policy with it, beside stock and ``reuse``.
CONVERSATION_PAIRS = (("vllm", "lru"), ("vllm", "reuse"),
                      *((a, "conversation") for a in ("none", "last", "vllm", "marconi", "dense")))
#: ``mix`` (issue 24, the LeCaR-style expert mix): every admission policy with it, beside stock.
MIX_PAIRS = (("vllm", "lru"), *((a, "mix") for a in ("none", "last", "vllm", "marconi", "dense")))
#: The learned eviction (issue 62) beside stock: with its default schedule no model is fitted
#: within 100 requests, so this checks its bookkeeping and its lru fallback in the engine (the
#: scheduler test ``test_learned_trains_in_the_plugin_and_matches_the_core_model`` checks it
#: with models at work).
LEARNED_PAIRS = (("vllm", "lru"), ("vllm", "learned"), ("last", "learned"))
#: The in-pass checkpoint mode: every admission policy with lru.
INPASS_PAIRS = tuple((a, "lru") for a in ("none", "last", "vllm", "marconi", "dense"))
#: Workloads on the tiny Nemotron-H (Mamba2) model are named with this prefix (study.png,
#: drawn for the Qwen3-Next model, leaves them out; the tables show them).
MAMBA2_PREFIX = "mamba2-"
#: The Mamba2 model: every admission policy with lru, and auto.
MAMBA2_PAIRS = (*INPASS_PAIRS, ("auto", "auto"))
#: Every pair the tables and the plot show.
SHOWN_PAIRS = (*STUDY_PAIRS, ("vllm", "lfu"), ("vllm", "reuse"), ("auto", "auto"))
ALL_PAIRS = tuple((a, e) for e in ("lru", "flop")
                  for a in ("none", "last", "vllm", "marconi", "dense"))

#: Chats and few-shot prompts over a few shared system prompts / templates, short
#: enough for a CPU engine (the default synthetic workload's agent contexts are 10k tokens).
SHARED_PROMPTS = dict(
    num_requests=100, chat_fraction=0.7, fewshot_fraction=0.3, agent_fraction=0.0,
    num_system_prompts=4, system_prompt_len=(800, 0.4, 300, 2000),
    num_templates=3, template_len=(1200, 0.4, 400, 2500),
    user_message_len=(120, 0.9, 8, 800), chat_output_len=(80, 0.8, 1, 400),
    fewshot_query_len=(100, 0.8, 8, 500), chat_think_s=20.0, request_rate=2.0,
    max_prompt_len=6000)


def workloads(model: str, mamba2_model: str | None = None) -> dict[str, FidelitySpec]:
    """The study's runs by name (``mamba2-*`` on ``mamba2_model``, when given)."""
    # The bf16 state pinned through vLLM's own argument: the same geometry (B = 128) on every
    # CPU (vLLM's CPU platform turns "auto" into float32 on CPUs with AVX-512 BF16).
    pinned = dict(model=model, max_output_len=16, mamba_ssm_cache_dtype="bfloat16")
    mooncake = dict(**pinned, trace=str(MOONCAKE), max_requests=100, mooncake_block_tokens=128)
    synthetic = dict(**pinned, trace="synthetic", synthetic=SHARED_PROMPTS)
    return {
        # Policy study (the four pairs), ample and tight pools.
        "mooncake": FidelitySpec(**mooncake, pairs=STUDY_PAIRS, num_gpu_blocks=(None, 300)),
        # Every policy pair, ample and tight: the fidelity table.
        "synthetic": FidelitySpec(**synthetic, pairs=ALL_PAIRS, num_gpu_blocks=(None, 64)),
        # auto (decisions every 50 requests) against stock on the tight pools.
        "auto-synthetic": FidelitySpec(**synthetic, pairs=AUTO_PAIRS, num_gpu_blocks=(64,)),
        "auto-mooncake": FidelitySpec(**mooncake, pairs=AUTO_PAIRS, num_gpu_blocks=(300,)),
        # The eviction policies beyond lru, with vllm admission, on the same tight pools.
        "evictions-synthetic": FidelitySpec(**synthetic, pairs=EVICTION_PAIRS, num_gpu_blocks=(64,)),
        "evictions-mooncake": FidelitySpec(**mooncake, pairs=EVICTION_PAIRS, num_gpu_blocks=(300,)),
        # S3-FIFO eviction (issue 24) under every admission policy, same tight pools.
        "s3fifo-synthetic": FidelitySpec(**synthetic, pairs=S3FIFO_PAIRS, num_gpu_blocks=(64,)),
        "s3fifo-mooncake": FidelitySpec(**mooncake, pairs=S3FIFO_PAIRS, num_gpu_blocks=(300,)),
        "learned-mooncake": FidelitySpec(**mooncake, pairs=LEARNED_PAIRS, num_gpu_blocks=(300,)),
        "conversation-synthetic": FidelitySpec(**synthetic, pairs=CONVERSATION_PAIRS,
                                               num_gpu_blocks=(64,)),
        "conversation-mooncake": FidelitySpec(**mooncake, pairs=CONVERSATION_PAIRS,
                                              num_gpu_blocks=(300,)),
        # The expert mix (issue 24) under every admission policy, same tight pools.
        "mix-synthetic": FidelitySpec(**synthetic, pairs=MIX_PAIRS, num_gpu_blocks=(64,)),
        "mix-mooncake": FidelitySpec(**mooncake, pairs=MIX_PAIRS, num_gpu_blocks=(300,)),
        # VLLM_ADMISSION_CHECKPOINT=inpass (issue 10): every admission policy, tight pools.
        "inpass-synthetic": FidelitySpec(**synthetic, pairs=INPASS_PAIRS, num_gpu_blocks=(64,),
                                         checkpoint="inpass"),
        "inpass-mooncake": FidelitySpec(**mooncake, pairs=INPASS_PAIRS, num_gpu_blocks=(300,),
                                        checkpoint="inpass"),
        # auto against stock with in-pass checkpoints (dense's chunk splits gone).
        "auto-inpass-synthetic": FidelitySpec(**synthetic, pairs=AUTO_PAIRS, num_gpu_blocks=(64,),
                                              checkpoint="inpass"),
        # Requests overlapping in the engine: how far the sequential prediction drifts.
        "synthetic-timed": FidelitySpec(**synthetic, pairs=(("vllm", "lru"), ("marconi", "flop")),
                                        num_gpu_blocks=(64,), mode="timed", time_scale=0.25),
        "mooncake-timed": FidelitySpec(**mooncake, pairs=(("vllm", "lru"),),
                                       num_gpu_blocks=(300,), mode="timed", time_scale=1.0),
        # Drift against overlap: the same run at several time scales (4: little overlap).
        **{f"synthetic-timed-x{scale:g}": FidelitySpec(
            **synthetic, pairs=(("vllm", "lru"),), num_gpu_blocks=(64,), mode="timed",
            time_scale=scale) for scale in (4.0, 1.0, 0.0)},
        **(_mamba2_workloads(mamba2_model) if mamba2_model else {}),
    }


def _mamba2_workloads(model: str) -> dict[str, FidelitySpec]:
    """The tiny Nemotron-H (Mamba2) model, split checkpoints, with its own default state dtype
    pinned: float32 (its config's ``mamba_ssm_cache_dtype``, which vLLM applies on every CPU),
    so B = 256. The Mooncake pool, 150 blocks, holds the tokens of the GDN runs' 300 blocks of
    128. ``mamba2-mooncake-bf16`` pins the bfloat16 state instead (B = 128, 300 blocks). Each
    has a ``mamba2-inpass-*`` twin with ``VLLM_ADMISSION_CHECKPOINT=inpass``."""
    pinned = dict(model=model, max_output_len=16, mamba_ssm_cache_dtype="float32")
    split = {
        "mamba2-synthetic": FidelitySpec(**pinned, trace="synthetic", synthetic=SHARED_PROMPTS,
                                         pairs=MAMBA2_PAIRS, num_gpu_blocks=(64,)),
        "mamba2-mooncake": FidelitySpec(**pinned, trace=str(MOONCAKE), max_requests=100,
                                        mooncake_block_tokens=128, pairs=MAMBA2_PAIRS,
                                        num_gpu_blocks=(150,)),
        # bfloat16 state pinned: B = 128 as the GDN runs, so the Mooncake requests' shared
        # 128-token hash ids are whole blocks and can hit.
        "mamba2-mooncake-bf16": FidelitySpec(**{**pinned, "mamba_ssm_cache_dtype": "bfloat16"},
                                             trace=str(MOONCAKE), max_requests=100,
                                             mooncake_block_tokens=128, pairs=MAMBA2_PAIRS,
                                             num_gpu_blocks=(300,)),
    }
    # The same three with in-pass checkpoints (vLLM's export, several per prefill).
    return {**split, **{name.replace(MAMBA2_PREFIX, f"{MAMBA2_PREFIX}inpass-", 1):
                        dataclasses.replace(spec, checkpoint="inpass") for name, spec in split.items()}}


def _load_docs(out: Path) -> dict[str, dict]:
    import json

    return {p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("*/fidelity.json"))}


def _pool(rec: dict) -> str:
    return f"{rec['num_blocks']:,}"


def overlapped(rec: dict) -> int:
    """Requests whose time in the engine (submit to finish) overlaps another request's."""
    pr = rec["per_request"]
    spans = sorted(zip(pr["submitted_s"], pr["finished_s"], strict=True))
    hit = [False] * len(spans)
    end, owner = float("-inf"), -1
    for i, (s, f) in enumerate(spans):
        if s < end:
            hit[i] = True
            hit[owner] = True
        if f > end:
            end, owner = f, i
    return sum(hit)


def tables(docs: dict[str, dict]) -> str:
    """The markdown tables of docs/results.md ("On the real engine"), from the written runs."""
    lines = []
    study = [(n, d) for n, d in docs.items() if d["settings"]["mode"] == "sequential"]
    lines += ["| workload | pool (blocks) | policy | engine token hit rate | simulator | "
              "prefill tokens computed | vs stock | prefill seconds | vs stock |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, doc in study:
        for r in doc["records"]:
            if (r["admission"], r["eviction"]) not in SHOWN_PAIRS:
                continue
            e, s = r["engine"], r["simulator"]
            tok = e.get("prefill_tokens_vs_stock")
            sec = e.get("prefill_seconds_vs_stock")
            lines.append(
                f"| {name} | {_pool(r)} | {r['admission']}+{r['eviction']} | "
                f"{100 * e['token_hit_rate']:.2f} % | {100 * s['token_hit_rate']:.2f} % | "
                f"{e['prefill_tokens_computed']:,} | {'-' if tok is None else f'{tok:.3f}'} | "
                f"{e['prefill_seconds']:.1f} | {'-' if sec is None else f'{sec:.3f}'} |")
    lines += ["", "| workload | mode | pool (blocks) | policy | requests | differing | "
              "abs. difference (% of prompt tokens) | engine evictions | simulator evictions |",
              "|---|---|---|---|---|---|---|---|---|"]
    for name, doc in study:
        for r in doc["records"]:
            lines.append(
                f"| {name} | {r['mode']} | {_pool(r)} | {r['admission']}+{r['eviction']} | "
                f"{r['requests']} | {r['requests_differing']} | "
                f"{100 * r['abs_diff_fraction']:.3f} | {r['engine']['evictions']:,} | "
                f"{r['simulator']['evictions']:,} |")
    lines += ["", "| workload | time scale | pool (blocks) | policy | requests overlapping "
              "another | mean requests in flight | differing | abs. difference (% of prompt "
              "tokens) | engine hit rate | simulator (sequential) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, doc in docs.items():
        if doc["settings"]["mode"] != "timed":
            continue
        for r in doc["records"]:
            conc = r.get("mean_concurrency")
            lines.append(
                f"| {name} | {doc['settings']['time_scale']:g} | {_pool(r)} | "
                f"{r['admission']}+{r['eviction']} | {overlapped(r)} of {r['requests']} | "
                f"{'-' if conc is None else f'{conc:.2f}'} | "
                f"{r['requests_differing']} of {r['requests']} | "
                f"{100 * r['abs_diff_fraction']:.2f} | "
                f"{100 * r['engine']['token_hit_rate']:.2f} % | "
                f"{100 * r['simulator']['token_hit_rate']:.2f} % |")
    return "\n".join(lines)


def plot_study(docs_by_name: dict[str, dict], out: Path) -> Path:
    """Bar chart: engine token hit rate per policy pair, per workload and pool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [(n, d) for n, d in docs_by_name.items()
            if d["settings"]["mode"] == "sequential" and not n.startswith(MAMBA2_PREFIX)]
    groups = [(n, r["num_blocks"]) for n, d in docs for r in d["records"]
              if (r["admission"], r["eviction"]) == STUDY_PAIRS[0]]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    width = 0.8 / len(SHOWN_PAIRS)
    for k, pair in enumerate(SHOWN_PAIRS):
        heights = []
        for name, blocks in groups:
            doc = docs_by_name[name]
            rec = next((r for r in doc["records"] if r["num_blocks"] == blocks
                        and (r["admission"], r["eviction"]) == pair), None)
            heights.append(100 * rec["engine"]["token_hit_rate"] if rec else 0.0)
        ax.bar([i + k * width for i in range(len(groups))], heights, width, label="+".join(pair))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{n}\n{b:,} blocks" for n, b in groups], fontsize=8)
    ax.set_ylabel("engine token hit rate (%)")
    ax.legend(fontsize=8)
    ax.set_title("tiny Qwen3-Next on CPU vLLM 0.32, one request at a time", fontsize=9)
    fig.tight_layout()
    path = out / "study.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_drift(docs: dict[str, dict], out: Path) -> Path | None:
    """Drift of the engine from the sequential prediction against requests in flight."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = []
    for name, doc in docs.items():
        if doc["settings"]["mode"] != "timed":
            continue
        for r in doc["records"]:
            if r.get("mean_concurrency") is None:
                continue
            gap = 100 * (r["simulator"]["token_hit_rate"] - r["engine"]["token_hit_rate"])
            points.append((name, doc["settings"]["time_scale"], r, gap))
    if not points:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, scale, r, gap in points:
        label = f"{name.split('-')[0]} {r['admission']}+{r['eviction']} x{scale:g}"
        x = r["mean_concurrency"]
        axes[0].scatter(x, 100 * r["abs_diff_fraction"], label=label)
        axes[1].scatter(x, gap)
    axes[0].set_ylabel("|engine - simulator| (% of prompt tokens)")
    axes[1].set_ylabel("simulator minus engine hit rate (points)")
    for ax in axes:
        ax.set_xlabel("mean requests in flight")
        ax.set_xscale("symlog", linthresh=1)
        ax.axhline(0, color="0.7", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle("timed replay: drift from the one-at-a-time prediction", fontsize=9)
    fig.tight_layout()
    path = out / "drift.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _summarise(out: Path) -> int:
    """Print the tables and draw study.png / drift.png from every run under ``out``."""
    docs = _load_docs(out)
    print(tables(docs))
    print(f"wrote {plot_study(docs, out)} and {plot_drift(docs, out)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="workloads to run (default: all)")
    parser.add_argument("--model", default=str(ROOT / "out" / "tiny-model"),
                        help="tiny model directory (made if missing)")
    parser.add_argument("--mamba2-model", default=str(ROOT / "out" / "tiny-nemotron-h"),
                        help="tiny Nemotron-H (Mamba2) model directory for the mamba2-* "
                             "workloads (made if missing)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "engine"))
    parser.add_argument("--tables", action="store_true",
                        help="only print the markdown tables and redraw study.png from the runs "
                             "already written")
    args = parser.parse_args(argv)
    if args.tables:
        return _summarise(Path(args.out))
    from vllm_admission.engine.tiny_model import make_tiny_model

    if not (Path(args.model) / "config.json").exists():
        make_tiny_model(args.model)
    if not (Path(args.mamba2_model) / "config.json").exists():
        make_tiny_model(args.mamba2_model, arch="nemotron-h")
    runs = workloads(args.model, args.mamba2_model)
    unknown = [n for n in args.names if n not in runs]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {', '.join(runs)}")
    for name in args.names or list(runs):
        t0 = time.perf_counter()
        doc = run_fidelity(runs[name], on_record=lambda r, n=name: print(
            f"[{n}] {r['admission']}+{r['eviction']} @ {r['num_blocks']} blocks: "
            f"{r['requests_differing']}/{r['requests']} differ, engine hit "
            f"{100 * r['engine']['token_hit_rate']:.2f}%, prefill {r['engine']['prefill_seconds']:.1f} s",
            flush=True))
        doc["settings"]["study_wall_seconds"] = time.perf_counter() - t0
        print(format_fidelity(doc))
        js, png = write_fidelity(doc, Path(args.out) / name)
        print(f"wrote {js} and {png}", flush=True)
    return _summarise(Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
