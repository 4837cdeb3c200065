"""Work off the scheduler loop: the alpha tuner and ``auto``'s shadow caches.

The scheduler thread hands each finished request, reduced to a
:class:`~vllm_admission.core.cache_inputs.CacheRequest`, to a daemon thread and
picks the thread's decision up before its next allocations:

* :class:`TunerThread`: an :class:`~vllm_admission.core.tuning.AlphaTuner`
  (a tuned ``flop`` alpha); the scheduler applies :meth:`TunerThread.take_alpha`;
* :class:`ControllerThread`: ``auto``'s
  :class:`~vllm_admission.core.adaptive.PolicyController`, by default in a
  child process (:func:`policy_controller`,
  :class:`~vllm_admission.core.shadows.ShadowProcess`) so that its shadow
  caches never hold the scheduler's GIL; the scheduler applies
  :meth:`ControllerThread.take_switch`;
* :class:`BackgroundTuning`: the one of them an engine runs, fed each finished
  vLLM request (:meth:`BackgroundTuning.on_finished`).

The threads run only the core (no vLLM objects cross the queue). An exception stops
the work with one warning and never reaches the engine.

**Batches.** The scheduler thread hands the requests over :data:`BATCH` at a time, or
sooner when the first one waiting finished :data:`MAX_BATCH_DELAY` seconds earlier (as
seen at the next finish): a thread woken for every finished request takes the GIL from
the scheduler loop each time (``benchmarks/scheduler_overhead.py`` measured ``auto``'s
thread at about 3 % of the loop's CPU that way, ``docs/benchmarks.md``); ``auto``'s thread
sends a batch to the shadow process in one round trip
(:meth:`~vllm_admission.core.shadows.ShadowProcess.observe_many`). A decision is
therefore made up to ``BATCH - 1`` requests later than the request that completes its
window.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_admission.core.adaptive import Decision, PolicyController
from vllm_admission.core.admission import HitProbe
from vllm_admission.core.cache_inputs import CacheRequest
from vllm_admission.core.shadows import DEFAULT_NICE, ShadowProcess, ShadowProcessError
from vllm_admission.core.tuning import AlphaTuner
from vllm_admission.plugin import translate

if TYPE_CHECKING:
    from vllm.v1.request import Request

__all__ = ["BATCH", "MAX_BATCH_DELAY", "MAX_BOOTSTRAP_HISTORY", "BackgroundTuning", "ControllerThread", "TunerThread",
           "Worker", "policy_controller"]

logger = logging.getLogger("vllm_admission")

#: Requests the alpha tuner may remember before any eviction; past it the
#: tuner restarts (bounds memory on a server whose cache never fills).
MAX_BOOTSTRAP_HISTORY = 20_000

#: Finished requests the scheduler thread hands to a worker thread at once.
BATCH = 16
#: Seconds the first request of an unfinished batch may wait (checked at the next finish).
MAX_BATCH_DELAY = 0.5


class Worker:
    """A daemon thread that digests finished requests off the scheduler thread.

    The scheduler hands items to :meth:`submit` (cheap); the thread calls
    :meth:`observe` on each, in order, ``batch`` items at a time (see the module
    docstring; :meth:`drain` and :meth:`stop` hand over the rest). An exception stops
    the work (logged once, kept in :attr:`error`) and never reaches the engine.

    Args:
        batch: items handed to the thread at once (1: each at once; default
            :data:`BATCH`, read when the worker is built).
        max_delay: seconds after which :meth:`submit` hands over a batch not yet full.
    """

    #: What the thread does, for its name and its one warning line.
    what = "work"

    def __init__(self, batch: int | None = None, max_delay: float = MAX_BATCH_DELAY) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: Any = None
        self.error: str | None = None
        self._batch_size = BATCH if batch is None else batch
        self._max_delay = max_delay
        self._batch: list[tuple[Any, ...]] = []
        self._batch_since = 0.0       # time.monotonic() of the batch's first item

    def _offer(self, decision: Any) -> None:
        """Leave a decision for the scheduler thread (a newer one replaces it)."""
        with self._lock:
            self._pending = decision

    def _take(self) -> Any:
        """The decision left since the last call, or ``None``."""
        if self._pending is None:
            return None
        with self._lock:
            decision, self._pending = self._pending, None
        return decision

    def submit(self, *item: Any) -> None:
        """Queue one item for :meth:`observe`; the items kept back go to the thread once
        ``batch`` of them wait, or the first of them has waited ``max_delay`` seconds."""
        batch = self._batch
        now = time.monotonic()
        if not batch:
            self._batch_since = now
        batch.append(item)
        if len(batch) >= self._batch_size or now - self._batch_since >= self._max_delay:
            self._flush()

    def _flush(self) -> None:
        """Hand the items kept back to the thread (started on first use)."""
        if not self._batch:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"vllm_admission-{self.what}",
                                            daemon=True)
            self._thread.start()
        self._queue.put(self._batch)
        self._batch = []

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every submitted item is processed; False on timeout."""
        self._flush()
        if self._thread is None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> None:
        """Ask the thread to finish after the queued items (then :meth:`_close`)."""
        self._flush()
        if self._thread is not None:
            self._queue.put(None)
        else:
            self._close()

    def _close(self) -> None:
        """Release what the work holds; called once the last item is done."""

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    self._close()
                    return
                if self.error is None:
                    self.observe_batch(batch)
            except Exception as exc:  # noqa: BLE001 - never take the engine down
                if self.error is None:
                    self.error = f"{type(exc).__name__}: {exc}"
                    logger.warning("vllm_admission: %s stopped: %s", self.what, self.error)
            finally:
                self._queue.task_done()

    def observe(self, *item: Any) -> None:
        """Digest one item on the calling thread (the thread's work; called directly, an
        exception reaches the caller)."""
        raise NotImplementedError

    def observe_batch(self, batch: list[tuple[Any, ...]]) -> None:
        """Digest a batch handed over at once, in order (the thread calls this)."""
        for item in batch:
            self.observe(*item)


