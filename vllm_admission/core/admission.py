"""Admission policies: which recurrent-state checkpoints enter the prefix cache.

A hybrid model's prefix hit needs every attention KV block of the prefix AND a
recurrent state saved exactly at the prefix's end. vLLM 0.32 in ``align`` mode
only writes a state where a prefill chunk ends (and, during decode, where the
running state crosses a block boundary), so an admission policy has two levers,
both at block-aligned token positions:

* ``stops(probe)``: positions where the prefill must end a chunk, so that a state
  is written there (vLLM: ``Scheduler._mamba_block_aligned_split`` stops at
  ``request.shared_prefix_boundary``);
* ``admit(position, kind)``: whether a state that align mode wrote at
  ``position`` is given a block hash, i.e. cached (vLLM:
  ``MambaManager.cache_blocks`` / ``reachable_block_mask``).

The simulator and the vLLM plugin call the same objects through these two
methods, per request through one :class:`RequestAdmission` (the probe, the
stops, the decision for each state position, the checkpoints kept below the
hit and the FLOP values of the request's blocks). Policies are chosen by name
from :data:`ADMISSION_POLICIES`; a new policy is one :class:`AdmissionPolicy`
subclass plus one :func:`register_admission` call at the end of this module.

Sources: Marconi (Pan et al., MLSys 2025, section 4.1, "admission"); vLLM 0.32
``vllm/v1/core/sched/scheduler.py`` (``_mamba_block_aligned_split``),
``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``: the junction is
the attention-KV hit when it runs past the state hit) and
``vllm/v1/core/kv_cache_coordinator.py`` (``replay_boundaries``: the prompt's
last reusable position is ``prompt_len - 1``, block-floored).
"""

from __future__ import annotations

import bisect
import enum
import functools
import inspect
import itertools
from abc import ABC
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from vllm_admission.core.geometry import check_retention_interval
from vllm_admission.core.registry import PolicyRegistry, UnknownPolicyError

__all__ = [
    "ADMISSION_POLICIES",
    "ADMIT",
    "HOST",
    "SKIP",
    "TENTATIVE",
    "AdmissionPolicy",
    "AdmissionDecision",
    "CheckpointKind",
    "DenseAdmission",
    "HitProbe",
    "LastAdmission",
    "MarconiAdmission",
    "NoAdmission",
    "RequestAdmission",
    "SegmentCosts",
    "BlockAdmission",
    "UnknownPolicyError",
    "checkpoint_kinds",
    "VllmAdmission",
    "ENTRY_POINT_GROUP",
    "get_admission",
    "prompt_ends",
    "sequence_end",
    "register_admission",
    "stock_admission",
]


class CheckpointKind(enum.Enum):
    """Why align mode wrote a recurrent state at a block-aligned position.

    A position usually has several kinds (see :func:`checkpoint_kinds`).
    """

    #: The shared-prefix junction: the attention-KV hit ran past the state hit.
    JUNCTION = "junction"
    #: The prompt's last reusable position, ``(prompt_len - 1) // B * B``.
    PROMPT_END = "prompt_end"
    #: The last block boundary the whole sequence reaches,
    #: ``(prompt_len + output_len - 1) // B * B`` (Marconi's "sequence end"; with
    #: EAGLE/MTP the last one with a state written, :func:`sequence_end`).
    SEQUENCE_END = "sequence_end"
    #: A state written during prefill (a prefill chunk end).
    CHUNK_END = "chunk_end"
    #: A state written at a block boundary crossed during decode.
    DECODE = "decode"
    #: A position on vLLM's periodic retention grid: a multiple of the engine's
    #: ``prefix_cache_retention_interval`` when that is positive
    #: (``MambaManager.reachable_block_mask``, ``vllm/v1/core/single_type_kv_cache_manager.py``).
    PERIODIC = "periodic"
    #: The prompt's last reusable position at the engine's hash unit: the tail unit
    #: boundary ``(prompt_len - 1) // u * u`` under a ``prefix_match_unit`` ``u`` finer
    #: than the block when that lies inside a block (vLLM keys the state written there,
    #: ``MambaManager._cache_partial_tail_block``), else the PROMPT_END position.
    TAIL = "tail"


