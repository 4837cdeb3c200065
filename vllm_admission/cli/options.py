"""Command-line values shared by the subcommands."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["parse_list"]


def parse_list(text: str, what: str, valid: Sequence[str]) -> tuple[str, ...]:
    """Split a comma list and check every name; one clear error line otherwise."""
    from vllm_admission.core.admission import UnknownPolicyError

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UnknownPolicyError(f"no {what} given; valid: {', '.join(valid)}")
    for n in names:
        if n not in valid:
            raise UnknownPolicyError(f"unknown {what} {n!r}; valid: {', '.join(valid)}")
    return names
