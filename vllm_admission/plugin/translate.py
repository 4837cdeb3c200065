"""vLLM's blocks, block hashes and requests in the core's terms.

The core names a block by an integer key and a request by its keys and two
lengths (:class:`~vllm_admission.core.cache_inputs.CacheRequest`); vLLM names them
by ``BlockHash`` bytes, ``KVCacheBlock`` objects and ``Request`` objects. The
functions here are the one place that maps one onto the other, so the keys
the shadows and the alpha tuner are fed, the keys an eviction policy hears and
the keys a switch of ``auto`` compares are the same.

A core block is one scheduler block (``block_size`` tokens); vLLM hashes in
hash blocks of ``hash_block_size`` tokens, ``hashes_per_block`` of them per block
(:attr:`PoolSpec.hashes_per_block <vllm_admission.core.layout.PoolSpec.hashes_per_block>`).
A block's key is that of its last hash block, which covers the whole prefix
up to the block's end (chained hashes, ``vllm/v1/core/kv_cache_utils.py``).

This module imports no vLLM: it reads the objects' documented fields only.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

from vllm_admission.core.cache_inputs import CacheRequest

__all__ = ["block_hash_at", "cache_request", "counts_in_prefix_cache_stats", "unheld_by_shadow",
           "hash_key", "prompt_block_keys"]


def hash_key(block_hash: Any) -> int:
    """The core's integer key of a vLLM block hash: its first 8 bytes, big-endian.

    ``block_hash`` is a ``BlockHash`` or a ``BlockHashWithGroupId`` (the hash
    bytes followed by the 4-byte group id, ``vllm/v1/core/kv_cache_utils.py``):
    both start with the same bytes. The simulator's requests built from the
    engine (:class:`~vllm_admission.core.cache_inputs.CacheRequest`) use these keys.
    """
    return int.from_bytes(bytes(block_hash)[:8], "big")


def block_hash_at(block_hashes: Sequence[Any], index: int, hashes_per_block: int) -> Any | None:
    """The vLLM hash of core block ``index`` (0-based) of a request: its last hash
    block's, ``block_hashes[(index + 1) * hashes_per_block - 1]``; ``None`` when the
    request has no hash that far yet."""
    k = (index + 1) * hashes_per_block - 1
    return block_hashes[k] if k < len(block_hashes) else None


def prompt_block_keys(block_hashes: Sequence[Any], prompt_len: int, block_size: int,
                      hashes_per_block: int) -> list[int]:
    """The keys (:func:`hash_key`) of the full blocks of a prompt of ``prompt_len``
    tokens, as far as ``block_hashes`` reaches."""
    n = min(prompt_len // block_size, len(block_hashes) // hashes_per_block)
    return [hash_key(block_hashes[(i + 1) * hashes_per_block - 1]) for i in range(n)]


def cache_request(request: Any, prompt_len: int, block_size: int, hashes_per_block: int,
                  sub_block: bool = False) -> CacheRequest:
    """A finished vLLM ``Request`` as the core's cache sees it: its prompt's block
    keys, ``prompt_len`` and its generated tokens (``num_output_tokens``); with
    ``sub_block`` (vLLM's partial hash hits: a hash block size below the block size) also
    the keys of every hash block of the prompt, ``CacheRequest.units``, from the same
    chain as the block keys."""
    hashes = request.block_hashes
    keys = prompt_block_keys(hashes, prompt_len, block_size, hashes_per_block)
    units = None
    if sub_block:
        units = [hash_key(h) for h in hashes[:prompt_len * hashes_per_block // block_size]]
    return CacheRequest(keys, prompt_len, request.num_output_tokens, units)


def counts_in_prefix_cache_stats(request: Any) -> bool:
    """Whether a request's admission counts in the plugin's request and token counters.

    As in vLLM's prefix-cache counters (``vllm:prefix_cache_queries`` /
    ``_hits``: ``KVCacheManager.record_prefix_cache_stats`` in
    ``vllm/v1/core/kv_cache_manager.py``, ``PrefixCacheStats.record`` in
    ``vllm/v1/metrics/stats.py``), only a request's first admission counts: one
    admitted again after a preemption (``request.num_preemptions > 0``) is left
    out, and so is one that skips the prefix-cache lookup
    (``request.skip_reading_prefix_cache``). vLLM's ``num_cached_tokens`` is
    also set at the first admission only.
    """
    return (not getattr(request, "num_preemptions", 0)
            and not getattr(request, "skip_reading_prefix_cache", False))


def unheld_by_shadow(held: Sequence[Container] | None,
            group_of: Callable[[Any], int]) -> Callable[[Any], bool] | None:
    """``f(block) -> bool`` for the free queue's switch under ``auto``: whether a
    free cached block goes first, because the new pair's shadow does not hold its
    hash.

    Args:
        held: per KV cache group, the shadow's prompt block keys
            (:meth:`HybridPrefixCache.held_keys
            <vllm_admission.core.cache.HybridPrefixCache.held_keys>`); ``None``:
            nothing goes first.
        group_of: ``f(block) -> KV cache group index`` of a cached block.

    The key compared is the one the shadows were fed (:func:`hash_key` of the
    block's hash, which for a block of several hash blocks is its last one's,
    as :func:`prompt_block_keys` takes it).
    """
    if held is None:
        return None

    def demote(block: Any) -> bool:
        return hash_key(block.block_hash) not in held[group_of(block)]
    return demote