@dataclass(frozen=True, slots=True)
class HitProbe:
    """What the KV cache coordinator saw for one request at admission time.

    All lengths are in tokens.

    Attributes:
        prompt_len: prompt tokens of the request.
        block_size: tokens per KV cache block (the attention block size).
        kv_hit: longest prefix whose attention-KV blocks are all cached (at
            most ``prompt_len - 1``; block-aligned unless the engine hashes in
            units finer than the block, vLLM's ``prefix_match_unit``, when it may
            end on a unit boundary inside a block).
        state_hit: longest prefix that also has a cached recurrent state at its
            end: the hybrid hit (``<= kv_hit``; a unit boundary like ``kv_hit``).
    """

    prompt_len: int
    block_size: int
    kv_hit: int
    state_hit: int

    @property
    def junction(self) -> int:
        """The shared-prefix junction, or 0 when there is none.

        When the attention KV of a longer prefix is cached but no state is, the
        prefix was computed before by another request: it is shared, and a
        state saved at its end pays off from the next request on (Marconi 4.1;
        vLLM ``KVCacheManager.get_computed_blocks``). A state is kept there only
        at a block boundary, so a ``kv_hit`` inside a block gives the boundary
        below it (``reachable_block_mask`` and ``_mamba_block_aligned_split``
        floor vLLM's ``shared_prefix_boundary`` to the block).
        """
        junction = self.kv_hit - self.kv_hit % self.block_size
        return junction if junction > self.state_hit else 0

    @property
    def state_miss(self) -> int:
        """Tokens of attention-KV hit thrown away for want of a recurrent state.

        ``kv_hit - state_hit``: the prompt tokens past the hybrid hit whose
        attention KV blocks were all cached, but which are recomputed because
        no state was kept at their end. Without a finer hash unit both lengths
        are whole blocks (vLLM's ``find_longest_cache_hit`` returns
        block-aligned lengths and caps the attention hit at ``prompt_len - 1``),
        so this is a multiple of ``block_size``, nonzero exactly when
        :attr:`junction` is.
        """
        return self.kv_hit - self.state_hit


