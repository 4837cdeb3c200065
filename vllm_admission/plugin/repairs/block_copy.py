"""Whole-page block copies for hybrid KV caches (vLLM 0.32, any platform).

A prefix hit that ends inside a block (``prefix_match_unit`` below the block size) gives
the request a private copy of that block in every KV cache group: the scheduler queues
``(source, copy)`` block pairs and the model runner copies them before the forward pass
(``v1/worker/utils.py`` ``copy_kv_cache_blocks_inplace``, called from
``GPUModelRunner._update_states``). In a hybrid model one attention layer and one Mamba
layer share each page of memory, the Mamba view covering only its state bytes of the
page (vLLM pads the state page up to the attention page). vLLM's copy walks the views,
skips a view whose ``data_ptr`` it has seen ("layers sharing KV alias the same view"),
and copies through the first: where that is the Mamba view, only the state's bytes of
each page move, so a copied attention block keeps stale bytes past them. On vLLM 0.32's
CPU build with the tiny Qwen3-Next model (float32 state: 68,608 of each 131,072-byte
page) a resend that hits inside a block then gives other greedy tokens than the cold run
from the first token on; with whole pages copied they are the cold run's
(docs/engine-facts.md, section 10).

:func:`copy_pages` is the copy with whole pages: one copy per distinct page region
(storage, offset, page stride), each block's full page. :func:`install` puts it in the
runner's place (:func:`vllm_admission.plugin.boundary.hooks.install_block_copy`), where the
other vLLM fixes go (:func:`vllm_admission.plugin.boundary.register.install_vllm_fixes`).

Upstream: vLLM PR #55112 ("[Bugfix][Core] Copy every overlaid KV view in
copy_kv_cache_blocks_inplace", open as of 2026-11) copies every view of a shared allocation;
once it is in a supported release this module, and
:func:`~vllm_admission.plugin.boundary.hooks.install_block_copy`, can go.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["copy_pages", "install", "installed"]


def copy_pages(kv_caches: Iterable[Any], num_blocks: int, copies: Sequence[Any]) -> None:
    """Copy each ``(src_block_id, dst_block_id)`` pair of ``copies`` in every page region
    the ``kv_caches`` views cover, whole pages (vLLM's ``copy_kv_cache_blocks_inplace``
    signature and block-id convention).

    Args:
        kv_caches: the runner's KV cache tensors, block (or kernel block) first, any
            dtype; views of one storage at one offset with one page stride are one region.
        num_blocks: scheduler blocks in the pool (``kv_cache_config.num_blocks``).
        copies: ``KVCacheBlockCopy`` items (``src_block_id``, ``dst_block_id``).

    Raises:
        ValueError: a view's first dimension is not a multiple of ``num_blocks``.
    """
    if not copies:
        return
    import torch

    src = [c.src_block_id for c in copies]
    dst = [c.dst_block_id for c in copies]
    done: set[tuple[int, int, int]] = set()
    for cache in kv_caches:
        per_block, rest = divmod(cache.shape[0], num_blocks)
        if rest:
            raise ValueError(f"a KV cache view of {cache.shape[0]} blocks is not a multiple "
                             f"of the pool's {num_blocks} blocks")
        page = cache.stride(0) * cache.element_size() * per_block  # bytes per block
        offset = cache.storage_offset() * cache.element_size()
        storage = cache.untyped_storage()
        region = (storage.data_ptr(), offset, page)
        if region in done:
            continue
        done.add(region)
        raw = torch.empty(0, dtype=torch.uint8, device=cache.device).set_(storage)
        rows = raw[offset:offset + num_blocks * page].view(num_blocks, page)
        rows[dst] = rows[src]


def install() -> None:
    """Put :func:`copy_pages` where vLLM's model runners call the block copy (once per
    process)."""
    from vllm_admission.plugin.boundary.hooks import install_block_copy

    install_block_copy(copy_pages)


def installed() -> bool:
    """Whether the runners copy whole pages in this process."""
    from vllm_admission.plugin.boundary.hooks import block_copy_installed

    return block_copy_installed()
