"""The cache's configuration: one frozen :class:`CacheLayout`, built once where a run
starts and passed whole.

After vLLM's own split (``vllm/config/``: one ``VllmConfig`` handed to every component,
made of a config per concern; ``vllm/v1/kv_cache_interface.py``: a ``KVCacheSpec`` per
group), a layout is made of four frozen parts:

* :class:`PoolSpec`: the block pool and its groups, and how blocks are hashed
  (``KVCacheConfig``, ``CacheConfig.prefix_match_unit`` /
  ``prefix_cache_retention_interval``);
* :class:`SchedulingSpec`: how the engine cuts work into steps
  (``SchedulerConfig.max_num_batched_tokens`` / ``async_scheduling``, the checkpoint mode);
* :class:`SpeculationSpec`: speculative decoding (``SpeculativeConfig``);
* :class:`HostTierSpec`: a host tier (the ``OffloadingConnector``).

The edges build it: the simulator (:func:`vllm_admission.sim.simulator.simulate`, from
its :class:`~vllm_admission.sim.simulation_settings.SimulationSettings`) and the plugin
(``EngineSetup._admission_geometry``, from the live scheduler). The cache model
(:class:`~vllm_admission.core.cache.HybridPrefixCache`), the run plan, the shadows and
the plugin's control read it.

A leaf module: it imports nothing of the package but :mod:`vllm_admission.core.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_admission.core.errors import UserError

#: The checkpoint mode unless the user chooses another: vLLM's own, a prefill chunk ending
#: at every kept state (``core/cache/checkpoint.py`` lists the modes).
DEFAULT_CHECKPOINT = "split"

__all__ = ["ATTENTION", "HIDDEN", "PER_TOKEN_KINDS", "STATE", "CacheLayout", "HostTierSpec",
           "PoolSpec", "SchedulingSpec", "SpeculationSpec", "check_hash_block_size",
           "check_retention_interval"]

#: The core's names of the KV cache group kinds: full attention (vLLM's ``FullAttentionSpec``),
#: recurrent state (``MambaSpec``) and per-token hidden states (``HiddenStateCacheSpec``, the
#: group ``extract_hidden_states`` speculative decoding writes, ``vllm/v1/kv_cache_interface.py``).
ATTENTION = "attention"
STATE = "state"
HIDDEN = "hidden"

#: The kinds reused at any cached block: a block per ``block_size`` tokens, every full block
#: keyed (vLLM runs both with ``FullAttentionManager``). They differ in what a block holds
#: (its bytes per token) and in what the counters name them.
PER_TOKEN_KINDS = (ATTENTION, HIDDEN)


def check_retention_interval(interval: int | None, block_size: int | None = None) -> None:
    """Refuse a retention interval vLLM refuses: it must be ``None`` or an integer >= 0,
    and a multiple of ``block_size`` when that is given
    (``_validate_prefix_cache_retention_interval``, ``vllm/v1/core/kv_cache_coordinator.py``).

    Raises:
        UserError: otherwise.
    """
    if interval is None:
        return
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
        raise UserError(f"prefix_cache_retention_interval ({interval!r}) must be None or an "
                        f"integer >= 0")
    if block_size is not None and interval % block_size:
        raise UserError(f"prefix_cache_retention_interval ({interval!r}) must be None or a "
                        f"non-negative multiple of the block size ({block_size})")


def check_hash_block_size(hash_block_size: int | None, block_size: int) -> int:
    """A pool's ``hash_block_size`` in tokens: ``hash_block_size``, or ``block_size`` for
    ``None`` (vLLM's ``prefix_match_unit`` unset).

    vLLM's rule (``resolve_kv_cache_block_sizes``, ``vllm/v1/core/kv_cache_utils.py``): it
    divides every group's block size.

    Raises:
        UserError: not a positive integer dividing ``block_size``.
    """
    if hash_block_size is None:
        return block_size
    if (isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int)
            or hash_block_size < 1 or block_size % hash_block_size):
        raise UserError(f"prefix_match_unit ({hash_block_size!r}) must be a positive divisor of "
                        f"the block size ({block_size}), as vLLM requires; a --block-size that "
                        f"is a multiple of it makes the aligned block one too")
    return hash_block_size


@dataclass(frozen=True)
class PoolSpec:
    """vLLM's one ``BlockPool``, its KV cache groups and how its blocks are hashed.

    Attributes:
        num_blocks: blocks in the pool, null block included (``KVCacheConfig.num_blocks``).
        block_size: tokens per block, every group (the scheduler's ``block_size``).
        group_kinds: :data:`ATTENTION` / :data:`STATE` / :data:`HIDDEN` per KV cache group,
            in vLLM's group order (an engine may report other kinds; the plugin refuses
            policies that cannot run with them).
        bytes_per_block: bytes one block id holds (the largest group's page x its layers).
        hash_block_size: tokens per block hash (vLLM's ``hash_block_size``, set by
            ``CacheConfig.prefix_match_unit``): a divisor of ``block_size``; ``None`` is
            stored as ``block_size``. Below it, hits may end inside a block.
        retention_interval: ``CacheConfig.prefix_cache_retention_interval``: 0 (vLLM's
            default), a positive multiple of ``block_size``, or ``None`` (dense). Only the
            ``vllm`` admission policy follows it.

    Raises:
        UserError: a retention interval or hash block size vLLM would refuse
            (:func:`check_retention_interval`, :func:`check_hash_block_size`).
    """

    num_blocks: int
    block_size: int
    group_kinds: tuple[str, ...]
    bytes_per_block: int = 1
    hash_block_size: int | None = None
    retention_interval: int | None = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_kinds", tuple(self.group_kinds))
        check_retention_interval(self.retention_interval, self.block_size)
        object.__setattr__(self, "hash_block_size",
                           check_hash_block_size(self.hash_block_size, self.block_size))

    @property
    def partial_hash_hits(self) -> bool:
        """Whether hits may end inside a block: ``hash_block_size < block_size``
        (vLLM's ``enable_partial_hash_hits``, ``kv_cache_coordinator.py``)."""
        assert self.hash_block_size is not None  # __post_init__ stores block_size for None
        return self.hash_block_size < self.block_size

    @property
    def hashes_per_block(self) -> int:
        """vLLM block hashes per block (``BlockHashListWithBlockSize.scale_factor``)."""
        assert self.hash_block_size is not None  # __post_init__ stores block_size for None
        return self.block_size // self.hash_block_size

    @property
    def state_groups(self) -> tuple[int, ...]:
        """Indexes of the recurrent-state groups."""
        return tuple(g for g, k in enumerate(self.group_kinds) if k == STATE)

    @property
    def per_token_groups(self) -> tuple[int, ...]:
        """Indexes of the groups holding a block per ``block_size`` tokens
        (:data:`PER_TOKEN_KINDS`)."""
        return tuple(g for g, k in enumerate(self.group_kinds) if k in PER_TOKEN_KINDS)


@dataclass(frozen=True)
class SchedulingSpec:
    """How the engine cuts a request's work into steps.

    Attributes:
        chunk_size: prefill token budget per step (``max_num_batched_tokens``).
        checkpoint: how prefill writes recurrent states, one of
            :data:`~vllm_admission.core.cache.CHECKPOINT_MODES` (``"split"``: a chunk
            ends at every checkpoint, vLLM 0.32; ``"inpass"``: captured inside the
            forward pass). Checked where a cache is built.
        prompt_end_export: in ``split`` mode the kernel writes the prompt-end state from
            inside the prompt's last chunk (a ``MambaSpec`` with
            ``num_prefill_checkpoint_blocks=1``: Qwen GDN on FlashInfer in vLLM 0.33,
            Mamba2), so no chunk ends there.
        async_scheduling: ``SchedulerConfig.async_scheduling`` (the GPU default): a step is
            scheduled while the previous one is in flight, so a retired state block returns
            to the pool a step late.
    """

    chunk_size: int
    checkpoint: str = DEFAULT_CHECKPOINT
    prompt_end_export: bool = False
    async_scheduling: bool = False


@dataclass(frozen=True)
class SpeculationSpec:
    """Speculative decoding (vLLM's ``SpeculativeConfig``).

    Attributes:
        num_speculative_tokens: draft tokens per step (0: none).
        eagle: the method follows vLLM's EAGLE rules (EAGLE/MTP: the last matched block
            dropped at a lookup, prompt checkpoints a block lower, ``num_speculative_tokens``
            lookahead slots); ``False`` for ``extract_hidden_states``.
    """

    num_speculative_tokens: int = 0
    eagle: bool = True

    @property
    def uses_eagle(self) -> bool:
        """Whether EAGLE's rules apply: drafts, by an EAGLE method."""
        return bool(self.num_speculative_tokens) and bool(self.eagle)

    @property
    def lookahead_tokens(self) -> int:
        """Attention slots held past the scheduled tokens (``VllmConfig.num_lookahead_tokens``)."""
        return self.num_speculative_tokens if self.uses_eagle else 0


@dataclass(frozen=True)
class HostTierSpec:
    """A host tier (vLLM's ``OffloadingConnector``); ``chunks`` 0: none.

    Attributes:
        chunks: chunks of the tier, one block each
            (:func:`~vllm_admission.core.cache.host.host_chunks`).
        policy: its eviction policy (the connector's ``eviction_policy``), a name in
            :func:`~vllm_admission.core.cache.host.host_policy_names`.
        admission: per-tier admission: a registered admission policy whose states go to the
            host tier only, where the GPU's does not keep them; ``None``: the host tier gets
            what the GPU keeps.
    """

    chunks: int = 0
    policy: str = "lru"
    admission: str | None = None


@dataclass(frozen=True)
class CacheLayout:
    """The configuration a prefix cache runs with, passed whole (module docstring).

    Attributes:
        pool: the block pool, its groups and hashing (:class:`PoolSpec`).
        scheduling: steps and checkpoints (:class:`SchedulingSpec`).
        speculation: speculative decoding (:class:`SpeculationSpec`; default: none).
        host: a host tier (:class:`HostTierSpec`; default: none).
    """

    pool: PoolSpec
    scheduling: SchedulingSpec
    speculation: SpeculationSpec = field(default_factory=SpeculationSpec)
    host: HostTierSpec = field(default_factory=HostTierSpec)
