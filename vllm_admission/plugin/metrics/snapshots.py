"""The engine-core half of the ``/metrics`` path: stats snapshots in a directory.

The scheduler (engine-core process) writes its
:class:`~vllm_admission.plugin.metrics.stats.AdmissionStats` as JSON to
``$VLLM_ADMISSION_METRICS_DIR/engine-<index>.json`` with :class:`StatsPublisher`;
the API server's collector (:mod:`vllm_admission.plugin.metrics.prometheus`) reads them
with :func:`read_snapshots`. The general plugin
(:mod:`vllm_admission.plugin.boundary.register`) names the directory
(:func:`default_metrics_dir`) and removes it, and those of dead processes
(:func:`remove_stale_snapshot_dirs`).

This module imports neither vLLM nor the scheduler, so the scheduler, the
general plugin and the stat logger can all import it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_admission.plugin.env import ENV_METRICS_DIR
from vllm_admission.plugin.metrics.stats import AdmissionStats

__all__ = ["ENV_METRICS_DIR", "PUBLISH_INTERVAL_S", "StatsPublisher", "default_metrics_dir",
           "read_snapshots", "remove_snapshot_dir", "remove_stale_snapshot_dirs"]

logger = logging.getLogger("vllm_admission")

#: Seconds between two snapshots while requests are running.
PUBLISH_INTERVAL_S = 1.0

#: Name of a snapshot directory the plugin makes for a process (``<tmp>/vllm_admission-<pid>``).
_DIR_NAME = re.compile(r"vllm_admission-(?P<pid>\d+)")
#: Files a :class:`StatsPublisher` writes: snapshots and their temporary files.
_SNAPSHOT_FILE = re.compile(r"engine-\d+\.json|\.engine-\d+\.json\.\d+\.tmp")


def default_metrics_dir(pid: int | None = None) -> str:
    """The snapshot directory for a process tree: ``<tmp>/vllm_admission-<pid>``
    (``pid``: this process by default)."""
    return os.path.join(tempfile.gettempdir(),
                        f"vllm_admission-{os.getpid() if pid is None else int(pid)}")


def remove_snapshot_dir(directory: str | os.PathLike) -> bool:
    """Delete a snapshot directory if it holds nothing but the publishers' files.

    Those files (``engine-<i>.json`` and their temporary files) are removed,
    then the directory. A directory holding anything else is left as it is.
    Errors (``OSError``) are swallowed: this runs at exit and at start-up.

    Returns:
        Whether the directory is gone (also when it never existed).
    """
    root = Path(directory)
    try:
        names = [entry.name for entry in os.scandir(root)]
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not all(_SNAPSHOT_FILE.fullmatch(name) for name in names):
        return False
    try:
        for name in names:
            (root / name).unlink(missing_ok=True)
        root.rmdir()
    except OSError:
        return False
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def remove_stale_snapshot_dirs(parent: str | os.PathLike | None = None) -> list[str]:
    """Delete the snapshot directories left in ``parent`` (default: the temporary
    directory) by processes that no longer run.

    A directory counts as left behind when its name is ``vllm_admission-<pid>``,
    it belongs to this user, ``<pid>`` is not this process and no process has
    that pid (``os.kill(pid, 0)``), and it holds only the publishers' files
    (:func:`remove_snapshot_dir`). A pid reused by another process keeps its
    directory (it is never deleted under a live process). One ``scandir`` of
    ``parent``; errors are swallowed.

    Returns:
        The directories removed.
    """
    parent = tempfile.gettempdir() if parent is None else os.fspath(parent)
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    uid = os.getuid() if hasattr(os, "getuid") else None
    for entry in entries:
        m = _DIR_NAME.fullmatch(entry.name)
        if m is None:
            continue
        pid = int(m["pid"])
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if pid == os.getpid() or _pid_alive(pid):
            continue
        if remove_snapshot_dir(entry.path):
            removed.append(entry.path)
    return removed


class StatsPublisher:
    """Writes one engine's stats snapshot for the API server (engine-core side).

    Args:
        directory: where to write (created on the first write).
        engine_index: vLLM's engine index (the data-parallel rank).
        interval_s: least seconds between two snapshots while requests run.
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(self, directory: str | os.PathLike, engine_index: int = 0, *,
                 interval_s: float = PUBLISH_INTERVAL_S, clock=time.monotonic) -> None:
        self.path = Path(directory) / f"engine-{int(engine_index)}.json"
        self.interval_s = float(interval_s)
        self._clock = clock
        self._last = float("-inf")

    @classmethod
    def from_env(cls, engine_index: int = 0) -> StatsPublisher | None:
        """A publisher into ``$VLLM_ADMISSION_METRICS_DIR``; ``None`` when it is unset."""
        directory = os.environ.get(ENV_METRICS_DIR)
        return cls(directory, engine_index) if directory else None

    def due(self, idle: bool) -> bool:
        """Whether to publish now: always when ``idle``, else once per interval."""
        return idle or self._clock() - self._last >= self.interval_s

    def publish(self, stats: AdmissionStats) -> None:
        """Replace the snapshot with ``stats`` (write to a temporary file, then rename).

        An ``OSError`` is logged once per occurrence at WARNING and otherwise
        ignored: metrics must never stop the scheduler.
        """
        self._last = self._clock()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(stats.to_dict()))
            os.replace(tmp, self.path)
        except OSError as exc:
            logger.warning("vllm_admission: cannot write metrics snapshot %s: %s", self.path, exc)

    def remove(self) -> None:
        """Delete the snapshot (and the directory once empty); called at shutdown."""
        try:
            self.path.unlink(missing_ok=True)
            self.path.parent.rmdir()
        except OSError:
            pass


def read_snapshots(directory: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """``engine index -> AdmissionStats dict`` for every snapshot in ``directory``.

    Missing directory: ``{}``. A file that is not valid JSON (should not
    happen: writes are atomic) is skipped.
    """
    out: dict[str, dict[str, Any]] = {}
    root = Path(directory)
    if not root.is_dir():
        return out
    for path in sorted(root.glob("engine-*.json")):
        try:
            out[path.stem.removeprefix("engine-")] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out