def prompt_ends(prompt_len: int, block_size: int, eagle: bool = False) -> tuple[int, ...]:
    """The block boundaries where a later request can resume a prompt: vLLM's
    ``replay_boundaries`` (``vllm/v1/core/kv_cache_coordinator.py``), ascending,
    positive ones only.

    Without EAGLE: ``(prompt_len - 1) // B * B`` (a resend hits at most
    ``prompt_len - 1`` tokens). With EAGLE/MTP, whose lookup drops the last matched
    block: one block below each of the resend's ``(prompt_len - 1) // B * B`` and a
    longer sibling's ``prompt_len // B * B``; the higher one is where vLLM ends a
    chunk (``get_mamba_prefill_checkpoint_position`` with ``drop_eagle_block``).
    """
    B = block_size
    if not eagle:
        end = (prompt_len - 1) // B * B
        return (end,) if end > 0 else ()
    return tuple(sorted({p for p in ((prompt_len - 1) // B * B - B, prompt_len // B * B - B)
                         if p > 0}))


def sequence_end(prompt_len: int, total_len: int, block_size: int, eagle: bool = False,
                 tail_stop: int = 0) -> int:
    """The SEQUENCE_END position: the last block boundary where the whole sequence
    (``total_len`` tokens, prompt and output) has a state written,
    ``(total_len - 1) // B * B``. With EAGLE/MTP no prefill chunk ends at the prompt's
    last block boundary (the checkpoint is a block lower, :func:`prompt_ends`), so
    where decode crosses no boundary the last state written is that checkpoint, or
    ``tail_stop`` when it is a higher block boundary (with a finer hash unit a chunk also
    ends at the tail unit, :attr:`RequestAdmission.tail_stop`): what a live engine,
    which keeps a request's latest state as its possible end, keeps."""
    B = block_size
    last = (total_len - 1) // B * B
    if not eagle or last >= prompt_len:
        return last
    ends = prompt_ends(prompt_len, B, True)
    end = ends[-1] if ends else 0
    return tail_stop if tail_stop > end and tail_stop % B == 0 else end


def checkpoint_kinds(position: int, *, prompt_len: int, total_len: int | None,
                     block_size: int, junction: int, period: int = 0,
                     tail: int | None = None, eagle: bool = False) -> frozenset[CheckpointKind]:
    """Every :class:`CheckpointKind` that a block-aligned state position has.

    Args:
        position: tokens summarised by the state; a positive multiple of
            ``block_size``.
        prompt_len: prompt tokens.
        total_len: prompt plus output tokens the sequence reaches, or ``None``
            while unknown (a live engine: the request may stop early). When
            ``None``, SEQUENCE_END is never reported; the caller treats the
            latest written state as the tentative sequence end.
        block_size: tokens per block.
        junction: the request's junction (0 if none).
        period: the engine's periodic retention interval in tokens (vLLM's
            ``prefix_cache_retention_interval`` when positive; 0: no periodic
            positions).
        tail: the request's TAIL position (:attr:`RequestAdmission.tail_stop`
            with a finer hash unit: inside a block, or under EAGLE possibly a block
            boundary of its own); ``None``: the PROMPT_END position where vLLM ends
            a chunk.
        eagle: EAGLE/MTP speculative decoding: PROMPT_END is each of
            :func:`prompt_ends` (one block lower).

    Returns:
        A non-empty frozenset: CHUNK_END or DECODE always, plus JUNCTION,
        PROMPT_END, SEQUENCE_END, PERIODIC and TAIL where they apply.
    """
    ends = prompt_ends(prompt_len, block_size, eagle)
    prompt_end = ends[-1] if ends else 0
    return _KIND_SETS[(
        position <= prompt_len,
        bool(junction) and position == junction,
        position in ends,
        total_len is not None and position == sequence_end(prompt_len, total_len, block_size,
                                                           eagle, tail or 0),
        bool(period) and position % period == 0,
        position == (prompt_end if tail is None else tail),
    )]


def _kind_set(in_prompt: bool, junction: bool, prompt_end: bool,
              sequence_end: bool, periodic: bool, tail: bool) -> frozenset[CheckpointKind]:
    kinds = {CheckpointKind.CHUNK_END if in_prompt else CheckpointKind.DECODE}
    for flag, kind in ((junction, CheckpointKind.JUNCTION), (prompt_end, CheckpointKind.PROMPT_END),
                       (sequence_end, CheckpointKind.SEQUENCE_END),
                       (periodic, CheckpointKind.PERIODIC), (tail, CheckpointKind.TAIL)):
        if flag:
            kinds.add(kind)
    return frozenset(kinds)


#: :func:`checkpoint_kinds`' answers, built once (a request asks for up to three,
#: and hashing enum members in Python is what a fresh set would cost).
_KIND_SETS = {flags: _kind_set(*flags) for flags in itertools.product((False, True), repeat=6)}


class AdmissionPolicy(ABC):
    """One admission policy: where to force checkpoints, which states to keep.

    Policies are stateless and cheap to share (built with no arguments). A
    subclass sets :attr:`name`, :attr:`summary` and :attr:`admitted` (or
    overrides :meth:`admit`) and overrides the hooks it needs:

    * :meth:`junction`: the shared-prefix junction the policy acts on (none here);
    * :meth:`stops`: where prefill chunks must end (here: the junction, if any;
      every block boundary for a policy that declares :attr:`every_block`);
    * :meth:`admit`: whether a state with these kinds is cached.

    Derived from those answers, never declared by hand:

    * :attr:`uses_junction`: the class overrides :meth:`junction` (found when
      the class is created);
    * :attr:`own_stops`: chunk stops besides the junction (the class overrides
      :meth:`stops`, or declares :attr:`every_block`);
    * :attr:`supersede_tail`: :meth:`admit` keeps a sequence-end state that it
      would not keep as a plain decode boundary, so a live engine, which does
      not know where the sequence ends, keeps each such state tentatively
      until the request's next one replaces it.

    Declared (facts, not hooks): :attr:`vllm_native` and :attr:`auto_candidate`, each
    stated by the class itself (a subclass does not inherit them), and
    :attr:`every_block`, which also gives the class its :meth:`stops` (so the two
    cannot disagree: declaring it and overriding :meth:`stops` is a ``TypeError``).
    """

    #: Registry name: the CLI word and the ``VLLM_ADMISSION_POLICY`` value.
    name: ClassVar[str]
    #: One line for ``--help`` and the docs.
    summary: ClassVar[str]
    #: Declared: whether this is exactly vLLM 0.32's own behaviour, so the engine
    #: leaves vLLM's code in charge (its junction, its Mamba manager).
    vllm_native: ClassVar[bool] = False
    #: Declared: whether ``auto`` chooses among this policy (off unless declared).
    auto_candidate: ClassVar[bool] = False
    #: Declared: the policy differs from the others only where the engine hashes in
    #: units finer than the block (vLLM's ``prefix_match_unit``); ``auto`` leaves it
    #: out of its candidates elsewhere (:func:`~vllm_admission.core.adaptive.candidate_policies`).
    sub_block_only: ClassVar[bool] = False
    #: Declared: a state at every block boundary: :meth:`stops` ends a prefill chunk
    #: at each one between the hit and the prompt end (``dense``); the cache model
    #: then prefills block by block in one pass.
    every_block: ClassVar[bool] = False
    #: Derived: whether the class overrides :meth:`junction`.
    uses_junction: ClassVar[bool] = False
    #: Derived: whether the class has chunk stops besides the junction (which vLLM's
    #: scheduler places itself): it overrides :meth:`stops` or declares :attr:`every_block`.
    own_stops: ClassVar[bool] = False
    #: Tokens between the positions :func:`checkpoint_kinds` marks PERIODIC
    #: (0: none). Only a policy that follows the engine's retention setting
    #: (:meth:`for_engine`) has one.
    period: int = 0

    @classmethod
    def for_engine(cls, *, retention_interval: int | None = 0) -> AdmissionPolicy:
        """The policy as it runs on an engine with these settings.

        Args:
            retention_interval: the engine's ``prefix_cache_retention_interval``
                (vLLM's ``CacheConfig``: 0, a positive multiple of the block
                size, or ``None`` for dense retention).

        The default ignores the engine's settings (the policy decides what is
        cached by itself) and returns ``cls()``; :class:`VllmAdmission`, which
        is vLLM's own behaviour, follows them.
        """
        return cls()

    def __init_subclass__(cls, **kwargs) -> None:
        """Derive :attr:`uses_junction` and :attr:`own_stops`. TypeError if the body
        declares a derived attribute, or declares :attr:`every_block` beside its own
        :meth:`stops`."""
        super().__init_subclass__(**kwargs)
        for attr in ("vllm_native", "auto_candidate"):
            # Identity declarations are the class's own: a subclass that does not
            # state them is neither vLLM's behaviour nor an auto candidate.
            if attr not in cls.__dict__:
                setattr(cls, attr, False)
        for attr in ("uses_junction", "own_stops", "supersede_tail"):
            if attr in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{attr} is derived from the policy's hooks "
                                f"(junction, stops, admit); override those instead")
        overrides_stops = (inspect.getattr_static(cls, "stops")
                           is not inspect.getattr_static(AdmissionPolicy, "stops"))
        if cls.every_block and overrides_stops:
            raise TypeError(f"{cls.__name__} declares every_block and its own stops(); "
                            f"every_block gives the stops (a chunk end at every block boundary)")
        cls.uses_junction = (inspect.getattr_static(cls, "junction")
                             is not inspect.getattr_static(AdmissionPolicy, "junction"))
        cls.own_stops = overrides_stops or cls.every_block

    def junction(self, probe: HitProbe) -> int:
        """The shared-prefix junction this policy acts on (tokens; 0: none).

        The default is none; a policy that stops and keeps a state there
        returns ``probe.junction`` (Marconi 4.1; vLLM's own behaviour).
        """
        return 0

    def stops(self, probe: HitProbe) -> tuple[int, ...]:
        """Token positions where prefill chunks must end so that a state is written.

        Returns positions strictly inside ``(probe.state_hit, probe.prompt_len)``,
        ascending: every block boundary up to the prompt's last reusable one for a
        policy that declares :attr:`every_block`, else the policy's :meth:`junction`,
        if any.
        """
        if self.every_block:
            b = probe.block_size
            return tuple(i * b for i in range(probe.state_hit // b + 1,
                                              (probe.prompt_len - 1) // b + 1))
        junction = self.junction(probe)
        return (junction,) if junction else ()

    #: The checkpoint kinds this policy caches.
    admitted: ClassVar[frozenset[CheckpointKind]]

    def admit(self, kinds: frozenset[CheckpointKind]) -> bool:
        """Whether a state with these kinds (see :func:`checkpoint_kinds`) is cached."""
        return not self.admitted.isdisjoint(kinds)

    @functools.cached_property
    def plain_decisions(self) -> tuple[bool, bool, bool]:
        """``admit`` of a position with one kind only: a chunk end, a decode
        boundary, a sequence end (computed once per policy object)."""
        return tuple(self.admit(frozenset({k})) for k in (
            CheckpointKind.CHUNK_END, CheckpointKind.DECODE, CheckpointKind.SEQUENCE_END))

    @functools.cached_property
    def supersede_tail(self) -> bool:
        """Derived: whether a decode-time state replaces the request's earlier
        tentative end-of-sequence state in a live engine: :meth:`admit` keeps a
        sequence end it would not keep as a plain decode boundary (Marconi keeps
        one state per sequence end). Computed once per policy object."""
        _, decode, sequence_end = self.plain_decisions
        return sequence_end and not decode

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoAdmission(AdmissionPolicy):
    name = "none"
    summary = "cache no recurrent state: no hybrid prefix hit is possible (the floor)"

    admitted = frozenset()


class LastAdmission(AdmissionPolicy):
    name = "last"
    summary = ("vLLM before PR 37898: states at prefill chunk ends, the prompt's last "
               "block boundary and decode block boundaries; no junction")
    auto_candidate = True

    admitted = frozenset(CheckpointKind) - {CheckpointKind.JUNCTION}


class VllmAdmission(AdmissionPolicy):
    """vLLM's own retention, as the engine is configured.

    ``prefix_cache_retention_interval`` (``vllm/config/cache.py``; applied by
    ``MambaManager.reachable_block_mask`` in
    ``vllm/v1/core/single_type_kv_cache_manager.py``):

    * ``0`` (vLLM's default): only the "reachable boundaries", the prompt's
      replay boundary (``prompt_len - 1``, block-floored) and the shared-prefix
      junction;
    * ``N > 0``: those plus every state written at a multiple of ``N`` tokens
      (a chunk end or a decode boundary that lands there; vLLM adds no chunk
      stop for them);
    * ``None``: every state written (dense).

    With a ``prefix_match_unit`` finer than the block the prompt's tail unit
    (TAIL) is kept besides its last block boundary (PROMPT_END). The junction is a
    chunk stop in all three (``_mamba_block_aligned_split``).

    Args:
        retention_interval: as above. A positive value must be a multiple of
            the block size (checked where the layout is known,
            :class:`~vllm_admission.core.geometry.CacheLayout`).

    Raises:
        ValueError: a negative or non-integer interval.
    """

    name = "vllm"
    summary = ("stock vLLM 0.32: the prompt's last block boundary plus the shared-prefix "
               "junction (prefix_cache_retention_interval=0; N adds every N tokens, None all)")
    vllm_native = True
    auto_candidate = True
    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.PROMPT_END, CheckpointKind.TAIL})

    def __init__(self, retention_interval: int | None = 0) -> None:
        check_retention_interval(retention_interval)
        self.retention_interval = retention_interval
        if retention_interval is None:
            self.admitted = frozenset(CheckpointKind)
        elif retention_interval > 0:
            self.period = retention_interval
            self.admitted = VllmAdmission.admitted | {CheckpointKind.PERIODIC}

    @classmethod
    def for_engine(cls, *, retention_interval: int | None = 0) -> AdmissionPolicy:
        return cls(retention_interval)

    def junction(self, probe: HitProbe) -> int:
        return probe.junction

    def __repr__(self) -> str:
        return f"VllmAdmission(retention_interval={self.retention_interval!r})"


