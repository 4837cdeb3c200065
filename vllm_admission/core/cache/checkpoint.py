"""Where prefill chunks end and how recurrent-state checkpoints are written.

:func:`chunk_end` is vLLM's align-mode rule for where a prefill chunk may end
(``Scheduler._mamba_block_aligned_split``, without the stops); the cache model
and the plugin's in-pass scheduler (:func:`vllm_admission.plugin.inpass.inpass_split`)
both call it. :func:`split_chunk` adds the checkpoint stops.

A checkpoint mode (:data:`CHECKPOINT_MODES`) is one strategy object,
:class:`SplitCheckpoints` or :class:`InpassCheckpoints`, chosen by
:data:`CHECKPOINT_STRATEGIES`: it runs a request's prefill steps through the
cache model's one step (:meth:`StepRunner.step
<vllm_admission.core.cache.running.StepRunner.step>`, which
:class:`~vllm_admission.core.cache.model.HybridPrefixCache` implements) and returns
how many steps it took.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from vllm_admission.core.admission import ADMIT, HOST
from vllm_admission.core.cache.running import RunningRequest, StepRunner
from vllm_admission.core.errors import UserError
from vllm_admission.core.layout import DEFAULT_CHECKPOINT

__all__ = ["CHECKPOINT_MODES", "CHECKPOINT_STRATEGIES", "InpassCheckpoints", "SplitCheckpoints",
           "check_checkpoint_mode", "chunk_end", "split_chunk"]

#: How recurrent-state checkpoints are written during prefill:
#:
#: * ``"split"`` (default): vLLM 0.32. A state is written only where a forward
#:   pass ends, so a prefill chunk ends at every checkpoint position (the prompt
#:   checkpoint, the junction, the admission policy's stops) and every chunk end
#:   is block-aligned (``Scheduler._mamba_block_aligned_split``).
#: * ``"inpass"``: the model runner captures the state at the admitted
#:   block-aligned positions inside one forward pass (the plugin's
#:   ``VLLM_ADMISSION_CHECKPOINT=inpass``), so chunks end only at the token
#:   budget (floored to a block, as vLLM's align mode does) and at the prompt
#:   end. Every state ``split`` keeps is kept, in fewer prefill steps; ``last``
#:   keeps the same states too, since its chunk ends are the floored budget ends.
CHECKPOINT_MODES = (DEFAULT_CHECKPOINT, "inpass")


def check_checkpoint_mode(mode: str) -> str:
    """Return ``mode`` if it is one of :data:`CHECKPOINT_MODES`.

    Raises:
        UserError: an unknown mode; the message lists the valid ones.
    """
    if mode not in CHECKPOINT_MODES:
        raise UserError(f"unknown checkpoint mode {mode!r}; valid: {', '.join(CHECKPOINT_MODES)}")
    return mode


def chunk_end(start: int, end: int, prefill_end: int, block_size: int, budget: int) -> int:
    """Where a prefill chunk ``[start, end)`` may end in vLLM's align mode.

    ``Scheduler._mamba_block_aligned_split`` (``v1/core/sched/scheduler.py``)
    for a fresh request without EAGLE, less the checkpoint stops: an end before
    ``prefill_end`` is floored to a block boundary (unless that leaves nothing
    and a block is larger than the token ``budget``), and a chunk that starts
    mid-block ends at the next boundary. Positions in tokens.

    Returns:
        The chunk's end; at most ``end``, and ``<= start`` when nothing fits.
    """
    B = block_size
    if end < prefill_end:
        aligned = end // B * B
        if aligned > start or budget >= B:
            end = aligned
    if start % B:
        boundary = (start // B + 1) * B
        end = min(end, boundary)
    return end


def split_chunk(start: int, n: int, prompt_len: int, block_size: int, budget: int,
                ends: Sequence[int]) -> int:
    """Tokens of the prefill chunk that starts at ``start``, at most ``n``.

    :func:`chunk_end`, then the first of ``ends`` (ascending positions where a
    chunk must end: ``split`` mode's checkpoint positions; ``inpass`` mode:
    none) inside the chunk ends it.
    """
    stop = chunk_end(start, start + n, prompt_len, block_size, budget)
    k = bisect.bisect_right(ends, start)
    if k < len(ends) and ends[k] < stop:
        stop = ends[k]
    return max(stop - start, 0)


def _checkpoint_positions(run: RunningRequest) -> tuple[int, ...]:
    """Ascending checkpoint positions: the policy's stops, then the prompt
    checkpoint (every stop is a block boundary below the prompt end), then,
    with a hash block size below the block size, the prompt's unit end
    inside the last block (vLLM ends a chunk there whatever the policy keeps:
    ``_mamba_block_aligned_split``'s ``tail_boundary``)."""
    adm = run.adm
    ends = adm.stops
    if not ends or ends[-1] != adm.prompt_end:
        ends = (*ends, adm.prompt_end)
        if len(ends) > 1 and ends[-2] > ends[-1]:  # EAGLE: the checkpoint is a block lower
            ends = tuple(sorted(set(ends)))
    if adm.prompt_unit_end and adm.prompt_unit_end not in ends:
        ends = tuple(sorted((*ends, adm.prompt_unit_end)))
    return tuple(ends)


class SplitCheckpoints:
    """``split`` mode (vLLM 0.32): a prefill chunk ends at every checkpoint position.

    Args:
        prompt_end_export: vLLM's one-checkpoint export (a ``MambaSpec`` with
            ``num_prefill_checkpoint_blocks=1``): when the prompt's last chunk
            can start at least one block below the prompt checkpoint and reach
            the prompt end in one step, no chunk ends at the checkpoint; the
            step writes the checkpoint's state into a block of its own, as an
            in-pass capture (``_mamba_block_aligned_split``,
            ``MambaManager._needs_internal_checkpoint``).
    """

    name = "split"

    def __init__(self, *, prompt_end_export: bool = False) -> None:
        self.prompt_end_export = prompt_end_export

    def prefill(self, cache: StepRunner, run: RunningRequest, computed: int,
                output_len: int, now: float) -> int:
        """Run the prefill steps of ``[computed, prompt_len)``; return their number."""
        B, P, budget = cache.block_size, run.prompt_len, cache.chunk_size
        adm, step = run.adm, cache.step
        ends = _checkpoint_positions(run)
        steps = 0
        pe = adm.prompt_end
        # A policy stop at the prompt checkpoint (a junction there) still ends a chunk.
        export = self.prompt_end_export and 0 < pe < P and pe not in adm.stops
        if export:
            ends_export = tuple(p for p in ends if p != pe)
        while computed < P:
            n = split_chunk(computed, min(P - computed, budget), P, B, budget, ends)
            if export and computed % B == 0 and computed + B <= pe and computed + n == pe:
                # vLLM's export: the last chunk runs on to the prompt end if the
                # budget allows, and the pass writes the checkpoint's state.
                m = split_chunk(computed, min(P - computed, budget), P, B, budget, ends_export)
                if computed + m == P:
                    n = m
                    step(run, computed, n, P, now, (pe,))
                    computed += n
                    steps += 1
                    continue
            step(run, computed, n, P, now)
            computed += n
            steps += 1
        return steps


class InpassCheckpoints:
    """``inpass`` mode: the states at the admitted checkpoint positions are
    captured inside the chunk's forward pass; only the token budget (floored to
    a block) and the prompt end end a chunk, and a chunk with more captures than
    the pool can hold (:meth:`~vllm_admission.core.cache.model.HybridPrefixCache.inpass_capture_limit`)
    ends at the first one past the limit.

    Raises:
        ValueError: ``prompt_end_export`` (a ``split`` mode option).
    """

    name = "inpass"

    def __init__(self, *, prompt_end_export: bool = False) -> None:
        if prompt_end_export:
            raise ValueError(f"prompt_end_export needs checkpoint='split', got {self.name!r}")

    def prefill(self, cache: StepRunner, run: RunningRequest, computed: int,
                output_len: int, now: float) -> int:
        """Run the prefill steps of ``[computed, prompt_len)``; return their number."""
        B, P, budget = cache.block_size, run.prompt_len, cache.chunk_size
        adm, step = run.adm, cache.step
        # States for the GPU cache, and those for the host tier only (per-tier admission).
        captures = [p for p in _checkpoint_positions(run) if adm.decide(p) in (ADMIT, HOST)]
        run.written = set()
        limit = cache.inpass_capture_limit(P, output_len)
        steps = 0
        while computed < P:
            n = split_chunk(computed, min(P - computed, budget), P, B, budget, ())
            inner = [p for p in captures if computed < p < computed + n]
            if len(inner) > limit:  # the pool cannot hold them all: end the chunk there
                n = inner[limit] - computed
                inner = inner[:limit]
            step(run, computed, n, P, now, inner)
            computed += n
            steps += 1
        return steps


#: Registry: checkpoint mode -> its strategy class.
CHECKPOINT_STRATEGIES: dict[str, type] = {cls.name: cls for cls in (SplitCheckpoints,
                                                                     InpassCheckpoints)}
