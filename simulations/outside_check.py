"""An outside check: libCacheSim's policies on the flat stream of attention block hashes.

The trace is re-blocked at the model's block size (vLLM's hybrid-aligned size,
544 tokens for Qwen3-Next) and flattened into one access per prompt block: the
chained block hashes of every request's full prompt blocks, request after
request. Output tokens are left out (on Mooncake they are never reused: the
trace does not record them). Every access is an object of the same size: one
block of attention KV (``block_size`` tokens of every attention layer). A
capacity of ``C`` bytes holds ``C // block_bytes`` such blocks; for Qwen3-Next
that is exactly the hybrid pool's block count at ``C``, since one block id there
holds one attention block.

Four views of the same stream at the same bytes:

* **libCacheSim** (PyPI ``libcachesim``, imported only here): LRU, S3-FIFO,
  SIEVE, ARC, LFU and Bélády (``Belady``: evicts the object whose next access is
  farthest, every miss admitted; exact MIN with equal sizes. ``BeladySize``
  samples and weighs sizes: not used);
* **project, flat**: the same per-access cache driven by this project's
  eviction policy objects (``lru``, ``lfu``, ``belady`` with next use counted in
  accesses, ``reuse``): where the policy is the same, the hits must be the same;
* **project, pooled** (attention only): the project's ``BlockPool`` serving one
  request at a time as vLLM's prefix cache does (a prefix hit is the longest
  run of cached leading blocks, capped at ``prompt_len - 1`` tokens; the misses
  are allocated, evicting in the policy's order; the request's blocks are freed
  tail first). The *any-block* pooled views also count cached blocks after a
  miss (no prefix rule), to split the gap to the flat stream into its causes;
* **hybrid**: the project's simulator on the hybrid model (attention + recurrent
  state groups from one pool of the same bytes), for the given policy pairs.

Usage: ``python simulations/outside_check.py [--max-requests N] [--capacity 32GiB,...]
[--pairs vllm+lru,...] [--out docs/results/outside]`` (whole Mooncake trace,
six capacities, four hybrid pairs: about 6 minutes on 2 cores). Needs
``libcachesim`` (``pip install -e '.[study]'``). Writes ``outside_check.json`` and
``outside_check.md`` under ``--out``; docs/outside-check.md discusses them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_admission.core.admission import UnknownPolicyError
from vllm_admission.core.cache.block_pool import BlockPool
from vllm_admission.core.cache_inputs import CacheRequest, NextUseOracle
from vllm_admission.core.costs import ModelConfigError, load_model
from vllm_admission.core.eviction import get_eviction
from vllm_admission.core.geometry import aligned_block_size, parse_bytes
from vllm_admission.core.traces import TraceError, load_trace
from vllm_admission.sim.simulator import cache_requests

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MODEL = "qwen3-next-80b-a3b"
CAPACITIES = ("32GiB", "64GiB", "128GiB", "256GiB", "512GiB", "1TiB")
PAIRS = ("vllm+lru", "marconi+flop", "auto+auto", "vllm+belady")
#: Column name -> libCacheSim class name.
LIBCACHESIM = {"LRU": "LRU", "S3-FIFO": "S3FIFO", "SIEVE": "Sieve", "ARC": "ARC",
               "LFU": "LFU", "Belady": "Belady"}
#: Project policies replayed on the flat stream, and their libCacheSim counterparts.
FLAT = {"lru": "LRU", "lfu": "LFU", "belady": "Belady", "reuse": None}
#: Project policies replayed through the attention-only block pool.
POOLED = ("lru", "belady", "reuse")
#: Never accessed again (libCacheSim's convention for Bélády).
NEVER = 2**63 - 1
LIBCACHESIM_VERSION = "0.3.5"


class MissingDependency(RuntimeError):
    """An optional package this study needs is not installed."""


def import_libcachesim():
    """The ``libcachesim`` module.

    Raises:
        MissingDependency: not installed (the message says how to install it).
    """
    try:
        import libcachesim
    except ImportError:
        raise MissingDependency(
            f"libcachesim is not installed: pip install 'libcachesim=={LIBCACHESIM_VERSION}' "
            f"(or the project's extra: pip install -e '.[study]')") from None
    return libcachesim


@dataclass(frozen=True)
class FlatStream:
    """The flat access stream of one trace at one block size.

    Attributes:
        requests: the requests as the cache model sees them (hashes at ``block_tokens``).
        keys: one dense object id per access (equal ids = equal block hashes),
            request after request, blocks in prompt order.
        next_access: per access, the index of the next access to the same key,
            or :data:`NEVER`.
        block_tokens: tokens per block.
        block_bytes: bytes of one block of attention KV (all attention layers).
        prompt_tokens: prompt tokens of all requests (partial blocks included).
    """

    requests: list[CacheRequest]
    keys: list[int]
    next_access: list[int]
    block_tokens: int
    block_bytes: int
    prompt_tokens: int

    @property
    def unique_blocks(self) -> int:
        return len(set(self.keys))


def build_stream(trace, costs) -> FlatStream:
    """The flat stream of ``trace`` at ``costs``' vLLM block size.

    Block size: :func:`~vllm_admission.core.geometry.aligned_block_size` (the
    hybrid alignment rule); block bytes: ``block_size`` x the attention layers'
    KV bytes per token summed (``LayerCost.kv_bytes_per_token``).
    """
    block = aligned_block_size(costs)
    block_bytes = block * sum(layer.kv_bytes_per_token for layer in costs.attention_layers)
    requests = cache_requests(trace, block, "unique")
    ids: dict[Any, int] = {}
    keys = [ids.setdefault(h, len(ids)) for req in requests for h in req.hashes]
    next_access = [NEVER] * len(keys)
    seen: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        next_access[i] = seen.get(keys[i], NEVER)
        seen[keys[i]] = i
    return FlatStream(requests, keys, next_access, block, block_bytes,
                      sum(r.prompt_len for r in requests))


# -- the four views -------------------------------------------------------------
def libcachesim_hits(lcs, algorithm: str, stream: FlatStream, capacity_bytes: int) -> bytearray:
    """Per access, 1 if libCacheSim's ``algorithm`` (a class name) hit it.

    Each access is ``cache.get`` of a request with the object's id, the block
    bytes as its size and, for Bélády, its next access index.
    """
    cache = getattr(lcs, algorithm)(capacity_bytes)
    req = lcs.Request()
    req.obj_size = stream.block_bytes
    hits = bytearray(len(stream.keys))
    get = cache.get
    for i, (key, nxt) in enumerate(zip(stream.keys, stream.next_access, strict=True)):
        req.obj_id = key
        req.next_access_vtime = nxt
        req.clock_time = i
        if get(req):
            hits[i] = 1
    return hits


def flat_hits(policy_name: str, stream: FlatStream, capacity_bytes: int) -> bytearray:
    """Per access, 1 on a hit, for a per-access cache ordered by a project policy.

    Every cached block is an eviction candidate. A hit takes it out of the
    policy (``remove``, ``on_hit``) and puts it back as just freed (``add``);
    a miss pops the policy's victim when the cache is full and adds the new
    block (``on_cache`` first, for a policy that reads keys). Time is the access
    index; ``belady`` is given the next access of the block's hash, in
    accesses (every predicted access touches the block, so none goes stale).
    """
    policy = get_eviction(policy_name)
    capacity = capacity_bytes // stream.block_bytes
    block_of: dict[int, int] = {}
    key_of: list[int] = []
    hits = bytearray(len(stream.keys))
    for i, (key, nxt) in enumerate(zip(stream.keys, stream.next_access, strict=True)):
        nu = math.inf if nxt == NEVER else float(nxt)
        b = block_of.get(key)
        if b is not None:
            hits[i] = 1
            policy.remove(b)
            if policy.needs_hits:
                policy.on_hit(b, i)
            policy.add(b, i, 0.0, nu)
            continue
        if len(block_of) >= capacity:
            b = policy.pop(i)
            del block_of[key_of[b]]
            key_of[b] = key
        else:
            b = len(key_of)
            key_of.append(key)
        block_of[key] = b
        if policy.needs_keys:
            policy.on_cache(b, (0, key))
        policy.add(b, i, 0.0, nu)
    return hits


def pooled_hits(policy_name: str, stream: FlatStream, capacity_bytes: int, *,
                prefix: bool = True) -> list[int]:
    """Per request, the blocks served from an attention-only prefix cache.

    The project's :class:`~vllm_admission.core.cache.block_pool.BlockPool`
    with ``capacity_bytes // block_bytes`` usable blocks (plus vLLM's null
    block) and one KV cache group, one request at a time, prompt blocks only:
    touch the hit, allocate the other blocks (uncached free blocks first, then
    the policy's victims) and cache them under their hashes (a recomputed hash
    still cached further on is a duplicate, as in vLLM), then free all the
    request's blocks tail first. ``prefix``: the hit is the longest run of
    cached leading blocks, capped at ``prompt_len - 1`` tokens (vLLM); without
    it every cached block of the prompt is a hit. Time is the request index;
    ``belady`` reads the next request whose prompt has the hash, as in the
    simulator (:class:`~vllm_admission.core.cache_inputs.NextUseOracle`).

    Raises:
        ValueError: a prompt has more full blocks than the pool.
    """
    policy = get_eviction(policy_name)
    capacity = capacity_bytes // stream.block_bytes
    pool = BlockPool(capacity + 1, policy, 1)
    index, keys, B = pool.index[0], pool.key, stream.block_tokens
    oracle = None
    if policy.needs_future:
        oracle = NextUseOracle(stream.requests)
        policy.bind_future(lambda b, now: oracle(keys[b], now))
    out: list[int] = []
    for r, req in enumerate(stream.requests):
        hashes = req.hashes
        if len(hashes) > capacity:
            raise ValueError(f"request {r} has {len(hashes)} blocks, the pool {capacity}")
        if prefix:
            cap, k = min((req.prompt_len - 1) // B, len(hashes)), 0
            while k < cap and hashes[k] in index:
                k += 1
            hit = list(range(k))
        else:
            hit = [i for i, h in enumerate(hashes) if h in index]
        blocks = [0] * len(hashes)
        for i in hit:
            blocks[i] = index[hashes[i]]
        pool.touch([blocks[i] for i in hit], r)
        missed = [i for i in range(len(hashes)) if not blocks[i]]
        new = pool.allocate(len(missed), r)
        for i, b in zip(missed, new, strict=True):
            blocks[i] = b
        pool.cache_many(0, new, [hashes[i] for i in missed])
        if oracle is not None:
            for b in blocks:
                pool.next_use[b] = oracle(keys[b], r)
        pool.free(blocks[::-1], r)
        out.append(len(hit))
    return out


def hybrid_runs(trace_path: str, model: str, capacities: Sequence[int], pairs: Sequence[str],
                max_requests: int | None, jobs: int) -> dict[tuple[str, int], dict[str, Any]]:
    """The project's simulator on the hybrid model: ``(pair, capacity) -> run record``."""
    from vllm_admission.sim.sweep import SweepSpec, run_sweep

    split = tuple(tuple(p.split("+", 1)) for p in pairs)
    spec = SweepSpec(trace=trace_path, model=model, capacities=tuple(capacities), admissions=(),
                     evictions=(), chunk_size=8192, max_requests=max_requests, pairs=split)
    doc = run_sweep(spec, jobs=jobs, progress=False)
    return {(f"{r['admission']}+{r['eviction']}", r["capacity_bytes"]): r for r in doc["runs"]}


