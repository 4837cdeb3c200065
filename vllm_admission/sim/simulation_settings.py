"""One simulated run's settings, as one frozen object (:class:`SimulationSettings`).

The front ends build it (the sweep from its :class:`~vllm_admission.sim.sweep.SweepSpec`,
the fidelity check from a started engine's
:class:`~vllm_admission.engine.engine_geometry.EngineGeometry`, scripts and tests by hand) and
:func:`~vllm_admission.sim.simulator.simulate` turns it, with the model, into the
:class:`~vllm_admission.core.layout.CacheLayout` the cache runs with.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_admission.core.adaptive import DEFAULT_INTERVAL, DEFAULT_MARGIN
from vllm_admission.core.cache.host import H2D_BYTES_PER_SECOND
from vllm_admission.core.layout import DEFAULT_CHECKPOINT
from vllm_admission.core.settings import AutoSettings
from vllm_admission.core.tuning import DEFAULT_GRID, DEFAULT_MULTIPLIER

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
        admission, eviction: registered policy names, or ``"auto"`` (a
            :class:`~vllm_admission.core.adaptive.PolicyController` chooses online).
        capacity_bytes: KV cache bytes.
        num_blocks: blocks in the pool, null block included (overrides ``capacity_bytes``).
        block_size: vLLM's ``--block-size`` before its hybrid alignment with
            ``capacity_bytes``, the final block size with ``num_blocks`` (``None``: vLLM's).
        chunk_size: prefill tokens per step (``max_num_batched_tokens``).
        alpha: ``flop``'s alpha, fixed; ``None`` tunes it online.
        tune_multiplier: bootstrap window multiplier of the tuner (Marconi: 5).
        tune_grid: the tuner's alpha grid, a key of
            :data:`~vllm_admission.core.tuning.GRIDS`.
        retune_every: see :class:`~vllm_admission.core.tuning.AlphaTuner`.
        auto_interval: with ``auto``, requests between two policy decisions (>= 1).
        shadow_rate: with ``auto``, the fraction of requests its shadows serve
            (``None``: chosen from the trace; 1: full shadows).
        auto_margin: with ``auto``, the relative lead over stock's pair a pair's
            shadow needs for ``auto`` to leave stock's pair for it (0: off;
            :attr:`~vllm_admission.core.adaptive.PolicyController.stock_margin`).
        auto_admissions: with ``auto`` admission, the admission policies it chooses
            among (``None``: every registered ``auto`` candidate;
            :func:`~vllm_admission.core.adaptive.parse_auto_admissions`).
        outputs: how output blocks are hashed, one of
            :data:`~vllm_admission.sim.simulator.OUTPUT_MODES`.
        per_request: keep every request's hit tokens and prefill steps in the result.
        checkpoint: one of :data:`~vllm_admission.core.cache.CHECKPOINT_MODES`.
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
        host_admission: per-tier admission: an admission policy whose states go to the
            host tier only where ``admission`` does not keep them (``None``: none).
        async_scheduling: vLLM's async scheduling (a retired state block returns to the
            pool a step late).
        prompt_end_export: in ``split`` mode, the engine writes the prompt-end state from
            inside the last prefill chunk instead of ending a chunk there (vLLM's GPU
            Mamba2 layers, ``num_prefill_checkpoint_blocks``): fewer prefill steps, the
            same states. Not with sub-block hash keys or speculative decoding.
    """

    admission: str
    eviction: str
    # the pool
    capacity_bytes: int | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    checkpoint: str = DEFAULT_CHECKPOINT
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
    host_admission: str | None = None
    # the policies' tuning
    alpha: float | None = None
    tune_multiplier: int = DEFAULT_MULTIPLIER
    tune_grid: str = DEFAULT_GRID
    retune_every: int | None = None
    auto_interval: int = DEFAULT_INTERVAL
    shadow_rate: float | None = None
    auto_margin: float = DEFAULT_MARGIN
    auto_admissions: tuple[str, ...] | None = None
    # the replay
    outputs: str = "trace"
    per_request: bool = False

    def auto_settings(self) -> AutoSettings:
        """``auto``'s settings (:class:`~vllm_admission.core.settings.AutoSettings`) as these
        settings give them."""
        return AutoSettings(interval=self.auto_interval, shadow_rate=self.shadow_rate,
                            margin=self.auto_margin, admissions=self.auto_admissions)

