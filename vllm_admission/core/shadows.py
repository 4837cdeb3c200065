"""``auto``'s shadow caches in a child process, so that they never hold the scheduler's GIL.

The :class:`~vllm_admission.core.adaptive.PolicyController` serves every
finished request on one simulated cache per candidate pair (8 by default).
That is pure-Python work; on a thread of the engine core process it competes
with vLLM's scheduler loop for the interpreter lock (``benchmarks/
scheduler_overhead.py`` measured the thread at +19 % of ``schedule()`` +
``update_from_output()`` on top of the plugin's free queue). :class:`ShadowProcess`
runs the controller in a child interpreter instead, behind the same
``observe(index, request) -> Decision | None`` call (and :meth:`ShadowProcess.observe_many`
for a batch); the plugin's worker thread only pickles the requests (their block-hash
keys and two lengths) and waits on the pipe, which releases the lock.

The child is a plain ``subprocess`` (``python -m vllm_admission.core.shadows
[--nice N]``), not a ``multiprocessing`` process: vLLM runs its engine core as a daemonic
``multiprocessing`` process, and those may not have children of their own. It
imports :mod:`vllm_admission.core` only (no vLLM, no torch), reads pickled
messages on stdin and answers each on stdout, and exits when stdin closes (the
engine shut down or died). This module imports neither vLLM nor torch.

**Priority.** The child can lower its own scheduling priority first thing
(``nice``: added to the engine's niceness with ``os.nice``, so 19 is the lowest
priority Linux has). On a host whose cores the engine also needs (the API server,
the engine core's scheduler loop, the tokenizer), the kernel then runs the shadows
only on time the engine does not take: a switch is decided later, the engine's
steps are not delayed (``docs/benchmarks.md``, "Serving").

Protocol (one pickled tuple per message, parent to child; one answer each):

* ``("start", kwargs)``: build ``PolicyController(live=None, **kwargs)``;
  answer ``("ok", None)``;
* ``("observe", index, request)``: ``controller.observe(index, request)``;
  answer ``("ok", (decision_or_None, settled_at))``;
* ``("observe_many", [(index, request), ...])``: ``controller.observe`` on each, in
  order; answer ``("ok", ([decision_or_None, ...], settled_at))``, one decision per
  request. One round trip per batch: the parent's thread takes the interpreter lock
  twice per batch instead of twice per request (``benchmarks/scheduler_overhead.py``).

``settled_at`` is the controller's :attr:`~vllm_admission.core.adaptive.PolicyController.settled_at`
after the call (``None`` while its shadows run), kept as :attr:`ShadowProcess.settled_at`.

Any exception in the child is answered as ``("error", "Type: message")`` and
raised in the parent as :class:`ShadowProcessError`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import subprocess
import sys
from typing import Any, BinaryIO

__all__ = ["DEFAULT_NICE", "MAX_NICE", "ShadowProcess", "ShadowProcessError", "main"]

#: The largest niceness increment that means anything on Linux (the lowest priority).
MAX_NICE = 19
#: The child's niceness increment unless told otherwise: the lowest priority.
DEFAULT_NICE = MAX_NICE


class ShadowProcessError(RuntimeError):
    """The child process failed (its exception's type and message), or is gone."""


class ShadowProcess:
    """A :class:`~vllm_admission.core.adaptive.PolicyController` in a child process.

    Args:
        nice: added to the child's niceness, 0 to 19 (default :data:`DEFAULT_NICE`,
            19: the lowest priority; 0: the engine's own); see the module docstring.
        **controller_kwargs: ``PolicyController``'s arguments except ``live``
            (``setup``, ``admissions``, ``evictions``, ``prefill_flops``,
            ``start``, ``min_window``, ...); they must pickle (``ModelCosts``'
            bound ``prefill_flops`` does).

    Attributes:
        settled_at: the controller's ``settled_at`` as of the last answer: the request
            after which its shadows stopped, one being left (``None``: they run).

    Raises:
        ShadowProcessError: the child could not start or rejected the arguments.
        OSError: the interpreter could not be launched.
        ValueError: ``nice`` outside 0 to 19.

    Calls are not thread-safe: one thread (the plugin's worker) talks to it.
    """

    def __init__(self, *, nice: int = DEFAULT_NICE, **controller_kwargs: Any) -> None:
        if not (isinstance(nice, int) and 0 <= nice <= MAX_NICE):
            raise ValueError(f"nice must be an integer from 0 to {MAX_NICE}, got {nice!r}")
        self.settled_at: int | None = None
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_admission.core.shadows", "--nice", str(nice)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        try:
            self._call("start", controller_kwargs)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def observe(self, index: int, request: Any) -> Any:
        """``PolicyController.observe`` in the child: the switching ``Decision`` or ``None``."""
        decision, self.settled_at = self._call("observe", index, request)
        return decision

    def observe_many(self, items: list[tuple[int, Any]]) -> list[Any]:
        """:meth:`observe` on each ``(index, request)`` of ``items``, in order, in one
        round trip: a list of the same length, each entry a ``Decision`` or ``None``.

        Raises:
            ShadowProcessError: the child failed on one of them (the controller
                served the ones before it, and their decisions are not returned) or
                is gone.
        """
        decisions: list[Any]
        decisions, self.settled_at = self._call("observe_many", items)
        return decisions

    def close(self, timeout: float = 5.0) -> None:
        """Close the child's stdin (it exits) and reap it; kill it after ``timeout`` s."""
        proc = self._proc
        if proc.poll() is None:
            try:
                assert proc.stdin is not None  # a pipe (__init__)
                proc.stdin.close()
                proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None and not stream.closed:
                with contextlib.suppress(OSError):   # unflushed bytes to a child that is gone
                    stream.close()

    def _call(self, *message: Any) -> Any:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None  # pipes (__init__)
        try:
            pickle.dump(message, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            proc.stdin.flush()
            kind, value = pickle.load(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            raise ShadowProcessError(f"the shadow process (pid {proc.pid}) is gone: "
                                     f"{type(exc).__name__}: {exc}") from None
        if kind == "error":
            raise ShadowProcessError(value)
        return value


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The child's loop: answer messages from ``stdin`` on ``stdout`` until EOF."""
    from vllm_admission.core.adaptive import PolicyController

    controller = None
    while True:
        try:
            message = pickle.load(stdin)
        except EOFError:
            return
        try:
            if message[0] == "start":
                controller = PolicyController(None, **message[1])
                answer: tuple[str, Any] = ("ok", None)
            elif message[0] == "observe" and controller is not None:
                answer = ("ok", (controller.observe(message[1], message[2]), controller.settled_at))
            elif message[0] == "observe_many" and controller is not None:
                observe = controller.observe
                answer = ("ok", ([observe(i, r) for i, r in message[1]], controller.settled_at))
            else:
                answer = ("error", f"ValueError: unexpected message {message[0]!r}")
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
            answer = ("error", f"{type(exc).__name__}: {exc}")
        pickle.dump(answer, stdout, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.flush()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m vllm_admission.core.shadows [--nice N]`` (the child)."""
    parser = argparse.ArgumentParser(prog="python -m vllm_admission.core.shadows",
                                     description="auto's shadow caches, served over stdin/stdout")
    parser.add_argument("--nice", type=int, default=0, choices=range(MAX_NICE + 1),
                        metavar=f"0..{MAX_NICE}", help="added to this process's niceness")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    answers = sys.stdout.buffer
    sys.stdout = sys.stderr          # a stray print must not corrupt the answers
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
