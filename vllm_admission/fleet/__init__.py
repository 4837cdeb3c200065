"""A fleet of vLLM replicas: the adapters between their KV event streams and the core's
:class:`~vllm_admission.core.fleet_index.FleetIndex` (``subscriber.py``)."""
