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
methods. Policies are chosen by name from :data:`ADMISSION_POLICIES`.

Sources: Marconi (Pan et al., MLSys 2025, section 4.1, "admission"); vLLM 0.32
``vllm/v1/core/sched/scheduler.py`` (``_mamba_block_aligned_split``),
``vllm/v1/core/kv_cache_manager.py`` (``get_computed_blocks``: the junction is
the attention-KV hit when it runs past the state hit) and
``vllm/v1/core/kv_cache_coordinator.py`` (``replay_boundaries``: the prompt's
last reusable position is ``prompt_len - 1``, block-floored).
"""

from __future__ import annotations

import enum
from abc import ABC
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "ADMISSION_POLICIES",
    "AdmissionPolicy",
    "CheckpointKind",
    "DenseAdmission",
    "HitProbe",
    "LastAdmission",
    "MarconiAdmission",
    "NoAdmission",
    "UnknownPolicyError",
    "checkpoint_kinds",
    "VllmAdmission",
    "get_admission",
]


class UnknownPolicyError(ValueError):
    """An admission or eviction policy name that is not registered."""


class CheckpointKind(enum.Enum):
    """Why align mode wrote a recurrent state at a block-aligned position.

    A position usually has several kinds (see :func:`checkpoint_kinds`).
    """

    #: The shared-prefix junction: the attention-KV hit ran past the state hit.
    JUNCTION = "junction"
    #: The prompt's last reusable position, ``(prompt_len - 1) // B * B``.
    PROMPT_END = "prompt_end"
    #: The last block boundary the whole sequence reaches,
    #: ``(prompt_len + output_len - 1) // B * B`` (Marconi's "sequence end").
    SEQUENCE_END = "sequence_end"
    #: A state written during prefill (a prefill chunk end).
    CHUNK_END = "chunk_end"
    #: A state written at a block boundary crossed during decode.
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class HitProbe:
    """What the KV cache coordinator saw for one request at admission time.

    All lengths are in tokens.

    Attributes:
        prompt_len: prompt tokens of the request.
        block_size: tokens per KV cache block (the attention block size).
        kv_hit: longest prefix whose attention-KV blocks are all cached
            (block-aligned, at most ``prompt_len - 1``).
        state_hit: longest prefix that also has a cached recurrent state at its
            end: the hybrid hit (``<= kv_hit``).
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
        vLLM ``KVCacheManager.get_computed_blocks``).
        """
        return self.kv_hit if self.kv_hit > self.state_hit else 0


def checkpoint_kinds(position: int, *, prompt_len: int, total_len: int | None,
                     block_size: int, junction: int) -> frozenset[CheckpointKind]:
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

    Returns:
        A non-empty frozenset: CHUNK_END or DECODE always, plus JUNCTION,
        PROMPT_END and SEQUENCE_END where they apply.
    """
    kinds = {CheckpointKind.CHUNK_END if position <= prompt_len else CheckpointKind.DECODE}
    if junction and position == junction:
        kinds.add(CheckpointKind.JUNCTION)
    if position == (prompt_len - 1) // block_size * block_size:
        kinds.add(CheckpointKind.PROMPT_END)
    if total_len is not None and position == (total_len - 1) // block_size * block_size:
        kinds.add(CheckpointKind.SEQUENCE_END)
    return frozenset(kinds)


class AdmissionPolicy(ABC):
    """One admission policy: where to force checkpoints, which states to keep.

    Subclasses set :attr:`name` and :attr:`admitted`; they may override
    :meth:`stops`. Policies are stateless and cheap to share.
    """

    #: Registry name: the CLI word and the ``VLLM_ADMISSION_POLICY`` value.
    name: ClassVar[str]
    #: One line for ``--help`` and the docs.
    summary: ClassVar[str]
    #: Whether the policy uses the shared-prefix junction stop.
    uses_junction: ClassVar[bool] = False
    #: Whether prefill chunks must end at every block boundary.
    every_block: ClassVar[bool] = False
    #: Whether a decode-time state replaces the request's earlier tentative
    #: end-of-sequence state (Marconi keeps one state per sequence end).
    supersede_tail: ClassVar[bool] = False

    def stops(self, probe: HitProbe) -> tuple[int, ...]:
        """Token positions where prefill chunks must end so that a state is written.

        Returns positions strictly inside ``(probe.state_hit, probe.prompt_len)``,
        ascending. The default forces the junction when the policy uses it.
        """
        junction = probe.junction if self.uses_junction else 0
        return (junction,) if junction else ()

    #: The checkpoint kinds this policy caches.
    admitted: ClassVar[frozenset[CheckpointKind]]

    def admit(self, kinds: frozenset[CheckpointKind]) -> bool:
        """Whether a state with these kinds (see :func:`checkpoint_kinds`) is cached."""
        return not self.admitted.isdisjoint(kinds)

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

    admitted = frozenset(CheckpointKind) - {CheckpointKind.JUNCTION}


class VllmAdmission(AdmissionPolicy):
    name = "vllm"
    summary = ("stock vLLM 0.32 (prefix_cache_retention_interval=0): the prompt's last "
               "block boundary plus the shared-prefix junction")
    uses_junction = True

    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.PROMPT_END})


class MarconiAdmission(AdmissionPolicy):
    name = "marconi"
    summary = ("Marconi at block granularity: the shared-prefix junction plus the "
               "last block boundary of the finished sequence (prompt + output)")
    uses_junction = True
    supersede_tail = True

    admitted = frozenset({CheckpointKind.JUNCTION, CheckpointKind.SEQUENCE_END})


class DenseAdmission(AdmissionPolicy):
    name = "dense"
    summary = "a state at every block boundary (vLLM's older 'all' mode): most hits, most memory"
    every_block = True

    def stops(self, probe: HitProbe) -> tuple[int, ...]:
        b = probe.block_size
        first = probe.state_hit // b + 1
        last = (probe.prompt_len - 1) // b
        return tuple(i * b for i in range(first, last + 1))

    admitted = frozenset(CheckpointKind)


#: Registry: name -> policy class, in the order shown to users.
ADMISSION_POLICIES: dict[str, type[AdmissionPolicy]] = {
    cls.name: cls
    for cls in (NoAdmission, LastAdmission, VllmAdmission, MarconiAdmission, DenseAdmission)
}


def get_admission(name: str) -> AdmissionPolicy:
    """Build the admission policy registered under ``name``.

    Raises:
        UnknownPolicyError: ``name`` is not registered; the message lists the
            valid names.
    """
    try:
        return ADMISSION_POLICIES[name]()
    except KeyError:
        valid = ", ".join(ADMISSION_POLICIES)
        raise UnknownPolicyError(
            f"unknown admission policy {name!r}; valid: {valid}") from None
