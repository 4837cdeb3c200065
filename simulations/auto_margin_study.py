"""``auto`` with a margin over stock and ``written`` among its candidates, on every cell of
the ``auto`` study (split, in-pass and on the default sampled shadows), the serving-settings
study, the retention study and the two-tier study (``docs/results.md`` section 5.6).

The setting an operator can leave on: ``VLLM_ADMISSION_AUTO_MARGIN=0.3`` and
``VLLM_ADMISSION_AUTO_ADMISSIONS=last,vllm,marconi,dense,written`` (``block`` joins under a
hash block finer than the block, as it does by default). Each cell runs ``auto`` + ``auto``
only, with the shadows its study ran (full in the ``auto``, in-pass, serving-settings and
retention studies, the default sampled ones in the sampled-shadow and two-tier studies);
stock and the default ``auto`` are read from those studies' own results
(``docs/results/auto``, ``docs/results/serving-settings``, ``docs/results/retention``,
``docs/results/host-tier``, ``docs/results/auto-sampled``), so run those first.

Writes ``docs/results/auto-margin/results.json`` (one row per cell) and prints the tables.

Run: ``python simulations/auto_margin_study.py --jobs 2`` (about 40 minutes on 2 cores);
``--tables`` reprints them from the file. Deterministic but for wall times.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import auto_study
import host_tier_study
import serving_settings_study as settings_study

from vllm_admission.core.adaptive import AUTO, MARGIN_ADMISSIONS, MARGIN_SETTING
from vllm_admission.core.geometry import parse_bytes
from vllm_admission.sim.sweep import SweepSpec, run_sweep

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "auto-margin"
MARGIN = MARGIN_SETTING
#: --studies name -> the study named in the rows.
STUDIES = {"auto": "auto", "serving-settings": "serving settings", "retention": "retention",
           "two-tiers": "two tiers", "inpass": "in-pass", "sampled": "sampled shadows"}
ADMISSIONS = MARGIN_ADMISSIONS


def _cell(study: str, trace: str, model: str, setting: str, path: str, model_name: str,
          caps, runs: list[dict], **sweep) -> dict:
    """One cell: where it comes from, its baseline runs (stock and the default ``auto``,
    at least), and the :class:`SweepSpec` fields it runs with besides the defaults (full
    shadows, split checkpoints)."""
    return {"study": study, "trace": trace, "model": model, "setting": setting, "path": path,
            "model_name": model_name, "caps": caps, "runs": runs,
            "sweep": {"shadow_rate": 1.0, **sweep}}


def _runs(folder: Path) -> list[dict]:
    return json.loads((folder / "results.json").read_text())["runs"]


def cells() -> list[dict]:
    """Every cell of the six studies, with its baseline runs."""
    out = []
    results = ROOT / "docs" / "results"
    for trace, (path, caps) in auto_study.TRACES.items():
        for model_key, model in auto_study.MODELS.items():
            out.append(_cell("auto", trace, model_key, "", path, model, caps,
                             _runs(results / "auto" / f"{trace}-{model_key}")))
    for trace in ("synthetic", "mooncake"):
        path = str(settings_study.MOONCAKE) if trace == "mooncake" else "synthetic"
        for model_key, model in settings_study.MODELS.items():
            for name, (unit, block, spec) in settings_study.SETTINGS.items():
                out.append(_cell("serving settings", trace, model_key, name, path, model,
                                 settings_study.CAPACITIES[trace, model_key],
                                 _runs(results / "serving-settings" / f"{trace}-{model_key}-{name}"),
                                 hash_block_size=unit, block_size=block,
                                 num_speculative_tokens=spec))
    for folder in sorted((results / "retention").iterdir()):
        doc = json.loads((folder / "results.json").read_text())
        caps = sorted({r["capacity_bytes"] for r in doc["runs"] if r["admission"] == AUTO})
        if not caps:
            continue   # an operator's fixed pair, no auto run
        trace, model_key, _ = folder.name.rsplit("-", 2)
        interval = doc["retention_interval"]
        out.append(_cell("retention", trace, model_key,
                         f"retention {'none' if interval is None else interval}",
                         str(settings_study.MOONCAKE) if trace == "mooncake" else "synthetic",
                         settings_study.MODELS[model_key], caps, doc["runs"],
                         retention_interval=interval))
    for path in sorted((results / "host-tier").glob("*.json")):
        doc = json.loads(path.read_text())
        if path.name.startswith("policies-") or "runs" not in doc:
            continue   # the host-policy study: no auto run
        model_key = next(k for k in host_tier_study.MODELS if path.stem.startswith(k))
        trace = path.stem[len(model_key) + 1:]
        for host in sorted({r["host_bytes_asked"] for r in doc["runs"]}):
            runs = [r for r in doc["runs"] if r["host_bytes_asked"] == host]
            out.append(_cell("two tiers", trace, model_key,
                             f"host {host_tier_study._label(host)}",  # noqa: SLF001
                             str(host_tier_study.TRACES[trace]), host_tier_study.MODELS[model_key],
                             sorted({r["capacity_bytes"] for r in runs}), runs,
                             host_bytes=host, shadow_rate=None))
    for trace in ("mooncake", "synthetic"):
        path, caps = auto_study.TRACES[trace]
        for model_key, model in auto_study.MODELS.items():
            out.append(_cell("in-pass", trace, model_key, "in-pass", path, model, caps,
                             _runs(results / "auto" / f"{trace}-{model_key}-inpass"),
                             checkpoint="inpass"))
    sampled = json.loads((results / "auto-sampled" / "results.json").read_text())
    for trace, (path, caps) in auto_study.TRACES.items():
        for model_key, model in auto_study.MODELS.items():
            runs = [{"admission": a, "eviction": e, "capacity_bytes": parse_bytes(r["capacity"]),
                     "token_hit_rate": r[k]["hit"]}
                    for r in sampled if (r["trace"], r["model"]) == (trace, model_key)
                    for (a, e, k) in (("vllm", "lru", "stock"), (AUTO, AUTO, "sampled"))]
            out.append(_cell("sampled shadows", trace, model_key, "sampled", path, model, caps,
                             runs, shadow_rate=None))
    return out


def run_cell(cell: dict, jobs: int) -> list[dict]:
    """The cell's rows: per capacity, stock, the default ``auto`` and ``auto`` with the margin."""
    by = {(r["admission"], r["eviction"], r["capacity_bytes"]): r for r in cell["runs"]}
    sweep = cell["sweep"]
    admissions = ADMISSIONS + (("block",) if sweep.get("hash_block_size") else ())
    spec = SweepSpec(trace=cell["path"], model=cell["model_name"],
                     capacities=tuple(c if isinstance(c, int) else parse_bytes(c) for c in cell["caps"]),
                     admissions=(AUTO,), evictions=(AUTO,), chunk_size=8192,
                     auto_margin=MARGIN, auto_admissions=admissions, **sweep)
    rows = []
    for r in run_sweep(spec, jobs=jobs, progress=False)["runs"]:
        cap = r["capacity_bytes"]
        stock, default = by[("vllm", "lru", cap)], by[(AUTO, AUTO, cap)]
        rows.append({k: cell[k] for k in ("study", "trace", "model", "setting")} | {
            "capacity_bytes": cap, "stock": stock["token_hit_rate"],
            "auto": default["token_hit_rate"], "auto_margin": r["token_hit_rate"],
            "final_policy": r["final_policy"], "switches": len(r["policy_switches"]),
            "wall_seconds": r["wall_seconds"]})
    return rows