class MarconiAdmission(AdmissionPolicy):
    name = "marconi"
    summary = ("Marconi at block granularity: the shared-prefix junction plus the "
               "last block boundary of the finished sequence (prompt + output)")
    auto_candidate = True
    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.SEQUENCE_END})

    def junction(self, probe: HitProbe) -> int:
        return probe.junction


class BlockAdmission(AdmissionPolicy):
    """Stock vLLM's admission with prompt ends on block boundaries only: the
    junction and the prompt's last block boundary (PROMPT_END), never the tail
    hash unit inside a block (TAIL).

    Without a ``prefix_match_unit`` finer than the block this is ``vllm`` at
    retention 0. With one, vLLM keeps each prompt's tail-unit state besides its
    block-boundary one, and keys the attention block there; hits on those land
    only on resends and on prompts that extend a whole earlier prompt, and where
    memory is short the extra states and the kept partial blocks push out what
    would have hit (docs/results.md, section 3.7). This keeps what stock keeps
    without the unit, so the unit costs no cache space; ``auto`` weighs it against
    ``vllm`` only where the engine hashes finer than the block
    (:attr:`sub_block_only`).
    """

    name = "block"
    summary = ("stock vLLM with prompt ends on block boundaries only: under a "
               "prefix_match_unit no tail-unit state (hits stay whole blocks, no extra memory)")
    auto_candidate = True
    sub_block_only = True
    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.PROMPT_END})

    def junction(self, probe: HitProbe) -> int:
        return probe.junction


