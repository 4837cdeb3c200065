"""The plugin's counters on the server's Prometheus ``/metrics``.

``vllm serve`` runs the scheduler in the engine-core process and serves
``/metrics`` from the API-server process, and vLLM 0.32 has no channel for a
scheduler's own numbers between the two (``SchedulerStats`` is a fixed
dataclass, serialised field by field). So the two halves meet in a file:

* engine core: :class:`~vllm_admission.plugin.metrics.snapshots.StatsPublisher` writes the scheduler's
  :class:`~vllm_admission.plugin.metrics.stats.AdmissionStats` as JSON to
  ``$VLLM_ADMISSION_METRICS_DIR/engine-<index>.json`` (atomic replace), at
  most once per :data:`PUBLISH_INTERVAL_S` while requests run and always when
  the last running request finishes, so an idle server shows final values;
* API server: :class:`AdmissionStatLogger`, a vLLM stat-logger plugin
  (entry point group ``vllm.stat_logger_plugins``, loaded by
  ``vllm/v1/metrics/loggers.py`` ``load_stat_logger_plugin_factories`` for
  every ``AsyncLLM``), registers one :class:`AdmissionCollector` on vLLM's
  Prometheus registry (``vllm/v1/metrics/prometheus.py``
  ``get_prometheus_registry``); each scrape reads the files.

The general plugin (:mod:`vllm_admission.plugin.boundary.register`) sets
``VLLM_ADMISSION_METRICS_DIR`` in the process that starts vLLM, before the
engine core is spawned (it inherits the environment). Metric names follow
vLLM's (``vllm:`` prefix, ``model_name`` and ``engine`` labels; counters are
exposed with ``_total``). Three counters keep names older than the shared counter
schema; the table gives the ``AdmissionStats`` field each one reads:

==========================================  =======  =====================================
metric                                      type     meaning (``AdmissionStats`` field)
==========================================  =======  =====================================
``vllm:hybrid_prefix_cache_policy_info``    info     labels ``admission``, ``eviction`` (the live
                                                     pair), ``active``, ``auto``
``vllm:hybrid_prefix_cache_requests``       counter  requests admitted after a prefix lookup
                                                     (first admissions, as vLLM's counters)
``vllm:hybrid_prefix_cache_prompt_tokens``  counter  their prompt tokens
``vllm:hybrid_prefix_cache_junctions``      counter  requests whose KV hit ran past the state hit
``vllm:hybrid_prefix_cache_checkpoints``    counter  ``state_checkpoints``: recurrent states admitted
``vllm:hybrid_prefix_cache_superseded``     counter  tentative sequence-end states replaced
``vllm:hybrid_prefix_cache_state_hits``     counter  ``hit_requests``: requests with a hybrid hit > 0
``vllm:hybrid_prefix_cache_tokens_saved``   counter  ``hit_tokens``: prompt tokens served from the cache
``vllm:hybrid_prefix_cache_host_tokens_saved`` counter ``host_hit_tokens``: the part a KV connector
                                                     loaded (a host tier's)
``vllm:hybrid_prefix_cache_state_miss_tokens`` counter attention-KV hit tokens recomputed
                                                     for want of a state at their end
``vllm:hybrid_prefix_cache_prefill_steps``  counter  prefill chunks (steps with a request's prompt tokens)
``vllm:hybrid_prefix_cache_policy_switches`` counter switches made by ``auto``
``vllm:hybrid_prefix_cache_evictions``      counter  cached blocks evicted, labels ``kind``, ``group``
``vllm:hybrid_prefix_cache_alpha``          gauge    ``flop``'s alpha (absent with ``lru``)
``vllm:hybrid_prefix_cache_free_blocks``    gauge    free blocks (uncached plus evictable)
``vllm:hybrid_prefix_cache_usable_blocks``  gauge    blocks in the pool minus the null block
==========================================  =======  =====================================
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_admission.plugin.metrics.snapshots import (
    ENV_METRICS_DIR,
    PUBLISH_INTERVAL_S,
    StatsPublisher,
    default_metrics_dir,
    read_snapshots,
    remove_snapshot_dir,
    remove_stale_snapshot_dirs,
)

__all__ = [
    "COUNTERS",
    "ENV_METRICS_DIR",
    "METRIC_PREFIX",
    "PUBLISH_INTERVAL_S",
    "AdmissionCollector",
    "AdmissionStatLogger",
    "StatsPublisher",
    "default_metrics_dir",
    "read_snapshots",
    "remove_snapshot_dir",
    "remove_stale_snapshot_dirs",
]

logger = logging.getLogger("vllm_admission")

METRIC_PREFIX = "vllm:hybrid_prefix_cache_"
#: Counters on ``/metrics``: metric name (after :data:`METRIC_PREFIX`) ->
#: ``(AdmissionStats field, help text)``. The published names came before the shared
#: counter schema (:class:`~vllm_admission.core.counters.CacheCounters`) and stay, so
#: dashboards keep working; three differ from their field.
COUNTERS: dict[str, tuple[str, str]] = {
    "requests": ("requests", "Requests admitted into the running batch after a prefix lookup "
                 "(first admissions only: a request admitted again after a preemption is left "
                 "out, as in vllm:prefix_cache_queries)."),
    "prompt_tokens": ("prompt_tokens", "Prompt tokens of the admitted requests (first admissions "
                      "only)."),
    "junctions": ("junctions", "Admitted requests whose attention-KV hit ran past their hybrid hit "
                  "(a shared prefix without a saved recurrent state)."),
    "checkpoints": ("state_checkpoints", "Recurrent-state checkpoints admitted into the prefix "
                    "cache (given a block hash)."),
    "superseded": ("superseded", "Tentative sequence-end states replaced by a later state of the "
                   "same request."),
    "state_hits": ("hit_requests", "Admitted requests with a hybrid prefix hit > 0."),
    "tokens_saved": ("hit_tokens", "Prompt tokens served from the hybrid prefix cache."),
    "host_tokens_saved": ("host_hit_tokens", "The part of tokens_saved a KV connector loaded "
                          "beyond the local hit (a host tier's, with vLLM's OffloadingConnector)."),
    "state_miss_tokens": ("state_miss_tokens", "Prompt tokens whose attention KV was cached past "
                          "the hybrid hit but recomputed because no recurrent state was kept at "
                          "their end (attention-KV hit minus hybrid hit, whole blocks)."),
    "prefill_steps": ("prefill_steps", "Prefill chunks: engine steps that scheduled a request's "
                      "prompt tokens, summed over requests (split mode ends a chunk at every "
                      "kept state; inpass does not)."),
    "policy_switches": ("policy_switches", "Switches of the admission/eviction pair made by auto "
                        "(the length of AdmissionStats.policy_switches)."),
}
_GAUGES: dict[str, str] = {
    "alpha": "Alpha of the FLOP-aware eviction (recency weight).",
    "free_blocks": "Free KV cache blocks (uncached plus evictable).",
    "usable_blocks": "KV cache blocks in the pool minus the null block.",
}
_GROUP_KEY = re.compile(r"^(?P<kind>.*?)(?P<index>\d+)$")


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
        counters = {field: CounterMetricFamily(f"{METRIC_PREFIX}{name}", text, labels=base)
                    for name, (field, text) in COUNTERS.items()}
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
            for field, family in counters.items():
                value = stats.get(field, 0)
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
