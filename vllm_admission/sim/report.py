"""A sweep's results on disk (``results.json``, ``hit_rate.png``) and as the CLI's text table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vllm_admission.core.adaptive import stock_pair
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import EVICTION_POLICIES

__all__ = ["OutputDirError", "check_writable", "format_table", "plot_hit_rates", "write_results"]


class OutputDirError(UserError, OSError):
    """An output directory (``--out``) that cannot be created or written: the user's
    path, so a :class:`~vllm_admission.core.errors.UserError`, and still an ``OSError``."""


def format_table(doc: dict[str, Any]) -> str:
    """A plain-text table of the runs, one line each, under a line naming model and SSM state dtype
    (and the checkpoint mode and retention interval when they are not vLLM's defaults)."""
    title = f"{doc['model']}"
    if doc.get("ssm_dtype") is not None:
        title += (f": SSM state {doc['ssm_dtype']} "
                  f"(--mamba-ssm-cache-dtype {doc.get('mamba_ssm_cache_dtype', 'auto')})")
    if doc.get("checkpoint", "split") != "split":
        title += f"; checkpoint mode {doc['checkpoint']} (prefill chunks end at the budget only)"
    if doc.get("resample"):
        title += f"; {doc['resample']:,} requests: {doc['trace']} resampled, streamed"
    retention = doc.get("retention_interval", 0)
    if retention != 0:
        title += (f"; stock retention interval {'none (every written state)' if retention is None else retention}"
                  f" (vllm admission)")
    head = f"{'admission':<9} {'eviction':<8} {'capacity':>10} {'blocks':>7} {'hit rate':>8} " \
           f"{'req hit':>7} {'st.miss':>7} {'FLOPs saved':>11} {'ckpts':>7} {'evictions':>9} {'alpha':>5} {'sec':>6}"
    lines = [title, head, "-" * len(head)]
    for r in doc["runs"]:
        alpha = "" if r["alpha"] is None else f"{r['alpha']:.1f}"
        # Records written before the field existed have no state_miss_tokens.
        miss = r.get("state_miss_tokens")
        miss = "" if miss is None else f"{miss / r['prompt_tokens'] if r['prompt_tokens'] else 0:.2%}"
        lines.append(
            f"{r['admission']:<9} {r['eviction']:<8} {_fmt_bytes(r['capacity_bytes']):>10} "
            f"{r['num_blocks']:>7} {r['token_hit_rate']:>8.2%} {r['request_hit_rate']:>7.1%} "
            f"{miss:>7} {r['flops_saved_fraction']:>11.2%} {r['state_checkpoints']:>7} {r['evictions']:>9} "
            f"{alpha:>5} {r['wall_seconds']:>6.2f}")
    if doc.get("host_bytes"):
        admits = (f", states of {doc['host_admission']} admission too"
                  if doc.get("host_admission") else "")
        lines.append(f"host tier: {_fmt_bytes(doc['host_bytes'])} ({doc.get('host_policy')}"
                     f"{admits}) beside each capacity; loads priced at "
                     f"{doc['host_bandwidth'] / 1e9:g} GB/s")
        lines.extend(
            f"  {r['admission']:<9} {r['eviction']:<8} {_fmt_bytes(r['capacity_bytes']):>10}: "
            f"{r['host_hit_tokens'] / r['prompt_tokens'] if r['prompt_tokens'] else 0:.2%} of "
            f"prompt tokens from the host, {_fmt_bytes(r['host_bytes_loaded'])} loaded "
            f"({r['host_load_seconds']:.1f} s), {_fmt_bytes(r['host_bytes_stored'])} stored, "
            f"{r['host_evictions']} chunks evicted"
            for r in doc["runs"])
    lines.extend(_against_stock(doc["runs"]))
    for b in doc["bound"]:
        lines.append(f"infinite-capacity bound (block size {b['block_size']}): "
                     f"{b['token_hit_rate']:.2%} token hit rate")
    skipped = {r["skipped_requests"] for r in doc["runs"]}
    if skipped != {0}:
        lines.append(f"requests skipped because they never fit the pool: {sorted(skipped)}")
    return "\n".join(lines)


def _against_stock(runs: list[dict[str, Any]]) -> list[str]:
    """One line per pair chosen online (``auto``): its token hit rate beside stock
    (:func:`~vllm_admission.core.adaptive.stock_pair`: ``vllm`` + ``lru``) at each
    capacity both ran, and the pair it ended with."""
    pair = stock_pair()
    stock = {r["capacity_bytes"]: r for r in runs
             if (r["admission"], r["eviction"]) == (pair.admission, pair.eviction)}
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        if "auto" in (r["admission"], r["eviction"]) and r["capacity_bytes"] in stock:
            pairs.setdefault((r["admission"], r["eviction"]), []).append(r)
    lines = []
    for (adm, ev), rs in pairs.items():
        cells = []
        for r in rs:
            base = stock[r["capacity_bytes"]]["token_hit_rate"]
            ratio = f" ({r['token_hit_rate'] / base:.2f}x)" if base else ""
            cells.append(f"{_fmt_bytes(r['capacity_bytes'])} {r['token_hit_rate']:.2%} vs "
                         f"{base:.2%}{ratio}, ends as {r.get('final_policy') or '-'}")
        lines.append(f"{adm}+{ev} against stock {pair}: " + "; ".join(cells))
    return lines


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n}B"


