"""One simulated run's settings, as one frozen object (:class:`SimulationSettings`).

The front ends build it (the sweep from its :class:`~vllm_admission.sim.sweep.SweepSpec`,
the fidelity check from a started engine's
:class:`~vllm_admission.engine.engine_geometry.EngineGeometry`, scripts and tests by hand) and
:func:`~vllm_admission.sim.simulator.simulate` turns it, with the model, into the
:class:`~vllm_admission.core.layout.CacheLayout` the cache runs with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vllm_admission.core.cache.host import H2D_BYTES_PER_SECOND
from vllm_admission.core.settings import AutoSettings, Settings

__all__ = ["DEFAULT_CHUNK_SIZE", "SimulationSettings"]

#: vLLM's default ``max_num_batched_tokens`` for the offline ``LLM`` engine
#: (``vllm/engine/arg_utils.py``: 8192 unless the platform says otherwise).
DEFAULT_CHUNK_SIZE = 8192


@dataclass(frozen=True, kw_only=True)
class SimulationSettings:
    """What one run of :func:`~vllm_admission.sim.simulator.simulate` replays with.

    Give ``capacity_bytes`` (KV cache memory; the pool as vLLM derives it) or
    ``num_blocks`` (an engine's pool, with its ``block_size``). Checked by ``simulate``.

    Attributes:
        policy: the policy settings (:class:`~vllm_admission.core.settings.Settings`: the
            pair, ``flop``'s alpha and tuner, ``auto``'s settings, the checkpoint mode,
            per-tier admission), taken as the plugin takes them; ``"auto"`` for either
            policy lets a :class:`~vllm_admission.core.adaptive.PolicyController` choose.
        capacity_bytes: KV cache bytes.
        num_blocks: blocks in the pool, null block included (overrides ``capacity_bytes``).
        block_size: vLLM's ``--block-size`` before its hybrid alignment with
            ``capacity_bytes``, the final block size with ``num_blocks`` (``None``: vLLM's).
        chunk_size: prefill tokens per step (``max_num_batched_tokens``).
        retune_every: see :class:`~vllm_admission.core.tuning.AlphaTuner`.
        outputs: how output blocks are hashed, one of
            :data:`~vllm_admission.sim.simulator.OUTPUT_MODES`.
        per_request: keep every request's hit tokens and prefill steps in the result.
        retention_interval: vLLM's ``prefix_cache_retention_interval`` (0, a multiple of
            the block size, or ``None``: dense), followed by the ``vllm`` admission policy.
        hash_block_size: tokens per block hash (vLLM's ``prefix_match_unit``), a divisor
            of the block size; ``None``: the block size.
        num_speculative_tokens: EAGLE/MTP draft tokens per step (0: none); the MTP
            layers' own KV is not added to the pool.
        hidden_state_bytes_per_token: ``extract_hidden_states``: bytes per token of a
            ``"hidden"`` KV cache group after the others, one draft token a step and
            none of EAGLE's rules (0: none).
        host_bytes: a host tier of this many bytes (vLLM's ``OffloadingConnector``
            ``cpu_bytes_to_use``; 0: none).
        host_chunks: the host tier's chunks as an engine reports them (overrides
            ``host_bytes``).
        host_policy: the host tier's eviction policy
            (:func:`~vllm_admission.core.cache.host.host_policy_names`).
        host_bandwidth: host-to-device bytes per second that price the host tier's loads.
        async_scheduling: vLLM's async scheduling (a retired state block returns to the
            pool a step late).
        prompt_end_export: in ``split`` mode, the engine writes the prompt-end state from
            inside the last prefill chunk instead of ending a chunk there (vLLM's GPU
            Mamba2 layers, ``num_prefill_checkpoint_blocks``): fewer prefill steps, the
            same states. Not with sub-block hash keys or speculative decoding.
    """

    policy: Settings = field(default_factory=Settings)
    # the pool
    capacity_bytes: int | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    retention_interval: int | None = 0
    hash_block_size: int | None = None
    num_speculative_tokens: int = 0
    hidden_state_bytes_per_token: int = 0
    async_scheduling: bool = False
    prompt_end_export: bool = False
    # a host tier
    host_bytes: int = 0
    host_chunks: int | None = None
    host_policy: str = "lru"
    host_bandwidth: float = H2D_BYTES_PER_SECOND
    # the alpha tuner's re-tuning (the simulator's own)
    retune_every: int | None = None
    # the replay
    outputs: str = "trace"
    per_request: bool = False

    @classmethod
    def of(cls, admission: str, eviction: str, **fields: Any) -> SimulationSettings:
        """Settings for the pair ``admission`` + ``eviction``: ``fields`` name this class's
        fields, and those of :class:`~vllm_admission.core.settings.Settings`
        (``alpha``, ``checkpoint``, ...) and of its ``auto`` (as ``auto_interval``,
        ``shadow_rate``, ``auto_margin``, ``auto_admissions``) go into :attr:`policy`: the
        keyword form of scripts and sweeps.

        Raises:
            TypeError: a keyword that is none of these.
        """
        top = {f.name for f in dataclasses.fields(Settings)} - {"auto"}
        auto = {_AUTO_KEYWORDS.get(k, k): fields.pop(k) for k in list(fields)
                if k in _AUTO_KEYWORDS}
        policy = {k: fields.pop(k) for k in list(fields) if k in top}
        return cls(policy=Settings(admission=admission, eviction=eviction,
                                   auto=AutoSettings(**auto), **policy), **fields)


#: :meth:`SimulationSettings.of`'s keywords for ``auto``'s settings.
_AUTO_KEYWORDS = {"auto_interval": "interval", "shadow_rate": "shadow_rate",
                  "auto_margin": "margin", "auto_admissions": "admissions"}

