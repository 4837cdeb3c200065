"""Why align mode wrote a recurrent state at a block-aligned position: the
:class:`CheckpointKind` of each position, and the prompt and sequence ends they rest on.

Positions are in tokens. Sources: vLLM 0.32 ``vllm/v1/core/kv_cache_coordinator.py``
(``replay_boundaries``: the prompt's last reusable position is ``prompt_len - 1``,
block-floored), ``vllm/v1/core/single_type_kv_cache_manager.py``
(``MambaManager.reachable_block_mask``, ``_cache_partial_tail_block``); Marconi
(Pan et al., MLSys 2025) section 4.1 for the sequence end.
"""

from __future__ import annotations

import enum
import itertools

__all__ = ["PROMPT_UNIT_END_KINDS", "CheckpointKind", "checkpoint_kinds", "prompt_ends", "sequence_end"]


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
    #: EAGLE/MTP the highest state an extending request can still reach, a block
    #: lower: :func:`sequence_end`).
    SEQUENCE_END = "sequence_end"
    #: A state written during prefill (a prefill chunk end).
    CHUNK_END = "chunk_end"
    #: A state written at a block boundary crossed during decode.
    DECODE = "decode"
    #: A position on vLLM's periodic retention grid: a multiple of the engine's
    #: ``prefix_cache_retention_interval`` when that is positive
    #: (``MambaManager.reachable_block_mask``, ``vllm/v1/core/single_type_kv_cache_manager.py``).
    PERIODIC = "periodic"
    #: The prompt's unit end: its last reusable position at the engine's hash block,
    #: ``(prompt_len - 1) // u * u`` under a ``prefix_match_unit`` ``u`` finer than the
    #: block when that lies inside a block (vLLM keys the state written there,
    #: ``MambaManager._cache_partial_tail_block``), else the PROMPT_END position.
    PROMPT_UNIT_END = "prompt_unit_end"
    #: The former spelling of :attr:`PROMPT_UNIT_END` (an alias, the same member), kept
    #: for admission policies of other packages that name it in ``admitted``.
    TAIL = "prompt_unit_end"



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
                 prompt_unit_end: int = 0) -> int:
    """The SEQUENCE_END position: where a later request that extends the whole
    sequence (``total_len`` tokens, prompt and output) can resume from a state.

    Without EAGLE: ``L = (total_len - 1) // B * B``, the last block boundary the
    sequence reaches (the last state written).

    With EAGLE/MTP the extending request's lookup matches the KV of at most ``L``
    tokens and drops the last matched block (``vllm/v1/core/kv_cache_coordinator.py``),
    so a state at ``L`` is never reached: the sequence end is the highest state written
    at or below ``L - B``. That is ``L - B`` itself when it is at or past the prompt (a
    decode boundary, or the prompt's end on a block boundary, where the last prefill
    chunk ends), else the prompt checkpoint (:func:`prompt_ends`, where vLLM ends a
    chunk). A live engine, which learns the length only when the request finishes,
    keeps the request's two latest states as possible ends and drops the latest then
    (``vllm_admission/plugin/requests.py``).

    With EAGLE and a hash block size below the block size (``prompt_unit_end`` > 0, the
    prompt's unit end, :attr:`~vllm_admission.core.admission.RequestAdmission.prompt_unit_end`)
    the end stays the last state written: ``L`` when decode crossed a block boundary
    past the prompt, else the prompt checkpoint or ``prompt_unit_end`` when that is a
    higher block boundary (a chunk also ends there).
    """
    B = block_size
    last = (total_len - 1) // B * B
    if not eagle:
        return last
    ends = prompt_ends(prompt_len, B, True)
    end = ends[-1] if ends else 0
    if not prompt_unit_end:
        reach = last - B
        return reach if reach >= prompt_len else end
    if last >= prompt_len:
        return last
    return prompt_unit_end if prompt_unit_end > end and prompt_unit_end % B == 0 else end


def checkpoint_kinds(position: int, *, prompt_len: int, total_len: int | None,
                     block_size: int, junction: int, period: int = 0,
                     prompt_unit_end: int | None = None,
                     eagle: bool = False) -> frozenset[CheckpointKind]:
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
        prompt_unit_end: the request's PROMPT_UNIT_END position
            (:attr:`~vllm_admission.core.admission.RequestAdmission.prompt_unit_end` with a
            smaller hash block size: inside a block, or under EAGLE possibly a block boundary
            of its own); ``None``: the PROMPT_END position where vLLM ends a chunk.
        eagle: EAGLE/MTP speculative decoding: PROMPT_END is each of
            :func:`prompt_ends` (one block lower).

    Returns:
        A non-empty frozenset: CHUNK_END or DECODE always, plus JUNCTION,
        PROMPT_END, SEQUENCE_END, PERIODIC and PROMPT_UNIT_END where they apply.
    """
    ends = prompt_ends(prompt_len, block_size, eagle)
    prompt_end = ends[-1] if ends else 0
    return _KIND_SETS[(
        position <= prompt_len,
        bool(junction) and position == junction,
        position in ends,
        total_len is not None and position == sequence_end(prompt_len, total_len, block_size,
                                                           eagle, prompt_unit_end or 0),
        bool(period) and position % period == 0,
        position == (prompt_end if prompt_unit_end is None else prompt_unit_end),
    )]


def _kind_set(in_prompt: bool, junction: bool, prompt_end: bool,
              sequence_end: bool, periodic: bool, prompt_unit_end: bool) -> frozenset[CheckpointKind]:
    kinds = {CheckpointKind.CHUNK_END if in_prompt else CheckpointKind.DECODE}
    for flag, kind in ((junction, CheckpointKind.JUNCTION), (prompt_end, CheckpointKind.PROMPT_END),
                       (sequence_end, CheckpointKind.SEQUENCE_END),
                       (periodic, CheckpointKind.PERIODIC),
                       (prompt_unit_end, CheckpointKind.PROMPT_UNIT_END)):
        if flag:
            kinds.add(kind)
    return frozenset(kinds)


#: :func:`checkpoint_kinds`' answers, built once (a request asks for up to three,
#: and hashing enum members in Python is what a fresh set would cost).
_KIND_SETS = {flags: _kind_set(*flags) for flags in itertools.product((False, True), repeat=6)}

#: The kinds of the prompt's unit end inside a block
#: (:attr:`~vllm_admission.core.admission.RequestAdmission.state_sub_block_end`): a chunk
#: end that is the prompt's last reusable position at the hash block.
PROMPT_UNIT_END_KINDS = frozenset({CheckpointKind.CHUNK_END, CheckpointKind.PROMPT_UNIT_END})
