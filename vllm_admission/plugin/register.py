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

In the process that starts vLLM (``MainProcess``), :func:`register` also

* sets ``VLLM_ADMISSION_METRICS_DIR`` (unless set) to a per-process temporary
  path, inherited by the engine-core processes, where the scheduler publishes
  its counters for the API server's ``/metrics``
  (:mod:`vllm_admission.plugin.metrics`);
* checks the ``VLLM_ADMISSION_*`` settings: when the command line names the
  AdmissionScheduler (``vllm serve ... --scheduler-cls
  vllm_admission.AdmissionScheduler``), an invalid value ends the process at
  once with one ``vllm_admission: error: ...`` line on stderr and exit status
  2, before the model loads; otherwise (``LLM(...)``) it logs that line as a
  warning and the scheduler refuses to start later.

The scheduler itself is not installed here: it is chosen with
``scheduler_cls="vllm_admission.AdmissionScheduler"`` (``--scheduler-cls``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Sequence

from vllm_admission.plugin.config import ENV_VARS, AdmissionConfig, AdmissionConfigError
from vllm_admission.plugin.metrics import ENV_METRICS_DIR, default_metrics_dir

__all__ = ["register"]

logger = logging.getLogger("vllm_admission")


def _unset() -> None:
    return None


def names_admission_scheduler(argv: Sequence[str]) -> bool:
    """Whether a command line passes ``--scheduler-cls`` naming this plugin's scheduler."""
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag.replace("_", "-") != "--scheduler-cls":
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if value.startswith("vllm_admission"):
            return True
    return False


def register() -> None:
    """Make vLLM's environment validation accept the plugin's variables.

    Idempotent. In the process that starts vLLM (not in its engine-core and
    worker processes, which call this too) it also sets the metrics snapshot
    directory and checks the settings (module docstring).

    Raises:
        SystemExit: (status 2) an invalid setting while the command line
            names the AdmissionScheduler.
    """
    from vllm_admission.plugin.vllm_hooks import register_env_vars

    register_env_vars(ENV_VARS, _unset)
    if multiprocessing.current_process().name != "MainProcess":
        return
    os.environ.setdefault(ENV_METRICS_DIR, default_metrics_dir())
    try:
        AdmissionConfig.from_env()
    except AdmissionConfigError as exc:
        if names_admission_scheduler(sys.argv):
            sys.stderr.write(f"vllm_admission: error: {exc}\n")
            raise SystemExit(2) from None
        from vllm_admission.plugin.logs import ensure_log_output

        ensure_log_output()
        logger.warning("vllm_admission: %s (the AdmissionScheduler will refuse to start)", exc)
