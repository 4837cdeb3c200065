"""The plugin's worker threads hand finished requests over in batches (plugin/background.py)."""

from __future__ import annotations

import threading
import time

from vllm_admission.plugin.background import Worker


class Recorder(Worker):
    """Records each item with the thread that observed it; ``fail_on`` raises there."""

    what = "recording"

    def __init__(self, *, fail_on: object = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[object, str]] = []
        self.fail_on = fail_on

    def observe(self, item: object) -> None:
        if item == self.fail_on:
            raise ValueError(f"bad item {item!r}")
        self.seen.append((item, threading.current_thread().name))


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_batch_is_handed_over_when_full_and_observed_in_order_on_the_thread():
    w = Recorder(batch=4, max_delay=3600.0)
    for i in range(3):
        w.submit(i)
    time.sleep(0.05)
    assert w.seen == []                       # kept back: the batch is not full
    w.submit(3)
    assert wait_for(lambda: len(w.seen) == 4)
    assert [item for item, _ in w.seen] == [0, 1, 2, 3]
    assert {name for _, name in w.seen} == {"vllm_admission-recording"}
    w.submit(4)
    assert w.drain(timeout=10)                # drain hands over the part batch
    assert [item for item, _ in w.seen] == [0, 1, 2, 3, 4]
    w.stop()


def test_a_batch_waiting_longer_than_the_delay_goes_at_the_next_submit():
    w = Recorder(batch=1000, max_delay=0.05)
    w.submit("a")
    time.sleep(0.1)
    assert w.seen == []                       # nothing checks the clock between finishes
    w.submit("b")                             # the first item waited past the delay
    assert wait_for(lambda: len(w.seen) == 2)
    assert [item for item, _ in w.seen] == ["a", "b"]
    w.stop()


def test_stop_hands_over_what_is_kept_back():
    w = Recorder(batch=100, max_delay=3600.0)
    w.submit(1)
    w.submit(2)
    w.stop()
    assert wait_for(lambda: len(w.seen) == 2)
    assert [item for item, _ in w.seen] == [1, 2]


def test_an_exception_stops_the_work_without_reaching_the_caller(caplog):
    w = Recorder(batch=3, max_delay=3600.0, fail_on=1)
    for i in range(6):
        w.submit(i)
    assert w.drain(timeout=10)
    assert [item for item, _ in w.seen] == [0]          # nothing after the failure
    assert w.error == "ValueError: bad item 1"
    assert sum("recording stopped" in r.getMessage() for r in caplog.records) == 1
    w.stop()
