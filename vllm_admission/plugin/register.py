"""vLLM general-plugin entry point (``vllm.general_plugins``: ``vllm_admission``).

vLLM calls :func:`register` in every process it starts (front end, engine
core, workers), before it validates the environment
(``vllm/engine/arg_utils.py``: ``EngineArgs.__post_init__`` loads the general
plugins; ``create_engine_config`` then runs
``Platform.validate_environ``, which warns about, or with
``--fail-on-environ-validation`` refuses, any ``VLLM_*`` variable missing from
``vllm.envs.environment_variables``). Registering the plugin's variables there
keeps that check quiet for them.

The registered getters return ``None`` on purpose: ``vllm.envs.compile_factors``
hashes the value of every registered variable into the ``torch.compile``
cache key, and scheduler settings must not force a recompile. The plugin
reads its settings through :class:`vllm_admission.plugin.config.AdmissionConfig`.

The scheduler itself is not installed here: it is chosen with
``scheduler_cls="vllm_admission.AdmissionScheduler"`` (``--scheduler-cls``).
"""

from __future__ import annotations

import logging
import multiprocessing

from vllm_admission.plugin.config import ENV_VARS, AdmissionConfig, AdmissionConfigError

__all__ = ["register"]

logger = logging.getLogger("vllm_admission")


def _unset() -> None:
    return None


def register() -> None:
    """Make vLLM's environment validation accept the plugin's variables.

    Idempotent. In the process that starts vLLM (not in its engine-core and
    worker processes, which call this too) a variable set to an invalid value
    is reported with one WARNING line before the model loads; the
    AdmissionScheduler refuses to start with it later, with the same message.
    """
    import vllm.envs as envs

    for name in ENV_VARS:
        envs.environment_variables.setdefault(name, _unset)
    if multiprocessing.current_process().name != "MainProcess":
        return
    try:
        AdmissionConfig.from_env()
    except AdmissionConfigError as exc:
        from vllm_admission.plugin.logs import ensure_log_output

        ensure_log_output()
        logger.warning("vllm_admission: %s (the AdmissionScheduler will refuse to start)", exc)
