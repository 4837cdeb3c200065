"""A request while it runs in the cache model: its bookkeeping (:class:`RunningRequest`,
shared by the group parts, the block values and the checkpoint strategies) and the step
interface the checkpoint strategies drive (:class:`StepRunner`, which
:class:`~vllm_admission.core.cache.model.HybridPrefixCache` implements).

Imports no other module of the cache package, so that each of them may name these types.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from vllm_admission.core.admission import RequestAdmission

if TYPE_CHECKING:  # names only: the cache package's modules may import this one
    from vllm_admission.core.cache.host import HostRequest

__all__ = ["RunningRequest", "StepRunner"]


@dataclass(slots=True)
class RunningRequest:
    """Per-request bookkeeping while a request runs (the managers' dicts).

    Every group caches its full blocks at the same steps, and every state group
    holds its blocks at the same indexes, so both are kept once for all groups.
    """

    rid: int
    hashes: Sequence[int]
    prompt_len: int
    #: The request's admission decisions, stops, checkpoints and block values.
    adm: RequestAdmission
    #: Each group's block table (a state group's holds NULL where it has no block).
    blocks: list[list[int]]
    #: Leading blocks of every group already cached (``num_cached_block``).
    num_cached: int
    #: Ascending indexes where the state groups hold a block (not NULL).
    live: list[int]
    #: ``inpass`` mode: indexes ``i`` whose state block was written with the
    #: state at ``(i + 1) * B`` (a capture or a block-aligned step end); only
    #: those may be cached. ``None`` in ``split`` mode, where every step end is
    #: block-aligned (or followed by a stop at the next boundary).
    written: set[int] | None = None
    #: A hash block finer than the block (vLLM's ``prefix_match_unit``): the
    #: prompt's hash-unit keys, one per unit (``None``: no sub-block keys).
    units: Sequence[Hashable] | None = None
    #: The prompt's unit end inside a block (:attr:`RequestAdmission.state_sub_block_end
    #: <vllm_admission.core.admission.RequestAdmission.state_sub_block_end>`) when its state is
    #: kept (its sub-block key is registered), else 0.
    state_sub_block_end: int = 0
    #: Where the attention groups key their partial last block
    #: (:attr:`RequestAdmission.attn_sub_block_end
    #: <vllm_admission.core.admission.RequestAdmission.attn_sub_block_end>`; ``state_sub_block_end`` but under
    #: EAGLE), or 0.
    attn_sub_block_end: int = 0
    #: The attention groups' block holding ``attn_sub_block_end`` has its sub-block key.
    attn_sub_block_keyed: bool = False
    #: The state at ``state_sub_block_end`` was cached; its key moves to a block of its own at
    #: the next allocation (``MambaManager.allocate_new_blocks``).
    move_sub_block_state: bool = False
    #: Index of the block a sub-block hit shares with the cache: every group
    #: replaces it by a private copy at the first allocation (-1: none).
    cow: int = -1
    #: Speculative decoding: per state group, the speculative blocks held from
    #: the first allocation (``None``: none taken yet).
    spec_blocks: list[list[int]] | None = None
    #: With a host tier: the request's dealings with it
    #: (:class:`~vllm_admission.core.cache.host.HostRequest`), else ``None``.
    host: HostRequest | None = None
    #: With a host tier: indexes of the state blocks cached since the last store
    #: (the Mamba manager's hand-offs to the connector).
    cached_states: list[int] = field(default_factory=list)
    #: Where the request's previous step started (its first step: where it starts);
    #: under async scheduling vLLM retires state blocks up to there only.
    prev_start: int = 0


class StepRunner(Protocol):
    """What a checkpoint strategy (:mod:`~vllm_admission.core.cache.checkpoint`) needs of
    the cache model to run a request's prefill."""

    @property
    def block_size(self) -> int:
        """Tokens per block."""

    @property
    def chunk_size(self) -> int:
        """Prefill token budget per step (vLLM's ``max_num_batched_tokens``)."""

    def step(self, run: RunningRequest, start: int, n: int, num_tokens: int, now: float,
             captures: Sequence[int] = ()) -> None:
        """One scheduler step computing tokens ``[start, start + n)`` while the request
        has ``num_tokens`` tokens; ``captures``: block-aligned positions inside the step
        whose states are copied into blocks of their own."""

    def inpass_capture_limit(self, prompt_len: int, output_len: int) -> int:
        """``inpass`` mode: most states one prefill step of this request captures."""