# -- figures ----------------------------------------------------------------------
def rates(hit_blocks: int, stream: FlatStream) -> dict[str, float]:
    """Object and byte hit ratio (equal: one size), and the token hit rate
    (hit blocks x block tokens / prompt tokens, the project's measure)."""
    n = len(stream.keys)
    return {"hit_blocks": hit_blocks,
            "object_hit_ratio": hit_blocks / n if n else 0.0,
            "byte_hit_ratio": hit_blocks * stream.block_bytes / (n * stream.block_bytes) if n else 0.0,
            "token_hit_rate": hit_blocks * stream.block_tokens / stream.prompt_tokens}


def compare(a: bytearray, b: bytearray) -> dict[str, int]:
    """How two per-access hit vectors differ: accesses that differ, hits each."""
    return {"accesses_differing": sum(x != y for x, y in zip(a, b, strict=True)),
            "hits_a": sum(a), "hits_b": sum(b)}


def run_check(stream: FlatStream, capacity_bytes: int, lcs) -> dict[str, Any]:
    """Every flat and pooled view at one capacity, with the flat agreement figures."""
    row: dict[str, Any] = {"capacity_bytes": capacity_bytes,
                           "blocks": capacity_bytes // stream.block_bytes,
                           "libcachesim": {}, "project_flat": {}, "project_pooled": {},
                           "project_pooled_any_block": {}, "agreement": {}, "seconds": {}}
    outside: dict[str, bytearray] = {}
    for column, cls in LIBCACHESIM.items():
        t0 = time.perf_counter()
        outside[cls] = libcachesim_hits(lcs, cls, stream, capacity_bytes)
        row["seconds"][f"libcachesim {column}"] = time.perf_counter() - t0
        row["libcachesim"][column] = rates(sum(outside[cls]), stream)
    for name, twin in FLAT.items():
        t0 = time.perf_counter()
        ours = flat_hits(name, stream, capacity_bytes)
        row["seconds"][f"flat {name}"] = time.perf_counter() - t0
        row["project_flat"][name] = rates(sum(ours), stream)
        if twin:
            row["agreement"][f"{name} vs {twin}"] = compare(ours, outside[twin])
    for name in POOLED:
        for key, prefix in (("project_pooled", True), ("project_pooled_any_block", False)):
            if not prefix and name == "reuse":
                continue
            t0 = time.perf_counter()
            hit = sum(pooled_hits(name, stream, capacity_bytes, prefix=prefix))
            row["seconds"][f"{key} {name}"] = time.perf_counter() - t0
            row[key][name] = rates(hit, stream)
    return row


