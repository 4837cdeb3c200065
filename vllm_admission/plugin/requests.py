"""The plugin's record of each live request: its admission, chunk stops and tentative states.

:class:`RequestTracker` turns vLLM's view of a request into the core's per-request
admission (:class:`~vllm_admission.core.admission.RequestAdmission`, the object the
simulator's cache model uses, built with ``total_len=None``: a live request's length is
unknown) and keeps what follows from it:

* at the prefix lookup (``Scheduler._get_local_prefix_cache_hit``) a
  :class:`~vllm_admission.core.admission.HitProbe` and the ``shared_prefix_boundary``
  the policy wants (:meth:`RequestTracker.on_lookup`), plus any further chunk stops
  (:meth:`RequestTracker.clip_chunk`, for ``dense``);
* when a recurrent-state group caches blocks (``MambaManager.cache_blocks``) which
  block-aligned state positions are admitted (:meth:`RequestTracker.decide`); for a
  policy with ``tentative_sequence_end`` (``marconi``) the latest state at or after the prompt
  end is kept tentatively and replaces the previous tentative one
  (:meth:`RequestTracker.supersede`). Under EAGLE/MTP with whole-block hashes the sequence
  end lags a block (:func:`~vllm_admission.core.admission.sequence_end`), so the two latest
  are kept, and when the request finishes the one that is not its sequence end is dropped
  (:meth:`RequestTracker.settle`); states for the host tier only are dropped from the
  GPU cache once handed over (:meth:`RequestTracker.hand_off_only`);
* the states of the first state group that really got a hash
  (:meth:`RequestTracker.observe_cached`), and the request and checkpoint counters
  (:class:`~vllm_admission.core.counters.CacheCounters`).

No vLLM import: requests and blocks are read through their attributes
(``vllm/v1/request.py`` ``Request``, ``vllm/v1/core/kv_cache_utils.py`` ``KVCacheBlock``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from vllm_admission.core.admission import (
    ADMIT,
    HOST,
    TENTATIVE,
    AdmissionPolicy,
    HitProbe,
    RequestAdmission,
)
from vllm_admission.core.counters import CacheCounters
from vllm_admission.plugin import translate

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHashWithGroupId, KVCacheBlock
    from vllm.v1.request import Request

__all__ = ["RequestTrack", "RequestTracker", "TentativeEnd"]

#: ``drop(block)``: remove a block's hash from vLLM's prefix cache
#: (:meth:`~vllm_admission.plugin.kv_cache.AdmissionBlockPool.drop_hash`).
Drop = Callable[["KVCacheBlock"], None]


class TentativeEnd(NamedTuple):
    """A request's latest tentative state in one state group."""

    pos: int                                  # tokens before the state
    block: KVCacheBlock                       # the block holding it
    key: BlockHashWithGroupId | None          # its hash when cached; None while a step computes it


@dataclass(slots=True)
class RequestTrack:
    """What the plugin knows about one live request (lengths in tokens)."""

    request: Request
    adm: RequestAdmission            # the core's per-request admission (probe, stops, ...)
    stops: tuple[int, ...]           # chunk stops besides the junction (vLLM ends that one)
    tentative_ends: dict[int, TentativeEnd] = field(default_factory=dict)  # state group -> tentative end
    # state group -> the tentative end before it, kept while the sequence end lags a block
    earlier_ends: dict[int, TentativeEnd] = field(default_factory=dict)


