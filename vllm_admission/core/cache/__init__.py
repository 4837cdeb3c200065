"""A block-level model of vLLM 0.32's prefix cache for hybrid models (align mode).

:class:`BlockPool` mirrors ``vllm/v1/core/block_pool.py`` where prefix hits are
concerned: one pool of blocks shared by every KV cache group; a block hash maps
to the cached blocks that hold it (duplicates allowed, the first inserted is
returned); blocks without a hash are reused first (vLLM prepends them to
``free_block_queue``); cached free blocks wait in the eviction policy's order.

:class:`HybridPrefixCache` runs one request at a time through the same steps as
vLLM's scheduler and KV cache manager, for a model with full-attention groups
and recurrent-state (Mamba / GDN) groups:

1. lookup (``HybridKVCacheCoordinator.find_longest_cache_hit``): the longest
   run of cached attention blocks, capped at ``prompt_len - 1`` tokens, then the
   longest prefix within it whose state is cached in every state group;
2. touch the hit blocks (``add_local_computed_blocks``);
3. prefill in chunks of at most ``chunk_size`` tokens. In ``split`` checkpoint
   mode (vLLM 0.32) each chunk is clipped by
   ``Scheduler._mamba_block_aligned_split`` (block-aligned chunk ends, a stop
   at the prompt's last reusable block boundary, the admission policy's
   stops); in ``inpass`` mode (see :data:`CHECKPOINT_MODES`) only the token
   budget and the prompt end end a chunk, and the states at those checkpoint
   positions are captured inside the chunk's forward pass;
4. per step: free retired state blocks (``MambaManager.remove_skipped_blocks``),
   allocate (``allocate_new_blocks``: one new state block per group per step,
   attention blocks for every new token), cache the now-full blocks
   (``cache_blocks``; a state block is cached only if the admission policy
   admits its position);
5. decode ``output_len - 1`` steps of one token;
6. free every block, group by group, each group's blocks in reverse
   (``SingleTypeKVCacheManager.free``).

The :class:`~vllm_admission.core.layout.CacheLayout` a cache is built with turns on the
rest of what vLLM 0.32 does: speculative decoding (``speculation``: EAGLE/MTP's dropped
block and lower checkpoints, ``extract_hidden_states``' hidden-state group), a hash
block finer than the block (``pool.hash_block_size``: hits inside a block, ``split``
mode), a state group's own prompt-end export and async scheduling (``scheduling``),
a host tier (``host``); vLLM's retention interval is the admission policy's
(``VllmAdmission``). ``docs/simulator.md`` lists these facts with their sources; the
plugin refuses, before the model loads, the settings outside them that need the model
(docs/plugin.md, "What runs where").

Layout, after vLLM v1's core (``block_pool.py``, ``single_type_kv_cache_manager.py``,
``kv_cache_coordinator.py``):

* :mod:`~vllm_admission.core.cache.block_pool`: :class:`BlockPool`, the block ids,
  reference counts and the hash index (one insertion path, one drop path);
* :mod:`~vllm_admission.core.cache.running`: a running request's bookkeeping
  (``RunningRequest``) and the step interface the checkpoint strategies drive
  (``StepRunner``);
* :mod:`~vllm_admission.core.cache.groups`: one part per KV cache group kind
  (attention, state), chosen by :data:`~vllm_admission.core.cache.groups.GROUP_PARTS`;
* :mod:`~vllm_admission.core.cache.checkpoint`: the chunk-end rule
  (:func:`chunk_end`, shared with the plugin) and the checkpoint modes
  (:data:`CHECKPOINT_MODES`), one strategy object each;
* :mod:`~vllm_admission.core.cache.values`: the FLOP value (Marconi's valuation,
  :mod:`vllm_admission.core.block_values`) and next use a freed block carries to the
  eviction policy;
* :mod:`~vllm_admission.core.cache.model`: :class:`HybridPrefixCache`, which
  composes them and runs the steps above.
"""

from vllm_admission.core.cache.block_pool import NULL, BlockPool, PoolExhausted
from vllm_admission.core.cache.checkpoint import (
    CHECKPOINT_MODES,
    check_checkpoint_mode,
    chunk_end,
    split_chunk,
)
from vllm_admission.core.cache.model import HybridPrefixCache, RequestOutcome
from vllm_admission.core.layout import ATTENTION, DEFAULT_CHECKPOINT, STATE

__all__ = ["ATTENTION", "CHECKPOINT_MODES", "DEFAULT_CHECKPOINT", "NULL", "STATE", "BlockPool", "HybridPrefixCache",
           "PoolExhausted", "RequestOutcome", "check_checkpoint_mode", "chunk_end", "split_chunk"]
