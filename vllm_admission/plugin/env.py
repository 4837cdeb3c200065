"""The plugin's settings: :class:`~vllm_admission.core.settings.Settings`, read from the
environment, and the variables the plugin sets for its own processes.

This module does not import vLLM. Every settings variable is optional; an empty value
counts as unset; a bad value raises
:class:`~vllm_admission.core.settings.SettingsError`, one line naming the variable, the
value and the valid values. The variables, their defaults and what each sets are declared
once, on the fields of :class:`~vllm_admission.core.settings.Settings` (the guide's
settings page lists them from there).
"""

from __future__ import annotations

from vllm_admission.core.settings import Settings, SettingsError, env_vars

__all__ = ["ENV_ACTIVE", "ENV_CPU_FIXES", "ENV_METRICS_DIR", "ENV_VARS", "Settings", "SettingsError"]

#: Not a user setting: where the engine core publishes the plugin's metrics
#: (vllm_admission.plugin.metrics.snapshots).
ENV_METRICS_DIR = "VLLM_ADMISSION_METRICS_DIR"
#: Not a user setting: set by the general plugin in the process that starts vLLM when the
#: user asked for the plugin, so that the engine-core and worker processes know
#: (vllm_admission.plugin.boundary.register).
ENV_ACTIVE = "VLLM_ADMISSION_ACTIVE"
#: ``1``: install only the CPU platform's kernels the plugin supplies (the Mamba2 prefill
#: export off, the speculative-decoding state copies), without the scheduler.
ENV_CPU_FIXES = "VLLM_ADMISSION_CPU_FIXES"

#: Every variable the plugin reads: name -> one-line description (for the docs and for
#: registering the names with vLLM's environment validation): the settings' own, then the
#: plugin's internal ones.
ENV_VARS: dict[str, str] = {
    **env_vars(),
    ENV_METRICS_DIR: ("directory where the scheduler publishes its counters for the server's "
                      "/metrics (set by the plugin in the process that starts vLLM)"),
    ENV_ACTIVE: "1 = the user asked for the plugin (set by the plugin for its child processes)",
    ENV_CPU_FIXES: ("1 = install vLLM's fixes (on the CPU platform the engine core's block "
                    "size kept and the Mamba2 and speculative-decoding kernels; whole-page "
                    "block copies) without the scheduler"),
}