def tables(rows: list[dict]) -> str:
    """Markdown: one table per study, a line per trace, model and setting."""
    out = []
    for study in dict.fromkeys(r["study"] for r in rows):
        out += [f"\n**{study} study** (token hit rate %, stock / default `auto` / `auto` with the "
                f"margin):\n",
                "| trace, model, setting | capacities | stock | `auto` | `auto`, margin 0.3 "
                "| margin − stock, worst |",
                "|---|---|---|---|---|---|"]
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            if r["study"] == study:
                groups.setdefault((r["trace"], r["model"], r["setting"]), []).append(r)
        for (trace, model, setting), rs in groups.items():
            rs.sort(key=lambda r: r["capacity_bytes"])
            stock, auto, margin = (" / ".join(f"{100 * r[k]:.2f}" for r in rs)
                                   for k in ("stock", "auto", "auto_margin"))
            worst = min(100 * (r["auto_margin"] - r["stock"]) for r in rs)
            out.append(f"| {trace}, {model}{', ' + setting if setting else ''} | "
                       f"{' / '.join(auto_study._gib(r['capacity_bytes']) for r in rs)} | {stock} | "
                       f"{auto} | {margin} | {worst:+.2f} |")
    below = [r for r in rows if r["auto_margin"] - r["stock"] < -0.001]
    out.append(f"\n{len(rows)} cells; `auto` with the margin below stock by more than 0.1 "
               f"points in {len(below)}: "
               + (", ".join(f"{r['trace']} {r['model']} {r['setting']} {auto_study._gib(r['capacity_bytes'])} "
                            f"{100 * (r['auto_margin'] - r['stock']):+.2f}" for r in below) or "none"))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tables", action="store_true", help="reprint the tables from the file")
    ap.add_argument("--studies", default=",".join(STUDIES),
                    help=f"comma list of {', '.join(STUDIES)}: run these, keep the file's "
                         f"rows of the others")
    args = ap.parse_args(argv)
    path = OUT / "results.json"
    chosen = {STUDIES[k] for k in args.studies.split(",") if k in STUDIES}
    if len(chosen) != len(args.studies.split(",")):
        ap.error(f"--studies takes names from {', '.join(STUDIES)}")
    if args.tables:
        rows = json.loads(path.read_text())["rows"]
    else:
        if not settings_study.MOONCAKE.exists():
            print(f"mooncake trace not found at {settings_study.MOONCAKE}", file=sys.stderr)
            return 2
        kept = json.loads(path.read_text())["rows"] if path.exists() else []
        rows = [r for r in kept if r["study"] not in chosen]
        for cell in cells():
            if cell["study"] not in chosen:
                continue
            rows += run_cell(cell, args.jobs)
            print(f"{cell['trace']} {cell['model']} {cell['setting']}: done", flush=True)
        order = list(STUDIES.values())
        rows.sort(key=lambda r: order.index(r["study"]))   # stable: cells keep their order
        OUT.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"margin": MARGIN, "admissions": list(ADMISSIONS),
                                    "shadow_rate": 1.0, "rows": rows}, indent=1) + "\n")
        print(f"wrote {path}")
    print(tables(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