class TunerThread(Worker):
    """Runs :class:`~vllm_admission.core.tuning.AlphaTuner` off the scheduler thread.

    Items are ``(request, evicted_so_far, saved)``; the tuner (built by
    :func:`vllm_admission.core.run.alpha_tuner`) gets each request numbered from
    its first, and its window replays run the core cache model. A decision is picked up by the scheduler with
    :meth:`take_alpha`.

    Args:
        make_tuner: builds a fresh ``AlphaTuner``.
        max_history: restart the tuner after this many requests without an
            eviction (its bootstrap window would otherwise grow without end).
    """

    what = "alpha tuning"

    def __init__(self, make_tuner: Callable[[], AlphaTuner],
                 max_history: int = MAX_BOOTSTRAP_HISTORY) -> None:
        super().__init__()
        self._make = make_tuner
        self.tuner = make_tuner()
        self.max_history = max_history
        self.events: list[dict[str, Any]] = []
        self._seen_without_eviction = 0
        self._index = 0

    def take_alpha(self) -> float | None:
        """The alpha decided since the last call, or ``None``."""
        return self._take()

    def observe(self, request: CacheRequest, evicted: bool, saved: float) -> None:
        tuner = self.tuner
        if tuner.window_len is None and not evicted:
            self._seen_without_eviction += 1
            if self._seen_without_eviction > self.max_history:
                self.tuner = tuner = self._make()
                self._seen_without_eviction = 1
                self._index = 0
        n_events = len(tuner.events)
        # Numbered from the tuner's first request: its window replays start there.
        new = tuner.observe((self._index, request), evicted, saved)
        self._index += 1
        for e in tuner.events[n_events:]:
            self.events.append({"at": e.at, "window": e.window, "alpha": e.alpha, "kind": e.kind})
            logger.info("vllm_admission: alpha tuning (%s over %d requests): alpha=%g",
                        e.kind, e.window, e.alpha)
        if new is not None:
            self._offer(new)