class RequestTracker:
    """Per-request admission for one engine, under one admission policy at a time.

    Args:
        policy: the admission policy served first.
        host_policy: per-tier admission: the host tier's admission policy (states it
            keeps that ``policy`` does not are handed to the host tier, then dropped from
            the GPU cache), or ``None``.
        block_size: tokens per block (``B``).
        first_state: the first recurrent-state KV cache group (its states are counted).
        state_groups: every recurrent-state KV cache group.
        partial_hash_block_size: vLLM's ``hash_block_size`` when below the block (partial
            hash hits: the prompt's unit end is then a checkpoint), else ``None``.
        eagle: EAGLE/MTP speculative decoding: the prompt checkpoints are a block lower.
    """

    def __init__(self, policy: AdmissionPolicy, host_policy: AdmissionPolicy | None, *,
                 block_size: int, first_state: int, state_groups: Sequence[int],
                 partial_hash_block_size: int | None, eagle: bool) -> None:
        self.B = block_size
        self.first_state = first_state
        self._state_set = frozenset(state_groups)
        self._partial_hash_block_size = partial_hash_block_size
        self._eagle = eagle
        self.host_policy = host_policy
        self.tracks: dict[str, RequestTrack] = {}
        self._pending: dict[str, HitProbe] = {}
        # metrics (evictions are counted by the block pool)
        self.counters = CacheCounters()
        self.superseded = 0
        self.set_policy(policy)

    # -- policy ------------------------------------------------------------
    def set_policy(self, policy: AdmissionPolicy) -> None:
        """Serve ``policy`` from now on (no request may be tracked: the caller checks);
        forgets the lookups not yet counted."""
        self.policy = policy
        #: vLLM's own policy: vLLM decides what is cached; the plugin only watches
        #: (not with a host admission policy, whose states the plugin hands over).
        self.stock = policy.vllm_native and self.host_policy is None
        #: Chunk stops besides the junction (vLLM handles that one itself).
        self.has_stops = policy.own_stops or self.host_policy is not None
        self._pending.clear()

    def _admission(self, probe: HitProbe, junction: int | None) -> RequestAdmission:
        return RequestAdmission(self.policy, probe, total_len=None, junction=junction,
                                hash_block_size=self._partial_hash_block_size, eagle=self._eagle,
                                host_policy=self.host_policy)

    # -- lookup and chunking -------------------------------------------------
    def on_lookup(self, request: Request, num_local: int, shared_prefix_boundary: int) -> int:
        """A prefix lookup ran for ``request``; returns the boundary to store.

        Args:
            request: the vLLM request (``num_prompt_tokens``, ``request_id``).
            num_local: the hybrid hit vLLM found (tokens).
            shared_prefix_boundary: vLLM's junction (its longest single-group
                hit when that is longer than the hybrid hit, else 0).

        Returns:
            vLLM's value for ``vllm``; otherwise the policy's junction stop
            (``policy.stops(probe)`` for policies that use the junction, else 0).
        """
        kv_hit = shared_prefix_boundary if shared_prefix_boundary > num_local else num_local
        probe = HitProbe(request.num_prompt_tokens, self.B, kv_hit, num_local)
        rid = request.request_id
        if translate.counts_in_prefix_cache_stats(request):
            self._pending[rid] = probe
        native = self.policy.vllm_native
        adm = self._admission(probe, shared_prefix_boundary if native else None)
        stops = (adm.host_stops if native
                 else tuple(s for s in adm.stops if s != adm.junction))
        old = self.tracks.get(rid)
        if old is None:
            self.tracks[rid] = RequestTrack(request=request, adm=adm, stops=stops)
        else:  # a preempted request keeps its tentative ends
            self.tracks[rid] = RequestTrack(request=request, adm=adm, stops=stops,
                                            tentative_ends=old.tentative_ends,
                                            earlier_ends=old.earlier_ends)
        return adm.junction

    def clip_chunk(self, request: Request, start: int, num_new_tokens: int) -> int:
        """End the chunk ``[start, start + n)`` at the policy's next stop inside it."""
        track = self.tracks.get(request.request_id)
        if track is None or not track.stops:
            return num_new_tokens
        end = start + num_new_tokens
        for s in track.stops:  # ascending
            if s > start:
                if s < end:
                    return s - start
                break
        return num_new_tokens

    def on_scheduled(self, num_scheduled_tokens: dict[str, int],
                     requests: dict[str, Request]) -> None:
        """Count the requests admitted this step (those looked up and scheduled),
        with the tokens a KV connector loaded for them (``host_hit_tokens``, part of
        ``hit_tokens``), first admissions only
        (:func:`~vllm_admission.plugin.translate.counts_in_prefix_cache_stats`), and the
        step's prefill chunks (requests given prompt tokens; called before vLLM advances
        ``num_computed_tokens``)."""
        self.counters.prefill_steps += sum(
            1 for rid, n in num_scheduled_tokens.items()
            if n > 0 and (r := requests.get(rid)) is not None
            and r.num_computed_tokens < r.num_prompt_tokens)
        pending = self._pending
        if not pending:
            return
        for rid in [r for r in pending if r in num_scheduled_tokens]:
            probe = pending.pop(rid)
            # Tokens a KV connector loaded beyond the local hit (a host tier's): the
            # request starts past the probe's hit, and vLLM's num_cached_tokens counts them.
            r = requests.get(rid)
            loaded = max(0, r.num_computed_tokens - probe.state_hit) if r is not None else 0
            self.counters.count_request(probe.prompt_len, probe.state_hit + loaded,
                                        probe.state_miss)
            self.counters.host_hit_tokens += loaded
            self.counters.junctions += bool(probe.junction)

    def forget(self, request_id: str) -> RequestTrack | None:
        """The request left the scheduler: drop its record; returns its track."""
        self._pending.pop(request_id, None)
        return self.tracks.pop(request_id, None)

    # -- caching ------------------------------------------------------------
    def track(self, request: Request) -> RequestTrack:
        """The request's track; one with no hit is made for a request never looked up."""
        track = self.tracks.get(request.request_id)
        if track is None:
            probe = HitProbe(request.num_prompt_tokens, self.B, 0, 0)
            track = RequestTrack(request=request, adm=self._admission(probe, 0), stops=())
            self.tracks[request.request_id] = track
        return track

    def transient(self, group: int) -> bool:
        """Whether ``group`` may cache states only tentatively or for the host tier
        (a state group under a ``tentative_sequence_end`` policy or a host admission policy)."""
        return group in self._state_set and (self.policy.tentative_sequence_end
                                             or self.host_policy is not None)

    def decide(self, track: RequestTrack, first: int, last: int,
               blocks: Sequence[KVCacheBlock]) -> tuple[list[int], list[int], list[int]]:
        """Admission of the state blocks ``first .. last - 1`` of one state group.

        Block ``i`` holds the state after ``(i + 1) * B`` tokens; null blocks
        (no state written there) are skipped.

        Returns:
            ``(admitted, tentative, host)`` token positions, ascending: states the
            policy caches, states kept only until a later state of the same
            request replaces them (``tentative_sequence_end`` policies), and states for the
            host tier only (:attr:`host_policy`; :meth:`hand_off_only`).
        """
        B = self.B
        decide = track.adm.decide
        admitted: list[int] = []
        tentative: list[int] = []
        host: list[int] = []
        for i in range(first, last):
            if blocks[i].is_null:
                continue
            pos = (i + 1) * B
            d = decide(pos)
            if d == ADMIT:
                admitted.append(pos)
            elif d == TENTATIVE:
                tentative.append(pos)
            elif d == HOST:
                host.append(pos)
        return admitted, tentative, host

    def hand_off_only(self, track: RequestTrack, group: int, host: Sequence[int],
                      blocks: Sequence[KVCacheBlock], drop: Drop) -> None:
        """The states at ``host`` were just cached so that vLLM hands them to the KV
        connector (``MambaManager.cache_blocks`` queues a boundary-state offload for
        every state block given a hash; the connector reads the block by id and fences
        it until the copy is done); drop them from the GPU cache now with
        ``drop(block)``, so they never hold GPU cache space (per-tier admission)."""
        B = self.B
        for pos in host:
            block = blocks[pos // B - 1]
            if block.block_hash is None:
                continue
            drop(block)
            if group == self.first_state:
                self.counters.state_checkpoints -= 1
                track.adm.unrecord(pos)

    def supersede(self, track: RequestTrack, group: int, tentative: Sequence[int],
                  blocks: Sequence[KVCacheBlock], drop: Drop) -> None:
        """Keep only the request's latest tentative state in ``group``.

        ``tentative`` are positions just cached as possible sequence ends
        (``tentative_sequence_end`` policies); the previous one of the same request is
        dropped from the cache with ``drop(block)``.
        """
        B = self.B
        for pos in tentative:
            block = blocks[pos // B - 1]
            key = block.block_hash
            if key is not None:
                self._replace_tentative_end(track, group, TentativeEnd(pos, block, key), drop)

    def supersede_ahead(self, track: RequestTrack, group: int, known: int, reach: int,
                        blocks: Sequence[KVCacheBlock], drop: Drop) -> None:
        """Async scheduling: a step in flight computes the state at the last block
        boundary ``p <= reach`` whose tokens are not all known yet (``p > known``).

        vLLM gives that state its hash only when the step's output arrives
        (``AsyncScheduler._update_request_with_output``), one step after the
        synchronous scheduler, which hashes it when the step is scheduled. If
        ``p`` is a tentative position, the previous tentative state is dropped
        now, where the synchronous scheduler drops it, so that its block is back
        at the head of the free queue before the next step allocates; ``p``
        itself replaces it when its hash arrives.

        Args:
            known: tokens of the request known now (``request.num_tokens``).
            reach: tokens computed once the steps in flight finish
                (``request.num_computed_tokens`` after scheduling).
        """
        pos = reach // self.B * self.B
        if pos <= known or track.adm.decide(pos) != TENTATIVE:
            return
        block = blocks[pos // self.B - 1]
        if not block.is_null:
            self._replace_tentative_end(track, group, TentativeEnd(pos, block, None), drop)

    def _replace_tentative_end(self, track: RequestTrack, group: int, new: TentativeEnd,
                               drop: Drop) -> None:
        """Make ``new`` the request's tentative end in ``group``; drop the previous
        one if it is earlier and still holds the hash it was cached with. While the
        sequence end lags a block (:attr:`RequestAdmission.end_lags
        <vllm_admission.core.admission.RequestAdmission.end_lags>`) the previous one is
        kept as the earlier end and the one before it is dropped instead."""
        old = track.tentative_ends.get(group)
        track.tentative_ends[group] = new
        if old is None or old.pos >= new.pos:
            return
        if track.adm.end_lags:
            older = track.earlier_ends.get(group)
            track.earlier_ends[group] = old
            if older is not None:
                self._drop_end(track, group, older, drop)
            return
        self._drop_end(track, group, old, drop)

    def _drop_end(self, track: RequestTrack, group: int, end: TentativeEnd, drop: Drop) -> None:
        """Drop a tentative end from the cache if it still holds the hash it was cached with."""
        if end.key is None or end.block.block_hash != end.key:
            return  # never hashed, or evicted (and maybe reused) meanwhile: nothing to drop
        drop(end.block)
        if group == self.first_state:
            self.counters.state_checkpoints -= 1
            self.superseded += 1
            track.adm.unrecord(end.pos)  # (absent after a preemption: a new track)

    def settle(self, track: RequestTrack, total_len: int, drop: Drop) -> None:
        """The request finished at ``total_len`` tokens: in every state group, keep the
        tentative end at its sequence end
        (:meth:`RequestAdmission.final_end
        <vllm_admission.core.admission.RequestAdmission.final_end>`) and drop the other
        one kept while the end lagged a block. Without the lag (one tentative end, the
        latest state) nothing changes."""
        if not track.adm.end_lags:
            return
        keep = track.adm.final_end(total_len)
        for group, latest in track.tentative_ends.items():
            earlier = track.earlier_ends.pop(group, None)
            for end in (latest, earlier):
                if end is not None and end.pos != keep:
                    self._drop_end(track, group, end, drop)

    def observe_cached(self, track: RequestTrack, blocks: Sequence[KVCacheBlock],
                       first: int, last: int) -> None:
        """States of the first state group that just got a block hash (any policy)."""
        B = self.B
        record = track.adm.record
        for i in range(first, last):
            b = blocks[i]
            if not b.is_null and b.block_hash is not None:
                record((i + 1) * B)
                self.counters.state_checkpoints += 1

    def observe_sub_block_state(self, track: RequestTrack) -> None:
        """The first state group cached the request's state at its prompt's unit end (inside a block)."""
        track.adm.record(track.adm.state_sub_block_end)
        self.counters.state_checkpoints += 1