class DenseAdmission(AdmissionPolicy):
    name = "dense"
    summary = "a state at every block boundary (vLLM's older 'all' mode): most hits, most memory"
    auto_candidate = True
    every_block = True

    admitted = frozenset(CheckpointKind)


# ---------------------------------------------------------------- one request

#: The kinds of the prompt's tail unit boundary inside a block
#: (:attr:`RequestAdmission.tail`): a chunk end that is the prompt's last
#: reusable position at the hash unit.
_TAIL_KINDS = frozenset({CheckpointKind.CHUNK_END, CheckpointKind.TAIL})

class AdmissionDecision(enum.IntEnum):
    """What :meth:`RequestAdmission.decide` says of the state at a block-aligned position."""

    #: No state kept there.
    SKIP = 0
    #: A state cached on the GPU (and so offered to a host tier).
    ADMIT = 1
    #: A state cached until a later state of the same request replaces it.
    TENTATIVE = 2
    #: A state for the host tier only (cached just long enough to be handed to it).
    HOST = 3


SKIP, ADMIT, TENTATIVE, HOST = (AdmissionDecision.SKIP, AdmissionDecision.ADMIT,
                                 AdmissionDecision.TENTATIVE, AdmissionDecision.HOST)


@dataclass(frozen=True)
class SegmentCosts:
    """What the FLOP value of a block depends on besides the request (Marconi 4.2).

    Attributes:
        block_size: tokens per block.
        num_attention_groups, num_state_groups: KV cache groups of each kind
            (per-token groups count as attention: hidden states hold a block per
            ``block_size`` tokens too).
        bytes_per_block: bytes one block id holds (the largest group's page x layers).
        segment_flops: ``f(end, start) -> FLOPs`` of computing tokens
            ``[start, end)`` with ``start`` cached (``ModelCosts.prefill_flops``).
    """

    block_size: int
    num_attention_groups: int
    num_state_groups: int
    bytes_per_block: int
    segment_flops: Callable[[int, int], float]


