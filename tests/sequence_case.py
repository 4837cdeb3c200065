"""One request alone on an empty cache: which recurrent states each admission policy keeps
(shared by the scheduler-level and the engine tests).

Derived for any registered policy from its own answers, so a new policy is covered: in
``split`` mode (the token budget not binding) align mode writes a state at each of the
policy's chunk stops, at the prompt checkpoint ``(P - 1) // B * B`` and at every block
boundary decode crosses, up to ``(P + O - 1) // B * B``; the policy caches those its
``RequestAdmission.decide`` admits, knowing the length (the simulator; the engine learns it
when the request ends). A live engine keeps a ``tentative_sequence_end`` policy's sequence-end
candidates tentatively and drops all but the last.
"""

from __future__ import annotations

from vllm_admission.core.admission import (
    ADMIT,
    TENTATIVE,
    HitProbe,
    RequestAdmission,
    get_admission,
)


def written_positions(name: str, prompt_len: int, output_len: int, block_size: int) -> list[int]:
    """Ascending block-aligned positions where a state is written (split mode)."""
    B = block_size
    probe = HitProbe(prompt_len, B, 0, 0)
    prompt_end = (prompt_len - 1) // B * B
    decode = range(prompt_len // B * B + B, (prompt_len + output_len - 1) // B * B + 1, B)
    return sorted({*get_admission(name).stops(probe), prompt_end, *decode} - {0})


def expected_states(name: str, prompt_len: int, output_len: int, block_size: int) -> list[int]:
    """The state positions policy ``name`` has cached when the request finishes."""
    adm = RequestAdmission(get_admission(name), HitProbe(prompt_len, block_size, 0, 0),
                           total_len=prompt_len + output_len)
    return [p for p in written_positions(name, prompt_len, output_len, block_size)
            if adm.decide(p) == ADMIT]


def expected_superseded(name: str, prompt_len: int, output_len: int, block_size: int) -> int:
    """States a live engine cached tentatively and dropped again (all but the last)."""
    adm = RequestAdmission(get_admission(name), HitProbe(prompt_len, block_size, 0, 0),
                           total_len=None)
    tentative = [p for p in written_positions(name, prompt_len, output_len, block_size)
                 if adm.decide(p) == TENTATIVE]
    return max(len(tentative) - 1, 0)
