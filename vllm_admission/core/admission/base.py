"""The admission policy API: what a policy is asked (:class:`HitProbe`), its hooks
(:class:`AdmissionPolicy`) and what a request decides per state (:class:`AdmissionDecision`).

A policy has two levers, both at block-aligned token positions: :meth:`AdmissionPolicy.stops`
(where a prefill chunk must end so that a state is written there; vLLM 0.32
``Scheduler._mamba_block_aligned_split`` stops at ``request.shared_prefix_boundary``) and
:meth:`AdmissionPolicy.admit` (whether a state written there gets a block hash;
``MambaManager.cache_blocks`` / ``reachable_block_mask``). Source: Marconi (Pan et al.,
MLSys 2025) section 4.1.
"""

from __future__ import annotations

import enum
import functools
from abc import ABC
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm_admission.core.admission.kinds import CheckpointKind
from vllm_admission.core.registry import PolicyClass, overrides

__all__ = ["ADMIT", "HOST", "SKIP", "TENTATIVE", "AdmissionDecision", "AdmissionPolicy", "HitProbe"]


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
        no state was kept at their end. Without a smaller hash block size both lengths
        are whole blocks (vLLM's ``find_longest_cache_hit`` returns
        block-aligned lengths and caps the attention hit at ``prompt_len - 1``),
        so this is a multiple of ``block_size``, nonzero exactly when
        :attr:`junction` is.
        """
        return self.kv_hit - self.state_hit



class AdmissionPolicy(PolicyClass, ABC):
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
    * :attr:`tentative_sequence_end`: :meth:`admit` keeps a sequence-end state that it
      would not keep as a plain decode boundary, so a live engine, which does
      not know where the sequence ends, keeps each such state tentatively
      until the request's next one replaces it.

    Declared (facts, not hooks): :attr:`vllm_native` and :attr:`auto_candidate`, each
    stated by the class itself (a subclass does not inherit them), and
    :attr:`every_block`, which also gives the class its :meth:`stops` (so the two
    cannot disagree: declaring it and overriding :meth:`stops` is a ``TypeError``).
    """

    OWN_DECLARATIONS = ("vllm_native", "auto_candidate")
    #: Declared: whether this is exactly vLLM 0.32's own behaviour, so the engine
    #: leaves vLLM's code in charge (its junction, its Mamba manager).
    vllm_native: ClassVar[bool] = False
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
    #: Tokens between the positions
    #: :func:`~vllm_admission.core.admission.checkpoint_kinds` marks PERIODIC
    #: (0: none). Only a policy that follows the engine's retention setting
    #: (:meth:`for_engine`) has one.
    period: int = 0

    @classmethod
    def for_engine(cls, *, retention_interval: int | None = 0) -> AdmissionPolicy:
        """The policy as it runs on an engine with these settings.

        Args:
            retention_interval: the engine's ``prefix_cache_retention_interval``
                (vLLM's ``CacheConfig``: 0, a positive multiple of the block
                size, or ``None`` for retention interval ``none``).

        The default ignores the engine's settings (the policy decides what is
        cached by itself) and returns ``cls()``;
        :class:`~vllm_admission.core.admission.VllmAdmission`, which is vLLM's own
        behaviour, follows them.
        """
        return cls()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Derive :attr:`uses_junction` and :attr:`own_stops`. TypeError if the body
        declares a derived attribute, or declares :attr:`every_block` beside its own
        :meth:`stops`."""
        super().__init_subclass__(**kwargs)  # the own declarations (PolicyClass)
        for attr in ("uses_junction", "own_stops", "tentative_sequence_end"):
            if attr in cls.__dict__:
                raise TypeError(f"{cls.__name__}.{attr} is derived from the policy's hooks "
                                f"(junction, stops, admit); override those instead")
        overrides_stops = overrides(cls, AdmissionPolicy, "stops")
        if cls.every_block and overrides_stops:
            raise TypeError(f"{cls.__name__} declares every_block and its own stops(); "
                            f"every_block gives the stops (a chunk end at every block boundary)")
        cls.uses_junction = overrides(cls, AdmissionPolicy, "junction")
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

    #: The checkpoint kinds this policy caches: a class attribute, which an instance may
    #: replace by its own (``vllm`` with a retention interval).
    admitted: frozenset[CheckpointKind]

    def admit(self, kinds: frozenset[CheckpointKind]) -> bool:
        """Whether a state with these kinds
        (:func:`~vllm_admission.core.admission.checkpoint_kinds`) is cached."""
        return not self.admitted.isdisjoint(kinds)

    @functools.cached_property
    def plain_decisions(self) -> tuple[bool, bool, bool]:
        """``admit`` of a position with one kind only: a chunk end, a decode
        boundary, a sequence end (computed once per policy object)."""
        admit = self.admit
        return (admit(frozenset({CheckpointKind.CHUNK_END})), admit(frozenset({CheckpointKind.DECODE})),
                admit(frozenset({CheckpointKind.SEQUENCE_END})))

    @functools.cached_property
    def tentative_sequence_end(self) -> bool:
        """Derived: whether a decode-time state replaces the request's earlier
        tentative end-of-sequence state in a live engine: :meth:`admit` keeps a
        sequence end it would not keep as a plain decode boundary (Marconi keeps
        one state per sequence end). Computed once per policy object."""
        _, decode, sequence_end = self.plain_decisions
        return sequence_end and not decode

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class AdmissionDecision(enum.IntEnum):
    """What :meth:`RequestAdmission.decide
    <vllm_admission.core.admission.RequestAdmission.decide>` says of the state at a
    block-aligned position."""

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