class ControllerThread(Worker):
    """Feeds a :class:`~vllm_admission.core.adaptive.PolicyController` (``auto``)
    off the scheduler thread.

    Items are ``(index, request)``: every finished request goes through the
    controller's shadow caches. The switch it decides (a
    :class:`~vllm_admission.core.adaptive.Decision`: the new pair, and the
    prompt block hashes the new pair's shadow holds) is picked up by the
    scheduler with :meth:`take_switch`.

    Args:
        controller: the controller itself, or a
            :class:`~vllm_admission.core.shadows.ShadowProcess` that runs it
            in a child process (the default of
            :class:`~vllm_admission.plugin.control.AdmissionControl`:
            the shadows then never hold the scheduler's GIL); both answer
            ``observe(index, request)``.
    """

    what = "policy selection"

    def __init__(self, controller: PolicyController | ShadowProcess) -> None:
        super().__init__()
        self.controller = controller
        self.switches: list[dict[str, Any]] = []

    @property
    def in_process(self) -> bool:
        """Whether the shadows run in this process (not in a child)."""
        return not isinstance(self.controller, ShadowProcess)

    def _close(self) -> None:
        if isinstance(self.controller, ShadowProcess):
            self.controller.close()

    @property
    def settled(self) -> bool:
        """Whether the controller's shadows stopped, the live pair's being the only one
        left (:attr:`~vllm_admission.core.adaptive.PolicyController.settled_at`): it
        needs no more finished requests."""
        return self.controller.settled_at is not None

    def take_switch(self) -> Decision | None:
        """The latest switch decided since the last call, or ``None``."""
        return self._take()

    def observe(self, index: int, request: CacheRequest) -> None:
        if self.settled:
            return
        self._record(self.controller.observe(index, request))
        if self.settled:
            self._on_settled()

    def observe_batch(self, batch: list[tuple[Any, ...]]) -> None:
        """The batch in one round trip to the child process (in process: one by one)."""
        controller = self.controller
        if self.settled:
            return
        if isinstance(controller, ShadowProcess):
            for decision in controller.observe_many(batch):
                self._record(decision)
            if self.settled:
                self._on_settled()
        else:
            super().observe_batch(batch)

    def _on_settled(self) -> None:
        """The call just made settled the controller (every call returns early once it
        has): say so, and end the child process (its shadows are gone; the requests
        queued after this one are dropped unread)."""
        logger.info("vllm_admission: auto: settled after request %d: one shadow left, the "
                    "pair served; the shadows stopped", self.controller.settled_at)
        self._close()

    def _record(self, decision: Decision | None) -> None:
        if decision is not None:
            self.switches.append(decision.as_dict())
            logger.info("vllm_admission: auto: %s -> %s after request %d",
                        decision.before, decision.after, decision.at)
            self._offer(decision)


def policy_controller(kwargs: dict[str, Any], *, in_child: bool,
                      nice: int = DEFAULT_NICE) -> PolicyController | ShadowProcess:
    """``auto``'s controller: in a child process when ``in_child``, its niceness raised
    by ``nice`` (falling back to this process, with one warning, if the child cannot
    start), else here."""
    if in_child:
        try:
            return ShadowProcess(nice=nice, **kwargs)
        except (OSError, ShadowProcessError, pickle.PicklingError, TypeError) as exc:
            logger.warning("vllm_admission: auto's shadow process did not start (%s: %s); "
                           "its shadow caches run on a thread of the scheduler's process",
                           type(exc).__name__, exc)
    return PolicyController(None, **kwargs)