def plot_hit_rates(doc: dict[str, Any], path: str | os.PathLike) -> Path:
    """Token hit rate against capacity, one line per policy pair, plus the bound."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    pairs: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in doc["runs"]:
        pairs.setdefault((r["admission"], r["eviction"]), []).append(
            (r["capacity_bytes"], r["token_hit_rate"]))
    admissions = list(dict.fromkeys(adm for adm, _ in pairs))
    colours = {a: f"C{i}" for i, a in enumerate(admissions)}
    # One line style per eviction policy, in registry order.
    looks = [("-", "o"), ("--", "s"), ("-.", "D"), (":", "^"), ((0, (1, 1)), "v")]
    styles = {name: looks[i % len(looks)] for i, name in enumerate(EVICTION_POLICIES)}
    for (adm, ev), pts in pairs.items():
        pts.sort()
        line, marker = styles.get(ev, ("-.", "x"))
        ax.plot([p[0] / (1 << 30) for p in pts], [100 * p[1] for p in pts], color=colours[adm],
                linestyle=line, marker=marker, markersize=4, label=f"{adm} + {ev}")
    for b in doc["bound"]:
        ax.axhline(100 * b["token_hit_rate"], color="black", linestyle="--", linewidth=1,
                   label=f"infinite-capacity bound (B={b['block_size']})")
    ax.set_xscale("log", base=2)
    caps = sorted({r["capacity_bytes"] / (1 << 30) for r in doc["runs"]})
    ax.set_xticks(caps)
    ax.set_xticklabels([f"{c:g}" for c in caps])
    ax.minorticks_off()
    ax.set_xlabel("KV cache capacity (GiB)")
    ax.set_ylabel("token hit rate (%)")
    state = f", SSM state {doc['ssm_dtype']}" if doc.get("ssm_dtype") else ""
    ax.set_title(f"{doc['model']} on {doc['trace']}{state}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def check_writable(out_dir: str | os.PathLike) -> None:
    """Create ``out_dir`` if needed and check that a file can be written there, so that a
    sweep fails before it runs, not after.

    Raises:
        OutputDirError: the directory cannot be created or written (the message names
            it); a UserError and an OSError.
    """
    import tempfile

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise OutputDirError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


def write_results(doc: dict[str, Any], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``results.json`` and ``hit_rate.png`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = out / "results.json"
    res.write_text(json.dumps(doc, indent=2) + "\n")
    png = plot_hit_rates(doc, out / "hit_rate.png")
    return res, png
