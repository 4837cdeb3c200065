"""The one base class for errors in what the user gave.

:class:`UserError` marks a mistake in the input: a command-line value, a
``VLLM_ADMISSION_*`` setting, a trace file, a model's ``config.json``, a
capacity, a policy name, or an argument of the public API such as
``simulate(...)``'s keywords. The command line prints such an error as one
``vllm-admission: error: ...`` line (exit status 2); anything else, a broken
internal invariant above all, keeps its traceback.

It is a :class:`ValueError`, so ``except ValueError`` keeps catching it. A state
the code should never reach stays a plain ``ValueError`` (or ``RuntimeError``):
that is a bug, and its traceback is what finds it.

Pure Python, importing nothing of the package, so every layer may use it.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(ValueError):
    """A problem in the input the user gave; the message is one line that says what to fix."""