class BackgroundTuning:
    """The alpha tuner or ``auto``'s controller of one engine, fed its finished requests.

    At most one of the two runs (a tuned alpha or ``auto``, decided by the core's
    :class:`~vllm_admission.core.run.RunPlan`); with neither, every call does nothing.

    Args:
        make_tuner: builds a fresh :class:`~vllm_admission.core.tuning.AlphaTuner`
            (it is called again when the tuner restarts), or ``None``: no tuner.
        controller: ``auto``'s controller (:func:`policy_controller`), or ``None``.
        block_size: tokens per block.
        hashes_per_block: vLLM block hashes per block (``PoolSpec.hashes_per_block``).
        sub_block: a hash block size below the block size (the finished requests' unit keys
            are kept: :func:`~vllm_admission.plugin.translate.cache_request`).
        prefill_flops: ``f(num_tokens, num_cached) -> FLOPs``; required by the tuner
            (the FLOPs a request's hit saved).
        in_thread: digest on the daemon thread (default) or on the caller's.
    """

    def __init__(self, *, make_tuner: Callable[[], AlphaTuner] | None,
                 controller: PolicyController | ShadowProcess | None, block_size: int,
                 hashes_per_block: int, sub_block: bool,
                 prefill_flops: Callable[[int, int], float] | None,
                 in_thread: bool = True) -> None:
        self.controller = ControllerThread(controller) if controller is not None else None
        self._make_tuner = make_tuner
        self.tuner = TunerThread(make_tuner) if make_tuner is not None else None
        self.B = block_size
        self._hashes_per_block = hashes_per_block
        self._sub_block = sub_block
        self.prefill_flops = prefill_flops
        self.in_thread = in_thread
        self._finished = 0

    def restart_tuner(self) -> None:
        """Stop the tuner after its queued requests and start a fresh one (its replays
        use the admission policy's name, which just changed)."""
        if self.tuner is not None:
            self.tuner.stop()
            assert self._make_tuner is not None  # the tuner was built by it (__init__)
            self.tuner = TunerThread(self._make_tuner)

    def on_finished(self, request: Request, probe: HitProbe | None, evicted_so_far: bool) -> None:
        """``request`` left the scheduler (``probe``: its lookup, ``None`` if it was never
        tracked; ``evicted_so_far``: whether the pool has evicted yet): feed it to the
        tuner or the controller."""
        worker = self.tuner if self.tuner is not None else self.controller
        if worker is None or probe is None or worker.error is not None:
            return
        if self.controller is not None and self.controller.settled:
            return      # auto's shadows stopped: nothing more to hand over
        output_len = request.num_output_tokens
        P = probe.prompt_len
        if output_len < 1 or P < 1:
            return
        item = translate.cache_request(request, P, self.B, self._hashes_per_block, self._sub_block)
        if self.controller is not None:
            index, self._finished = self._finished, self._finished + 1
            if self.in_thread:
                self.controller.submit(index, item)
            else:
                self.controller.observe(index, item)
            return
        # A request resumed after a preemption looks up its outputs too; the
        # tuner's replay knows the prompt only.
        tuner, prefill_flops = self.tuner, self.prefill_flops
        assert tuner is not None  # the worker, as there is no controller
        assert prefill_flops is not None  # required by the tuner (AdmissionControl)
        hit = min(probe.state_hit, P)
        saved = prefill_flops(P, 0) - prefill_flops(P, hit)
        if self.in_thread:
            tuner.submit(item, evicted_so_far, saved)
        else:
            tuner.observe(item, evicted_so_far, saved)

    def take_alpha(self) -> float | None:
        """The alpha the tuner decided since the last call, or ``None``."""
        return self.tuner.take_alpha() if self.tuner is not None else None

    def take_switch(self) -> Decision | None:
        """The latest switch ``auto`` decided since the last call, or ``None``."""
        return self.controller.take_switch() if self.controller is not None else None

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the tuner or controller has digested every finished request
        (sequential replays, tests); False on timeout."""
        worker = self.tuner if self.tuner is not None else self.controller
        return worker.drain(timeout) if worker is not None else True

    def stop(self) -> None:
        """Stop the tuner or controller thread after its queued requests."""
        for worker in (self.tuner, self.controller):
            if worker is not None:
                worker.stop()