def add_hybrid(row: dict[str, Any], runs: dict, pairs: Sequence[str]) -> None:
    """Put the hybrid runs at ``row``'s capacity into it: token hit rate, and the
    attention-KV hit (hit + state-miss tokens) the hybrid pool still held."""
    row["hybrid"] = {}
    for pair in pairs:
        r = runs[(pair, row["capacity_bytes"])]
        row["hybrid"][pair] = {
            "token_hit_rate": r["token_hit_rate"],
            "kv_hit_rate": (r["hit_tokens"] + r["state_miss_tokens"]) / r["prompt_tokens"],
            "num_blocks": r["num_blocks"], "state_checkpoints": r["state_checkpoints"],
            "final_policy": r.get("final_policy"), "wall_seconds": r["wall_seconds"]}


# -- report ---------------------------------------------------------------------
def _cap(num_bytes: int) -> str:
    return f"{num_bytes // 2**40} TiB" if num_bytes % 2**40 == 0 else f"{num_bytes // 2**30} GiB"


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def markdown(doc: dict[str, Any]) -> str:
    """The three tables of docs/outside-check.md (token hit rate, %)."""
    rows = doc["capacities"]
    lines = [f"Trace `{doc['trace']}` ({doc['requests']} requests, {doc['accesses']} block accesses, "
             f"{doc['unique_blocks']} distinct blocks), model `{doc['model']}`, block "
             f"{doc['block_tokens']} tokens = {doc['block_bytes']} bytes of attention KV; "
             f"libcachesim {doc['libcachesim_version']}; {doc['date']}.", "",
             "Flat stream, token hit rate % (object hit ratio % in brackets; byte hit ratio = "
             "object hit ratio, one size):", "",
             "| capacity | blocks | " + " | ".join(LIBCACHESIM) + " |",
             "|---" * (2 + len(LIBCACHESIM)) + "|"]
    for row in rows:
        cells = [f"{_pct(v['token_hit_rate'])} ({_pct(v['object_hit_ratio'])})"
                 for v in row["libcachesim"].values()]
        lines.append(f"| {_cap(row['capacity_bytes'])} | {row['blocks']} | " + " | ".join(cells) + " |")
    lines += ["", "Agreement on the flat stream (project policy object vs libcachesim; accesses "
              "whose hit differs, of all accesses):", "",
              "| capacity | " + " | ".join(f"{n} vs {t}" for n, t in FLAT.items() if t)
              + " | project `reuse` |", "|---" * (2 + sum(1 for t in FLAT.values() if t)) + "|"]
    for row in rows:
        cells = []
        for name, twin in FLAT.items():
            if not twin:
                continue
            a = row["agreement"][f"{name} vs {twin}"]
            cells.append(f"{_pct(row['project_flat'][name]['token_hit_rate'])} / "
                         f"{_pct(row['libcachesim'][twin]['token_hit_rate'])}, "
                         f"{a['accesses_differing']} differ")
        cells.append(_pct(row["project_flat"]["reuse"]["token_hit_rate"]))
        lines.append(f"| {_cap(row['capacity_bytes'])} | " + " | ".join(cells) + " |")
    pairs = list(rows[0].get("hybrid", {}))
    head = (["flat Bélády", "flat LRU", "any-block lru", "prefix lru", "any-block belady",
             "prefix belady", "prefix reuse"] + [f"hybrid {p}" for p in pairs])
    lines += ["", "From the flat optimum to the hybrid cache, token hit rate % (hybrid: hit, "
              "and in brackets the attention KV the pool held for it, hit + state miss):", "",
              "| capacity | " + " | ".join(head) + " |", "|---" * (1 + len(head)) + "|"]
    for row in rows:
        pooled, anyb = row["project_pooled"], row["project_pooled_any_block"]
        cells = [row["libcachesim"]["Belady"], row["libcachesim"]["LRU"], anyb["lru"],
                 pooled["lru"], anyb["belady"], pooled["belady"], pooled["reuse"]]
        text = [_pct(c["token_hit_rate"]) for c in cells]
        for p in pairs:
            h = row["hybrid"][p]
            text.append(f"{_pct(h['token_hit_rate'])} ({_pct(h['kv_hit_rate'])})")
        lines.append(f"| {_cap(row['capacity_bytes'])} | " + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def check(trace_path: str, model: str, capacities: Sequence[int], *, max_requests: int | None = None,
          pairs: Sequence[str] = PAIRS, jobs: int = 2, progress: bool = True) -> dict[str, Any]:
    """The whole check: the results document (see :func:`markdown` for its tables).

    Raises:
        MissingDependency: libcachesim is not installed.
        TraceError, ModelConfigError, UnknownPolicyError: bad input.
        ValueError: a capacity below the longest prompt's blocks (or below one block).
    """
    lcs = import_libcachesim()
    trace = load_trace(trace_path, max_requests=max_requests)
    costs = load_model(model)
    stream = build_stream(trace, costs)
    longest = max((len(r.hashes) for r in stream.requests), default=0)
    for cap in capacities:
        if cap // stream.block_bytes < max(longest, 1):
            raise ValueError(f"capacity {cap} bytes holds {cap // stream.block_bytes} blocks of "
                             f"{stream.block_bytes} bytes; the longest prompt needs {longest}")
    runs = hybrid_runs(trace_path, model, capacities, pairs, max_requests, jobs) if pairs else {}
    rows = []
    for cap in capacities:
        row = run_check(stream, cap, lcs)
        if pairs:
            add_hybrid(row, runs, pairs)
        rows.append(row)
        if progress:
            print(f"{_cap(cap)}: done", file=sys.stderr)
    return {"date": datetime.date.today().isoformat(), "trace": Path(trace_path).name,
            "model": costs.name, "requests": len(stream.requests), "accesses": len(stream.keys),
            "unique_blocks": stream.unique_blocks, "prompt_tokens": stream.prompt_tokens,
            "block_tokens": stream.block_tokens, "block_bytes": stream.block_bytes,
            "libcachesim_version": getattr(lcs, "__version__", "?"), "capacities": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE), help="Mooncake or token JSONL trace (default: Mooncake)")
    ap.add_argument("--model", default=MODEL, help=f"hybrid model config (default {MODEL})")
    ap.add_argument("--capacity", default=",".join(CAPACITIES), help="comma list of KV cache bytes")
    ap.add_argument("--max-requests", type=int, default=None, help="first N requests only")
    ap.add_argument("--pairs", default=",".join(PAIRS),
                    help="hybrid ADMISSION+EVICTION pairs for the simulator ('' for none)")
    ap.add_argument("--jobs", type=int, default=2, help="processes for the hybrid runs")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "outside"))
    args = ap.parse_args(argv)
    try:
        caps = [parse_bytes(c) for c in args.capacity.split(",") if c]
        pairs = [p for p in args.pairs.split(",") if p]
        bad = [p for p in pairs if p.count("+") != 1]
        if bad:
            raise ValueError(f"pairs are ADMISSION+EVICTION, got {', '.join(bad)}")
        doc = check(args.trace, args.model, caps, max_requests=args.max_requests, pairs=pairs,
                    jobs=args.jobs)
    except (MissingDependency, TraceError, ModelConfigError, UnknownPolicyError, ValueError) as exc:
        print(f"outside_check: {exc}", file=sys.stderr)
        return 2
    doc["command"] = " ".join(["python simulations/outside_check.py",
                               *(argv if argv is not None else sys.argv[1:])])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "outside_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    table = markdown(doc)
    (out / "outside_check.md").write_text(table)
    print(table)
    print(f"wrote {out / 'outside_check.json'} and {out / 'outside_check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
