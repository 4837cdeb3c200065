"""Stock vLLM against ``auto`` under the serving settings hybrid users add (issue 31's
studies): vLLM's ``prefix_match_unit`` and EAGLE/MTP speculative decoding.

For the Mooncake conversation trace and the synthetic workload, Qwen3-Next-80B-A3B and
Nemotron-3-Nano-30B-A3B, at the same bytes:

* hash blocks of 16 tokens (which divide both models' default blocks, 544 and 2,096
  tokens) and of 64 tokens (with ``--block-size 64``, which makes the aligned blocks 576
  and 2,112 tokens, beside the same block without a unit): ``vllm``+``lru``,
  ``block``+``lru`` and ``auto``+``auto`` (settings ``u16``, ``b64``, ``u64-b64``);
* MTP with 1 and 2 draft tokens: ``vllm``+``lru``, ``marconi``+``lru`` (whose sequence
  end is kept a block lower under EAGLE) and ``auto``+``auto`` (``mtp1``, ``mtp2``);
* MTP with 1 draft token and hash blocks of 16 tokens together: ``vllm``+``lru``,
  ``block``+``lru`` and ``auto``+``auto`` (``u16-mtp1``).

The baseline without either is the retention study's ``0`` setting
(``docs/results/retention``). Writes
``docs/results/serving-settings/<trace>-<model>-<setting>/results.json`` and prints the
tables ``docs/results.md`` sections 3.7 and 3.8 quote.

Run: ``python simulations/serving_settings_study.py --jobs 2 [--settings u16,mtp1]``
(about 15 minutes per setting group on 2 cores, most of it ``auto`` on Mooncake).
Deterministic but for wall times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.report import format_table, write_results
from vllm_admission.sim.sweep import SweepSpec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
MODELS = {
    "qwen3next": "qwen3-next-80b-a3b",
    "nemotron3nano": str(SHARED / "model_configs" / "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"),
}
CAPACITIES = {
    ("mooncake", "qwen3next"): ("64GiB", "128GiB"),
    ("mooncake", "nemotron3nano"): ("32GiB", "64GiB"),
    ("synthetic", "qwen3next"): ("2GiB", "4GiB", "8GiB"),
    ("synthetic", "nemotron3nano"): ("1GiB", "2GiB", "4GiB"),
}
#: name -> (prefix_match_unit, --block-size, num_speculative_tokens)
SETTINGS = {"u16": (16, None, 0), "b64": (None, 64, 0), "u64-b64": (64, 64, 0),
            "mtp1": (None, None, 1), "mtp2": (None, None, 2), "u16-mtp1": (16, None, 1)}
UNIT_PAIRS = (("vllm", "lru"), ("block", "lru"), ("auto", "auto"))
PAIRS = (("vllm", "lru"), ("auto", "auto"))
MTP_PAIRS = (("vllm", "lru"), ("marconi", "lru"), ("auto", "auto"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--traces", default="synthetic,mooncake")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "serving-settings"))
    args = ap.parse_args(argv)
    if "mooncake" in args.traces and not MOONCAKE.exists():
        print(f"mooncake trace not found at {MOONCAKE}", file=sys.stderr)
        return 2
    for trace in args.traces.split(","):
        for model_key, model in MODELS.items():
            for name in args.settings.split(","):
                unit, block, spec_tokens = SETTINGS[name]
                spec = SweepSpec(trace=str(MOONCAKE) if trace == "mooncake" else "synthetic",
                                 model=model,
                                 capacities=tuple(parse_bytes(c)
                                                  for c in CAPACITIES[trace, model_key]),
                                 admissions=(), evictions=(),
                                 pairs=(UNIT_PAIRS if unit or block
                                        else MTP_PAIRS if spec_tokens else PAIRS),
                                 chunk_size=8192, hash_block_size=unit, block_size=block,
                                 num_speculative_tokens=spec_tokens, shadow_rate=1.0)
                doc = run_sweep(spec, jobs=args.jobs, progress=False)
                if trace == "mooncake":
                    doc["trace"] = "mooncake/conversation_trace.jsonl"
                print(f"\n## {trace} {model_key} {name}\n")
                print(format_table(doc), flush=True)
                res, png = write_results(doc, Path(args.out) / f"{trace}-{model_key}-{name}")
                png.unlink(missing_ok=True)  # the tables are the result; keep the folder small
                print(f"wrote {res}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
