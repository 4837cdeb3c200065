"""One replica's KV event stream into a :class:`~vllm_admission.core.fleet_index.FleetIndex`.

vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``) sends each batch as a
multipart message ``(topic, sequence number, msgpack payload)`` on a PUB socket and, with a
``replay_endpoint``, keeps the latest ``buffer_steps`` batches behind a ROUTER socket that
resends them from a given number on, then an end marker (sequence number -1). A
:class:`EventSubscriber` reads the PUB stream, decodes each batch with vLLM's own
``KVEventBatch`` type, hands it to the index, and, when the index reports a gap (a batch
lost: a slow subscriber past the high-water mark, a dropped message), asks the replay
socket for the missing batches. Needs ``pyzmq`` and ``msgspec`` (vLLM's dependencies).
"""

from __future__ import annotations

from typing import Any

from vllm_admission.core.fleet_index import FleetIndex

__all__ = ["EventSubscriber"]

#: The replay socket's end-of-replay marker: sequence number -1 (``ZmqEventPublisher.END_SEQ``).
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventSubscriber:
    """Subscribe ``index`` to one replica's events.

    Args:
        index: the fleet's index.
        replica: the replica's name in the index.
        endpoint: the publisher's PUB endpoint (``KVEventsConfig.endpoint`` as a client
            connects to it, e.g. ``tcp://host:5557``).
        replay_endpoint: its replay (ROUTER) endpoint, or ``None`` (gaps are then
            reported by :attr:`gaps_unrecovered` and left).
        topic: the publisher's topic (``KVEventsConfig.topic``).
        timeout_ms: how long :meth:`receive` and a replay wait for a message.
    """

    def __init__(self, index: FleetIndex, replica: str, endpoint: str, *,
                 replay_endpoint: str | None = None, topic: str = "",
                 timeout_ms: int = 20_000) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self.index, self.replica = index, replica
        self._ctx: Any = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self._sub.connect(endpoint)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._replay_endpoint = replay_endpoint
        self._timeout_ms = timeout_ms
        self._decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
        #: Batches received on the live stream, replayed batches, and gaps no replay filled.
        self.batches = self.replayed = self.gaps_unrecovered = 0

    def _apply(self, seq_bytes: bytes, payload: bytes) -> int | None:
        seq = int.from_bytes(seq_bytes, "big")
        return self.index.apply(self.replica, seq, self._decode(payload).events)

    def receive(self, batches: int, drop: set[int] | None = None) -> None:
        """Take the next ``batches`` batches off the live stream and apply them, filling
        any gap from the replay socket. ``drop``: sequence numbers to discard as if lost
        (to exercise the recovery)."""
        for _ in range(batches):
            _topic, seq_bytes, payload = self._sub.recv_multipart()
            self.batches += 1
            if drop and int.from_bytes(seq_bytes, "big") in drop:
                continue
            missing = self._apply(seq_bytes, payload)
            if missing is not None:
                self._replay(missing)

    def _replay(self, start: int) -> None:
        import zmq

        if self._replay_endpoint is None:
            self.gaps_unrecovered += 1
            return
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVTIMEO, self._timeout_ms)
        sock.connect(self._replay_endpoint)
        try:
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                _empty, _topic, seq_bytes, payload = sock.recv_multipart()
                if seq_bytes == END_SEQ:
                    break
                self.replayed += 1
                self._apply(seq_bytes, payload)
        finally:
            sock.close(linger=0)
        if self.index.replicas[self.replica].pending:
            self.gaps_unrecovered += 1      # the replay buffer no longer held the batch

    def close(self) -> None:
        self._sub.close(linger=0)

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
