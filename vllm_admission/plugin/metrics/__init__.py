"""The plugin's metrics: one counter schema, three ways out.

* :mod:`~vllm_admission.plugin.metrics.stats`: :class:`AdmissionStats`, what
  ``AdmissionScheduler.stats()`` returns; its counters are the core's
  :class:`~vllm_admission.core.counters.CacheCounters` (the simulator's and the engine
  replay's names) plus the plugin's own (no vLLM import);
* :mod:`~vllm_admission.plugin.metrics.logs`: the ``vllm_admission`` logger and the
  periodic log line;
* :mod:`~vllm_admission.plugin.metrics.snapshots` (engine core) and
  :mod:`~vllm_admission.plugin.metrics.prometheus` (API server, the
  ``vllm.stat_logger_plugins`` entry point): the counters on ``/metrics``.

Importing this package imports nothing; :mod:`.prometheus` imports vLLM.
"""
