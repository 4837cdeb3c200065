"""What the simulator copies from a started engine: :class:`EngineGeometry`.

Read by :func:`vllm_admission.engine.llm.engine_geometry`; read in turn by the engine
replay (its skip rule), the fidelity check (the simulator set up like the engine) and the
``replay`` command (its ``results.json``, :meth:`EngineGeometry.to_dict`). Imports no vLLM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["EngineGeometry", "KVCacheGroupInfo"]


@dataclass(frozen=True)
class KVCacheGroupInfo:
    """One of vLLM's KV cache groups (``KVCacheConfig.kv_cache_groups``).

    Attributes:
        kind: the core's ``"attention"`` / ``"state"`` / ``"hidden"`` (from the group's
            manager and spec, :func:`vllm_admission.plugin.kv_cache.group_kinds`), or
            another kind the core does not model.
        num_layers: layers in the group.
        block_size: the spec's tokens per block.
        page_size_bytes: the spec's page (one block of one layer), bytes.
        layers: the layer names.
    """

    kind: str
    num_layers: int
    block_size: int
    page_size_bytes: int
    layers: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_layers": self.num_layers, "block_size": self.block_size,
                "page_size_bytes": self.page_size_bytes, "layers": list(self.layers)}


#: Fields :meth:`EngineGeometry.to_dict` writes only for an in-process engine core.
_INPROCESS_ONLY = ("hidden_state_bytes_per_token", "host_chunks", "host_policy", "host_admission",
                   "prompt_end_export")
#: Fields the fidelity check adds (the model and cache dtypes); never in ``to_dict``.
_DTYPES = ("dtype", "kv_cache_dtype", "mamba_cache_dtype")


@dataclass(frozen=True, kw_only=True)
class EngineGeometry:
    """A started engine's pool and the settings that shape it (vLLM's ``VllmConfig`` and,
    in process, its scheduler). Sizes in tokens, blocks and bytes.

    Attributes:
        block_size: tokens per KV block, every group (``CacheConfig.block_size``).
        num_gpu_blocks: blocks in the pool, null block included (``None``: unknown).
        max_num_batched_tokens: the token budget of one step.
        max_model_len: tokens.
        mamba_cache_mode: ``"align"`` with prefix caching on a hybrid model (``None``:
            unknown).
        mamba_ssm_cache_dtype: the setting after the platform's changes (``"float32"``
            on CPUs with AVX-512 BF16 when ``"auto"`` was asked for).
        prefix_cache_retention_interval: ``CacheConfig``'s (0, a multiple of the block
            size, or ``None``: dense).
        prefix_match_unit: ``CacheConfig``'s tokens per block hash (``None``: the block
            size); the pool's ``hash_block_size``.
        speculative_method, num_speculative_tokens: ``speculative_config``'s (``None``
            and 0 without speculative decoding).
        enable_chunked_prefill, async_scheduling, max_num_seqs: ``SchedulerConfig``'s.
        scheduler_cls: the scheduler class's qualified name.
        kv_cache_groups: the groups, in vLLM's order (``None``: engine core in another
            process).
        ssm_state_dtype: the recurrent state's dtype as allocated (``None``: no Mamba
            group, or another process).
        inprocess: whether the engine core runs in this process.
        hidden_state_bytes_per_token: bytes per token of the hidden-state groups
            (``extract_hidden_states``; 0: none).
        host_chunks, host_policy: the ``OffloadingConnector``'s host tier (its CPU
            manager's chunks and ``eviction_policy``; 0 and ``None``: none).
        host_admission: the plugin's host admission policy with a host tier, else ``None``.
        prompt_end_export: whether vLLM writes the prompt-end state from inside the last
            prefill chunk (:func:`vllm_admission.plugin.kv_cache.exports_prompt_end_state`;
            vLLM's GPU Mamba2 layers) instead of ending a chunk there.
        dtype, kv_cache_dtype, mamba_cache_dtype: the model dtype and ``CacheConfig``'s
            dtype settings, as the fidelity check adds them (``None``: ``"auto"``).
    """

    block_size: int
    num_gpu_blocks: int | None
    max_num_batched_tokens: int
    max_model_len: int
    mamba_cache_mode: str | None = None
    mamba_ssm_cache_dtype: str | None = "auto"
    prefix_cache_retention_interval: int | None = 0
    prefix_match_unit: int | None = None
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    max_num_seqs: int = 256
    scheduler_cls: str | None = None
    kv_cache_groups: tuple[KVCacheGroupInfo, ...] | None = None
    ssm_state_dtype: str | None = None
    inprocess: bool = False
    hidden_state_bytes_per_token: int = 0
    host_chunks: int = 0
    host_policy: str | None = None
    host_admission: str | None = None
    prompt_end_export: bool = False
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    mamba_cache_dtype: str | None = None

    @property
    def group_kinds(self) -> tuple[str, ...] | None:
        """The groups' kinds in vLLM's order (``None``: unknown)."""
        return None if self.kv_cache_groups is None else tuple(g.kind for g in self.kv_cache_groups)

    @property
    def bytes_per_block(self) -> int | None:
        """Bytes one block id holds: the largest group's page x its layers (``None``:
        groups unknown)."""
        if not self.kv_cache_groups:
            return None
        return max(g.page_size_bytes * g.num_layers for g in self.kv_cache_groups)

    def to_dict(self) -> dict[str, Any]:
        """The ``geometry`` object of ``vllm-admission replay``'s ``results.json``: every
        field but the dtypes, and the in-process ones only in process."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in _DTYPES or (f.name in _INPROCESS_ONLY and not self.inprocess):
                continue
            value = getattr(self, f.name)
            if f.name == "kv_cache_groups" and value is not None:
                value = [g.to_dict() for g in value]
            out[f.name] = value
        return out
