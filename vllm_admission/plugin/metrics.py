"""The plugin's counters on the server's Prometheus ``/metrics``.

``vllm serve`` runs the scheduler in the engine-core process and serves
``/metrics`` from the API-server process, and vLLM 0.32 has no channel for a
scheduler's own numbers between the two (``SchedulerStats`` is a fixed
dataclass, serialised field by field). So the two halves meet in a file:

* engine core: :class:`StatsPublisher` writes the scheduler's
  :class:`~vllm_admission.plugin.stats.AdmissionStats` as JSON to
  ``$VLLM_ADMISSION_METRICS_DIR/engine-<index>.json`` (atomic replace), at
  most once per :data:`PUBLISH_INTERVAL_S` while requests run and always when
  the last running request finishes, so an idle server shows final values;
* API server: :class:`AdmissionStatLogger`, a vLLM stat-logger plugin
  (entry point group ``vllm.stat_logger_plugins``, loaded by
  ``vllm/v1/metrics/loggers.py`` ``load_stat_logger_plugin_factories`` for
  every ``AsyncLLM``), registers one :class:`AdmissionCollector` on vLLM's
  Prometheus registry (``vllm/v1/metrics/prometheus.py``
  ``get_prometheus_registry``); each scrape reads the files.

The general plugin (:mod:`vllm_admission.plugin.register`) sets
``VLLM_ADMISSION_METRICS_DIR`` in the process that starts vLLM, before the
engine core is spawned (it inherits the environment). Metric names follow
vLLM's (``vllm:`` prefix, ``model_name`` and ``engine`` labels; counters are
exposed with ``_total``) and the field names of ``AdmissionStats``, so the log
line, ``stats()``, ``results.json`` and ``/metrics`` use one name per count:

==========================================  =======  =====================================
metric                                      type     meaning (``AdmissionStats`` field)
==========================================  =======  =====================================
``vllm:hybrid_prefix_cache_policy_info``    info     labels ``admission``, ``eviction`` (the live
                                                     pair), ``active``, ``auto``
``vllm:hybrid_prefix_cache_requests``       counter  requests admitted after a prefix lookup
                                                     (first admissions, as vLLM's counters)
``vllm:hybrid_prefix_cache_prompt_tokens``  counter  their prompt tokens
``vllm:hybrid_prefix_cache_junctions``      counter  requests whose KV hit ran past the state hit
``vllm:hybrid_prefix_cache_checkpoints``    counter  recurrent states admitted (given a block hash)
``vllm:hybrid_prefix_cache_superseded``     counter  tentative sequence-end states replaced
``vllm:hybrid_prefix_cache_state_hits``     counter  requests with a hybrid hit > 0
``vllm:hybrid_prefix_cache_tokens_saved``   counter  prompt tokens served from the cache
``vllm:hybrid_prefix_cache_state_miss_tokens`` counter attention-KV hit tokens recomputed
                                                     for want of a state at their end
``vllm:hybrid_prefix_cache_policy_switches`` counter switches made by ``auto``
``vllm:hybrid_prefix_cache_evictions``      counter  cached blocks evicted, labels ``kind``, ``group``
``vllm:hybrid_prefix_cache_alpha``          gauge    ``flop``'s alpha (absent with ``lru``)
``vllm:hybrid_prefix_cache_free_blocks``    gauge    free blocks (uncached plus evictable)
``vllm:hybrid_prefix_cache_usable_blocks``  gauge    blocks in the pool minus the null block
==========================================  =======  =====================================
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_admission.plugin.config import ENV_METRICS_DIR
from vllm_admission.plugin.stats import AdmissionStats

__all__ = [
    "COUNTERS",
    "ENV_METRICS_DIR",
    "METRIC_PREFIX",
    "AdmissionCollector",
    "AdmissionStatLogger",
    "StatsPublisher",
    "default_metrics_dir",
    "remove_snapshot_dir",
    "remove_stale_snapshot_dirs",
]

logger = logging.getLogger("vllm_admission")

METRIC_PREFIX = "vllm:hybrid_prefix_cache_"
#: Seconds between two snapshots while requests are running.
PUBLISH_INTERVAL_S = 1.0

#: ``AdmissionStats`` fields exported as counters, with their help text.
COUNTERS: dict[str, str] = {
    "requests": "Requests admitted into the running batch after a prefix lookup (first "
                "admissions only: a request admitted again after a preemption is left out, "
                "as in vllm:prefix_cache_queries).",
    "prompt_tokens": "Prompt tokens of the admitted requests (first admissions only).",
    "junctions": "Admitted requests whose attention-KV hit ran past their hybrid hit "
                 "(a shared prefix without a saved recurrent state).",
    "checkpoints": "Recurrent-state checkpoints admitted into the prefix cache (given a block hash).",
    "superseded": "Tentative sequence-end states replaced by a later state of the same request.",
    "state_hits": "Admitted requests with a hybrid prefix hit > 0.",
    "tokens_saved": "Prompt tokens served from the hybrid prefix cache.",
    "state_miss_tokens": "Prompt tokens whose attention KV was cached past the hybrid hit but "
                         "recomputed because no recurrent state was kept at their end "
                         "(attention-KV hit minus hybrid hit, whole blocks).",
    "policy_switches": "Switches of the admission/eviction pair made by auto (the length of "
                       "AdmissionStats.policy_switches).",
}
_GAUGES: dict[str, str] = {
    "alpha": "Alpha of the FLOP-aware eviction (recency weight).",
    "free_blocks": "Free KV cache blocks (uncached plus evictable).",
    "usable_blocks": "KV cache blocks in the pool minus the null block.",
}
_GROUP_KEY = re.compile(r"^(?P<kind>.*?)(?P<index>\d+)$")


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
    removed = []
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


class AdmissionCollector:
    """A ``prometheus_client`` collector that reads the snapshots at scrape time.

    Args:
        directory: the snapshot directory (``$VLLM_ADMISSION_METRICS_DIR``).
        model_name: value of the ``model_name`` label (vLLM's served model name).
    """

    def __init__(self, directory: str | os.PathLike, model_name: str) -> None:
        self.directory = Path(directory)
        self.model_name = str(model_name)

    def describe(self) -> list:
        # No metrics known before the first scrape; an empty description keeps
        # registration from calling collect() (and reading files) early.
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        snapshots = read_snapshots(self.directory)
        if not snapshots:
            return
        base = ["model_name", "engine"]
        info = InfoMetricFamily(f"{METRIC_PREFIX}policy",
                                "Admission and eviction policies of the AdmissionScheduler.",
                                labels=base)
        counters = {name: CounterMetricFamily(f"{METRIC_PREFIX}{name}", text, labels=base)
                    for name, text in COUNTERS.items()}
        evictions = CounterMetricFamily(f"{METRIC_PREFIX}evictions",
                                        "Cached KV blocks evicted, by KV cache group.",
                                        labels=[*base, "kind", "group"])
        gauges = {name: GaugeMetricFamily(f"{METRIC_PREFIX}{name}", text, labels=base)
                  for name, text in _GAUGES.items()}
        for engine, stats in snapshots.items():
            labels = [self.model_name, engine]
            info.add_metric(labels, {"admission": str(stats.get("admission")),
                                     "eviction": str(stats.get("eviction")),
                                     "active": str(bool(stats.get("active"))).lower(),
                                     "auto": str(bool(stats.get("adaptive"))).lower()})
            for name, family in counters.items():
                value = stats.get(name, 0)
                family.add_metric(labels, float(len(value) if isinstance(value, list) else value))
            for key, count in stats.get("evictions_by_group", {}).items():
                m = _GROUP_KEY.match(key)
                kind, group = (m["kind"], m["index"]) if m else (key, "")
                evictions.add_metric([*labels, kind, group], float(count))
            for name, family in gauges.items():
                if stats.get(name) is not None:
                    family.add_metric(labels, float(stats[name]))
        yield info
        yield from counters.values()
        yield evictions
        yield from gauges.values()


def _is_admission_scheduler(scheduler_cls: Any) -> bool:
    if scheduler_cls is None:
        return False
    from vllm_admission.plugin.scheduler import AdmissionScheduler

    if isinstance(scheduler_cls, str):
        from vllm.utils.import_utils import resolve_obj_by_qualname

        try:
            scheduler_cls = resolve_obj_by_qualname(scheduler_cls)
        except (ImportError, AttributeError, ValueError):
            return False
    return isinstance(scheduler_cls, type) and issubclass(scheduler_cls, AdmissionScheduler)


_REGISTERED: set[str] = set()


class AdmissionStatLogger(StatLoggerBase):
    """vLLM stat-logger plugin: puts the AdmissionScheduler's counters on ``/metrics``.

    Registered under ``vllm.stat_logger_plugins`` (``pyproject.toml``); vLLM
    builds one per engine in the API-server process. The first one registers an
    :class:`AdmissionCollector` on vLLM's Prometheus registry, and only when the
    engine's ``scheduler_cls`` is (a subclass of) ``AdmissionScheduler`` and
    ``VLLM_ADMISSION_METRICS_DIR`` is set.
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        directory = os.environ.get(ENV_METRICS_DIR)
        if not directory or directory in _REGISTERED:
            return
        if not _is_admission_scheduler(vllm_config.scheduler_config.scheduler_cls):
            return
        from vllm.v1.metrics.prometheus import get_prometheus_registry

        get_prometheus_registry().register(
            AdmissionCollector(directory, vllm_config.model_config.served_model_name))
        _REGISTERED.add(directory)

    def record(self, scheduler_stats: Any, iteration_stats: Any,
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        """Nothing to do per step: the collector reads the snapshots at scrape time."""

    def log_engine_initialized(self) -> None:
        """Nothing to log."""