def segment_values(checkpoints: Sequence[int], costs: SegmentCosts) -> dict[int, float]:
    """FLOP efficiency of each segment of a prefix (Marconi 4.2, at block granularity).

    Marconi scores a radix-tree node by the FLOPs a hit on it saves relative
    to its parent, per byte the node holds. Here a node is a *segment*: the
    tokens between two consecutive cached state positions ``q < p`` of one
    prefix. A hit at ``p`` instead of ``q`` saves ``segment_flops(p, q)``
    FLOPs; the segment holds its attention blocks in every attention group
    plus one state block per state group.

    Args:
        checkpoints: ascending cached-state positions (tokens) along the prefix.
        costs: the geometry and FLOP model.

    Returns:
        ``{p: FLOPs per byte}`` for every checkpoint ``p``.
    """
    values = {}
    prev = 0
    per_block = costs.num_attention_groups * costs.bytes_per_block
    state_bytes = costs.num_state_groups * costs.bytes_per_block
    for p in checkpoints:
        values[p] = (costs.segment_flops(p, prev)
                     / ((p - prev) // costs.block_size * per_block + state_bytes))
        prev = p
    return values


def block_value(values: dict[int, float], checkpoints: Sequence[int], end: int,
                is_state: bool) -> float:
    """Value of the block ending at token ``end``: its segment's FLOP efficiency.

    A state block's segment ends at ``end``; an attention block belongs to the
    first segment ending at or after ``end``. Attention blocks past the last
    checkpoint, and states that are not checkpoints, are worth 0: no hybrid
    hit can use them.
    """
    if is_state:
        return values.get(end, 0.0)
    k = bisect.bisect_left(checkpoints, end)
    return values[checkpoints[k]] if k < len(checkpoints) else 0.0


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
            then a ``supersede_tail`` policy keeps every state at or after the
            prompt end tentatively (:data:`TENTATIVE`) and the caller keeps
            only the latest one.
        junction: the junction the request acts on. Default: the policy's
            (:meth:`AdmissionPolicy.junction`). The plugin passes vLLM's own
            value for a ``vllm_native`` policy.
        hash_block_size: tokens per block hash when finer than the block
            (vLLM's ``prefix_match_unit``); ``None``: the block size.
        eagle: EAGLE/MTP speculative decoding: the prompt checkpoints are one
            block lower (:func:`prompt_ends`).
        host_policy: the admission policy of a host tier (per-tier admission): a
            state inside the prompt that ``policy`` does not cache but ``host_policy``
            would (as a live engine caches it, :meth:`cached_live`) is decided
            :data:`HOST`, and its position becomes a chunk stop too. ``None``: the
            host tier gets what the GPU caches, nothing more.

    Attributes:
        junction: the junction (tokens; 0: none).
        prompt_end: the prompt checkpoint, where vLLM ends a chunk:
            ``(prompt_len - 1) // B * B``, with EAGLE ``prompt_len // B * B - B``
            (0 when there is none).
        tail: with a finer hash unit ``u``, the prompt's tail unit boundary
            ``(prompt_len - 1) // u * u`` when it lies inside a block, else 0
            (with EAGLE ``prompt_len // u * u - u``, one unit below the last
            boundary a lookup can reach, as the lookup drops one unit:
            ``get_mamba_prefill_checkpoint_position``). vLLM ends a chunk there
            and keys the state written there by the hash unit
            (``MambaManager._cache_partial_tail_block``); its kind is TAIL (else
            TAIL goes with PROMPT_END), so a policy that keeps TAIL keeps it.
        attn_tail: where the attention groups key the prompt's tail unit when it
            lies inside a block, else 0 (``FullAttentionManager._cache_partial_tail_block``):
            :attr:`tail`, but with EAGLE ``prompt_len // u * u``, the unit a
            lookup matches before it drops one.
        tail_stop: with a finer hash unit, the tail unit boundary whether or not
            it lies inside a block: vLLM ends a chunk there (``Scheduler._mamba_block_aligned_split``'s
            ``tail_boundary``); without EAGLE a block-aligned one is :attr:`prompt_end`.
        stops: ascending chunk stops (the junction included when used), the host
            policy's included.
        host_stops: the host policy's stops that are not the GPU policy's own.
        admitted: ascending positions cached in the first state group.
    """

    __slots__ = ("policy", "probe", "junction", "prompt_end", "tail", "attn_tail", "tail_stop",
                 "eagle", "stops", "host_stops", "admitted", "_host",
                 "_special", "_plain_chunk", "_plain_decode", "_period", "_periodic_chunk",
                 "_periodic_decode", "_tail_ok", "_may_end", "_below_hit", "_values", "_version")

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
            self.tail_stop = max(reach - u, 0) if eagle else reach
            self.tail = self.tail_stop if self.tail_stop % B else 0
            self.attn_tail = reach if reach % B else 0
        else:
            self.tail = self.attn_tail = self.tail_stop = 0
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
        seq = (sequence_end(P, total_len, B, eagle, self.tail_stop) if total_len is not None
               else 0)
        for pos in (junction, *ends, seq):
            if pos > 0 and pos not in special:
                special[pos] = policy.admit(checkpoint_kinds(
                    pos, prompt_len=P, total_len=total_len, block_size=B, junction=junction,
                    period=period, tail=self.tail_stop or None, eagle=eagle))
        if self.tail_stop and self.tail_stop not in special:
            # Inside a block, or (EAGLE) a block boundary where vLLM keys the state by
            # the hash unit all the same (MambaManager._cache_partial_tail_block).
            special[self.tail_stop] = policy.admit(_TAIL_KINDS)
        self._special = special
        self._plain_chunk, self._plain_decode, keeps_sequence_end = policy.plain_decisions
        self._period = period
        if period:
            self._periodic_chunk = policy.admit(
                frozenset({CheckpointKind.CHUNK_END, CheckpointKind.PERIODIC}))
            self._periodic_decode = policy.admit(
                frozenset({CheckpointKind.DECODE, CheckpointKind.PERIODIC}))
        self._may_end = policy.supersede_tail and keeps_sequence_end
        self._tail_ok = total_len is None and self._may_end
        self._below_hit: list[int] | None = None
        self._values: tuple | None = None
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

    def keeps_tail(self) -> bool:
        """Whether the policy keeps the state at the prompt's tail unit boundary
        (:attr:`tail_stop`; a hash unit finer than the block): only then do the
        attention groups key :attr:`attn_tail`, the unit a lookup that lands there
        matches, and the state groups :attr:`tail` when it lies inside a block.

        A block-aligned tail stop (EAGLE) that a ``supersede_tail`` policy may keep as
        the sequence end counts as kept: a live engine caches it tentatively and keys
        the attention tail before it knows, so the simulator, which knows, does too."""
        t = self.tail_stop
        if not t:
            return False
        d = self.decide(t)
        if d == ADMIT:
            return True
        return (t % self.probe.block_size == 0 and self._may_end
                and t >= self.prompt_end)

    def decide(self, position: int) -> AdmissionDecision:
        """The :class:`AdmissionDecision` for the state at ``position``: ``ADMIT`` (cache it),
        ``TENTATIVE`` (cache it until a later state of the request replaces it), ``HOST``
        (hand it to the host tier only) or ``SKIP``."""
        ok = self._special.get(position)
        if ok is None:
            if self._period and position % self._period == 0:
                ok = (self._periodic_chunk if position <= self.probe.prompt_len
                      else self._periodic_decode)
            else:
                ok = self._plain_chunk if position <= self.probe.prompt_len else self._plain_decode
        if ok:
            return ADMIT
        if self._tail_ok and position >= self.prompt_end:
            return TENTATIVE
        host = self._host
        if (host is not None and position <= self.probe.prompt_len
                and host.cached_live(position)):
            return HOST
        return SKIP

    def cached_live(self, position: int) -> bool:
        """Whether a live engine, which does not know the request's length, caches the
        state at ``position`` when it is written: :meth:`decide` admits it, or a
        ``supersede_tail`` policy keeps it tentatively as a possible sequence end (at
        or after the prompt end) until a later state replaces it. What a KV connector
        is handed (a host tier stores every state the engine caches, the tentative
        ones included), with the :data:`HOST` ones."""
        d = self.decide(position)
        return d in (ADMIT, HOST) or (self._may_end and position >= self.prompt_end)

    def kept_as_sequence_end(self, position: int) -> bool:
        """Whether the state at ``position`` is admitted only as the sequence end
        of a ``supersede_tail`` policy (``marconi``): a live engine, which does
        not know the length, caches it tentatively (:data:`TENTATIVE`) and
        learns only when the request finishes that it stays.

        Meaningful for a position :meth:`decide` admits; False for every
        position of a policy without ``supersede_tail``.
        """
        policy = self.policy
        if not policy.supersede_tail:
            return False
        probe = self.probe
        return not policy.admit(checkpoint_kinds(
            position, prompt_len=probe.prompt_len, total_len=None,
            block_size=probe.block_size, junction=self.junction, period=policy.period,
            tail=self.tail_stop or None, eagle=self.eagle))

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
        (:meth:`checkpoints`, :func:`segment_values`), computed again only when
        :attr:`admitted` changed. A block's value is then
        ``block_value(values, checkpoints, end, is_state)``."""
        memo = self._values
        if memo is None or memo[0] != self._version:
            ckpts = self.checkpoints(is_cached_state)
            memo = self._values = (self._version, ckpts, segment_values(ckpts, costs))
        return memo[1], memo[2]

    def block_value(self, end: int, is_state: bool, costs: SegmentCosts,
                    is_cached_state: Callable[[int], bool]) -> float:
        """FLOP efficiency (FLOPs saved per byte) of the request's block ending at
        token ``end`` (:meth:`segment_table`, :func:`block_value`)."""
        ckpts, values = self.segment_table(costs, is_cached_state)
        return block_value(values, ckpts, end, is_state)


def _check_admission(cls: type) -> None:
    """What :data:`ADMISSION_POLICIES` asks of an admission class beyond a name and a summary."""
    if not hasattr(cls, "admitted") and cls.admit is AdmissionPolicy.admit:
        raise TypeError(f"{cls.__name__} must set admitted or override admit")


#: The entry-point group through which another package adds admission policies
#: (``[project.entry-points."vllm_admission.admission_policies"]``: ``name =
#: "package.module:PolicyClass"``).
ENTRY_POINT_GROUP = "vllm_admission.admission_policies"

#: Registry: name -> admission policy class, in the order shown to users
#: (:class:`~vllm_admission.core.registry.PolicyRegistry`; other packages' policies join it
#: when a front end loads the entry points).
ADMISSION_POLICIES: PolicyRegistry[AdmissionPolicy] = PolicyRegistry(
    "admission", AdmissionPolicy, ENTRY_POINT_GROUP, check=_check_admission)


def register_admission(cls: type[AdmissionPolicy]) -> type[AdmissionPolicy]:
    """Add ``cls`` under ``cls.name``, after the policies registered so far
    (:meth:`PolicyRegistry.register <vllm_admission.core.registry.PolicyRegistry.register>`).

    Returns:
        ``cls`` (usable as a class decorator).

    Raises:
        TypeError: not a concrete :class:`AdmissionPolicy` subclass with a
            ``name``, a ``summary`` and ``admitted`` (or its own ``admit``).
        ValueError: the name is taken.
    """
    return ADMISSION_POLICIES.register(cls)


def get_admission(name: str, *, retention_interval: int | None = 0) -> AdmissionPolicy:
    """Build the admission policy registered under ``name`` for an engine whose
    ``prefix_cache_retention_interval`` is ``retention_interval``
    (:meth:`AdmissionPolicy.for_engine`: only ``vllm`` follows it).

    Raises:
        UnknownPolicyError: ``name`` is not registered; the message lists the
            valid names.
        ValueError: an invalid retention interval.
    """
    cls = ADMISSION_POLICIES.policy_class(name)
    return cls.for_engine(retention_interval=retention_interval)


def stock_admission() -> str:
    """The name of the one registered policy that is vLLM's own behaviour
    (``vllm_native``: ``vllm``).

    Raises:
        LookupError: not exactly one registered policy declares ``vllm_native``.
    """
    names = [n for n, c in ADMISSION_POLICIES.items() if c.vllm_native]
    if len(names) != 1:
        raise LookupError(f"expected one admission policy native to vLLM, found {names}")
    return names[0]


for _cls in (NoAdmission, LastAdmission, VllmAdmission, BlockAdmission, MarconiAdmission,
             DenseAdmission):
    register_admission(_cls)
del _cls
