"""One request's admission (:class:`RequestAdmission`): its junction and chunk stops, the
decision for each state position, the checkpoints along its prefix and its blocks' FLOP
values. Shared by the simulator's cache model and the vLLM plugin.

Sources: vLLM 0.32 ``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``: the
junction), ``vllm/v1/core/sched/scheduler.py`` (``_mamba_block_aligned_split``: the chunk
stops, ``tail_boundary``: the prompt's unit end), ``vllm/v1/core/single_type_kv_cache_manager.py``
(``MambaManager._cache_partial_tail_block``); Marconi (Pan et al., MLSys 2025) sections
4.1 (admission) and 4.2 (values).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_admission.core.admission.base import ADMIT, HOST, SKIP, TENTATIVE
from vllm_admission.core.admission.kinds import (
    PROMPT_UNIT_END_KINDS,
    CheckpointKind,
    checkpoint_kinds,
    prompt_ends,
    sequence_end,
)
from vllm_admission.core.block_values import SegmentCosts, block_value, segment_values

if TYPE_CHECKING:  # annotations only
    from vllm_admission.core.admission.base import AdmissionDecision, AdmissionPolicy, HitProbe

__all__ = ["RequestAdmission"]


class RequestAdmission:
    """One request's admission, shared by the simulator's cache model and the plugin.

    Built at the prefix lookup. It fixes the request's junction and chunk stops
    and answers, for each block-aligned position where align mode wrote a
    state, whether the state is cached (:meth:`decide`). It also keeps the
    positions of the first state group that the request cached
    (:attr:`admitted`, changed through :meth:`record` and :meth:`unrecord`)
    and, for FLOP-aware eviction, the cached checkpoints
    along its prefix and the FLOP value of each of its blocks
    (:meth:`block_value`). The callers only translate: the cache model from
    block indexes, the plugin from vLLM's blocks.

    Args:
        policy: the admission policy.
        probe: what the lookup found.
        total_len: prompt plus output tokens when known (the simulator);
            ``None`` for a live request (the engine), whose end is unknown:
            then a ``tentative_sequence_end`` policy keeps every state at or after the
            prompt end tentatively (:data:`~vllm_admission.core.admission.TENTATIVE`)
            and the caller keeps only the latest one.
        junction: the junction the request acts on. Default: the policy's
            (:meth:`~vllm_admission.core.admission.AdmissionPolicy.junction`). The
            plugin passes vLLM's own value for a ``vllm_native`` policy.
        hash_block_size: tokens per block hash when finer than the block
            (vLLM's ``prefix_match_unit``); ``None``: the block size.
        eagle: EAGLE/MTP speculative decoding: the prompt checkpoints are one
            block lower (:func:`~vllm_admission.core.admission.prompt_ends`).
        host_policy: the admission policy of a host tier (per-tier admission): a
            state inside the prompt that ``policy`` does not cache but ``host_policy``
            would (as a live engine caches it, :meth:`cached_live`) is decided
            :data:`~vllm_admission.core.admission.HOST`, and its position becomes a
            chunk stop too. ``None``: the host tier gets what the GPU caches, nothing
            more.

    Attributes:
        junction: the junction (tokens; 0: none).
        prompt_end: the prompt checkpoint, where vLLM ends a chunk:
            ``(prompt_len - 1) // B * B``, with EAGLE ``prompt_len // B * B - B``
            (0 when there is none).
        state_sub_block_end: with a smaller hash block size ``u``, the prompt's unit end
            ``(prompt_len - 1) // u * u`` when it lies inside a block, else 0
            (with EAGLE ``prompt_len // u * u - u``, one unit below the last
            boundary a lookup can reach, as the lookup drops one unit:
            ``get_mamba_prefill_checkpoint_position``). vLLM ends a chunk there
            and keys the state written there by the hash block
            (``MambaManager._cache_partial_tail_block``); its kind is PROMPT_UNIT_END
            (else PROMPT_UNIT_END goes with PROMPT_END), so a policy that keeps
            PROMPT_UNIT_END keeps it.
        attn_sub_block_end: where the attention groups key their partial last block
            (the prompt's unit end) when that lies inside a block, else 0
            (``FullAttentionManager._cache_partial_tail_block``):
            :attr:`state_sub_block_end`, but with EAGLE ``prompt_len // u * u``, the unit a
            lookup matches before it drops one.
        prompt_unit_end: with a smaller hash block size, the prompt's unit end whether or not
            it lies inside a block: vLLM ends a chunk there (``Scheduler._mamba_block_aligned_split``'s
            ``tail_boundary``); without EAGLE a block-aligned one is :attr:`prompt_end`.
        stops: ascending chunk stops (the junction included when used), the host
            policy's included.
        host_stops: the host policy's stops that are not the GPU policy's own.
        admitted: ascending positions cached in the first state group.
        end_lags: under EAGLE/MTP with whole-block hashes, the sequence end is the
            state a block below the last one written
            (:func:`~vllm_admission.core.admission.sequence_end`): a live engine keeps the
            request's two latest tentative states, not one, and settles on the sequence
            end when the request finishes (:meth:`final_end`).
    """

    __slots__ = ("policy", "probe", "junction", "prompt_end", "state_sub_block_end", "attn_sub_block_end",
                 "prompt_unit_end", "eagle", "end_lags", "stops", "host_stops", "admitted", "_host",
                 "_special", "_plain_chunk", "_plain_decode", "_period", "_periodic_chunk",
                 "_periodic_decode", "_live_tentative_end", "_may_end", "_below_hit", "_values", "_version")

    def __init__(self, policy: AdmissionPolicy, probe: HitProbe, *, total_len: int | None,
                 junction: int | None = None, hash_block_size: int | None = None,
                 eagle: bool = False, host_policy: AdmissionPolicy | None = None) -> None:
        B, P = probe.block_size, probe.prompt_len
        self.policy = policy
        self.probe = probe
        if junction is None:
            junction = policy.junction(probe)
        self.junction = junction
        self.eagle = eagle
        ends = prompt_ends(P, B, eagle)
        self.prompt_end = ends[-1] if ends else 0
        if hash_block_size:
            u = hash_block_size
            reach = (P if eagle else P - 1) // u * u
            self.prompt_unit_end = max(reach - u, 0) if eagle else reach
            self.state_sub_block_end = self.prompt_unit_end if self.prompt_unit_end % B else 0
            self.attn_sub_block_end = reach if reach % B else 0
        else:
            self.state_sub_block_end = self.attn_sub_block_end = self.prompt_unit_end = 0
        self.end_lags = eagle and not self.prompt_unit_end
        self.stops = policy.stops(probe)
        self.host_stops: tuple[int, ...] = ()
        self._host: RequestAdmission | None = None
        if host_policy is not None:
            host = self._host = RequestAdmission(host_policy, probe, total_len=total_len,
                                                 hash_block_size=hash_block_size, eagle=eagle)
            own = set(self.stops)
            self.host_stops = tuple(s for s in host.stops if s not in own)
            if self.host_stops:
                self.stops = tuple(sorted(own.union(self.host_stops)))
        self.admitted: list[int] = []
        special = {}
        period = policy.period
        seq = (sequence_end(P, total_len, B, eagle, self.prompt_unit_end) if total_len is not None
               else 0)
        for pos in (junction, *ends, seq):
            if pos > 0 and pos not in special:
                special[pos] = policy.admit(checkpoint_kinds(
                    pos, prompt_len=P, total_len=total_len, block_size=B, junction=junction,
                    period=period, prompt_unit_end=self.prompt_unit_end or None, eagle=eagle))
        if self.prompt_unit_end and self.prompt_unit_end not in special:
            # Inside a block, or (EAGLE) a block boundary where vLLM keys the state by
            # the hash block all the same (MambaManager._cache_partial_tail_block).
            special[self.prompt_unit_end] = policy.admit(PROMPT_UNIT_END_KINDS)
        self._special = special
        self._plain_chunk, self._plain_decode, keeps_sequence_end = policy.plain_decisions
        self._period = period
        if period:
            self._periodic_chunk = policy.admit(
                frozenset({CheckpointKind.CHUNK_END, CheckpointKind.PERIODIC}))
            self._periodic_decode = policy.admit(
                frozenset({CheckpointKind.DECODE, CheckpointKind.PERIODIC}))
        self._may_end = policy.tentative_sequence_end and keeps_sequence_end
        self._live_tentative_end = total_len is None and self._may_end
        self._below_hit: list[int] | None = None
        self._values: tuple[int, list[int], dict[int, float]] | None = None
        self._version = 0  # bumped whenever admitted changes (the values' memo key)

    def record(self, position: int) -> None:
        """The state at ``position`` (first state group) got a block hash."""
        self.admitted.append(position)
        self._version += 1

    def unrecord(self, position: int) -> None:
        """The state at ``position`` lost its hash again (a superseded tentative end);
        a position the request did not record is ignored."""
        if position in self.admitted:
            self.admitted.remove(position)
            self._version += 1

    def final_end(self, total_len: int) -> int:
        """The sequence end (tokens) of the request once it finished at ``total_len``
        tokens (prompt and output): :func:`~vllm_admission.core.admission.sequence_end`
        with this request's settings. A live engine keeps the tentative state there
        and drops the others it kept (:attr:`end_lags`)."""
        probe = self.probe
        return sequence_end(probe.prompt_len, total_len, probe.block_size, self.eagle,
                            self.prompt_unit_end)

    def keeps_prompt_unit_end(self) -> bool:
        """Whether the policy keeps the state at the prompt's unit end
        (:attr:`prompt_unit_end`; a hash block size below the block size): only then do the
        attention groups key :attr:`attn_sub_block_end`, the unit a lookup that lands there
        matches, and the state groups :attr:`state_sub_block_end` when it lies inside a block.

        A block-aligned unit end (EAGLE) that a ``tentative_sequence_end`` policy may keep as
        the sequence end counts as kept: a live engine caches it tentatively and keys
        the attention groups' partial block before it knows, so the simulator, which knows, does too."""
        t = self.prompt_unit_end
        if not t:
            return False
        d = self.decide(t)
        if d == ADMIT:
            return True
        return (t % self.probe.block_size == 0 and self._may_end
                and t >= self.prompt_end)

    def decide(self, position: int) -> AdmissionDecision:
        """The :class:`~vllm_admission.core.admission.AdmissionDecision` for the state at
        ``position`` (tokens, a block boundary or the prompt's unit end): ``ADMIT``
        (cache it), ``TENTATIVE`` (cache it until a later state of the request replaces
        it), ``HOST`` (hand it to the host tier only) or ``SKIP``."""
        ok = self._special.get(position)
        if ok is None:
            if self._period and position % self._period == 0:
                ok = (self._periodic_chunk if position <= self.probe.prompt_len
                      else self._periodic_decode)
            else:
                ok = self._plain_chunk if position <= self.probe.prompt_len else self._plain_decode
        if ok:
            return ADMIT
        if self._live_tentative_end and position >= self.prompt_end:
            return TENTATIVE
        host = self._host
        if (host is not None and position <= self.probe.prompt_len
                and host.cached_live(position)):
            return HOST
        return SKIP

    def cached_live(self, position: int) -> bool:
        """Whether a live engine, which does not know the request's length, caches the
        state at ``position`` when it is written: :meth:`decide` admits it, or a
        ``tentative_sequence_end`` policy keeps it tentatively as a possible sequence end (at
        or after the prompt end) until a later state replaces it. What a KV connector
        is handed (a host tier stores every state the engine caches, the tentative
        ones included), with the :data:`~vllm_admission.core.admission.HOST` ones."""
        d = self.decide(position)
        return d in (ADMIT, HOST) or (self._may_end and position >= self.prompt_end)

    def kept_as_sequence_end(self, position: int) -> bool:
        """Whether the state at ``position`` is admitted only as the sequence end
        of a ``tentative_sequence_end`` policy (``marconi``): a live engine, which does
        not know the length, caches it tentatively (:data:`~vllm_admission.core.admission.TENTATIVE`) and
        learns only when the request finishes that it stays.

        Meaningful for a position :meth:`decide` admits; False for every
        position of a policy without ``tentative_sequence_end``.
        """
        policy = self.policy
        if not policy.tentative_sequence_end:
            return False
        probe = self.probe
        return not policy.admit(checkpoint_kinds(
            position, prompt_len=probe.prompt_len, total_len=None,
            block_size=probe.block_size, junction=self.junction, period=policy.period,
            prompt_unit_end=self.prompt_unit_end or None, eagle=self.eagle))

    def checkpoints(self, is_cached_state: Callable[[int], bool]) -> list[int]:
        """Ascending cached-state positions along the request's sequence.

        The states at or below the hit that are in the cache (asked once, the
        first time: ``is_cached_state(i)`` for the state after block ``i``,
        0-based), the hit itself, then :attr:`admitted`.
        """
        if self._below_hit is None:
            B, hit = self.probe.block_size, self.probe.state_hit
            below = [(i + 1) * B for i in range(hit // B) if is_cached_state(i)]
            if hit and (not below or below[-1] != hit):
                below.append(hit)
            self._below_hit = below
        return self._below_hit + self.admitted

    def segment_table(self, costs: SegmentCosts, is_cached_state: Callable[[int], bool]
                      ) -> tuple[list[int], dict[int, float]]:
        """``(checkpoints, {checkpoint: FLOPs per byte})`` of the request's prefix
        (:meth:`checkpoints`, :func:`~vllm_admission.core.block_values.segment_values`),
        computed again only when :attr:`admitted` changed. A block's value is then
        ``block_value(values, checkpoints, end, is_state)``."""
        memo = self._values
        if memo is None or memo[0] != self._version:
            ckpts = self.checkpoints(is_cached_state)
            memo = self._values = (self._version, ckpts, segment_values(ckpts, costs))
        return memo[1], memo[2]

    def block_value(self, end: int, is_state: bool, costs: SegmentCosts,
                    is_cached_state: Callable[[int], bool]) -> float:
        """FLOP efficiency (FLOPs saved per byte) of the request's block ending at
        token ``end`` (:meth:`segment_table`,
        :func:`~vllm_admission.core.block_values.block_value`)."""
        ckpts, values = self.segment_table(costs, is_cached_state)
        return block_value(values, ckpts, end, is_state)
