"""vLLM general-plugin entry point (``vllm.general_plugins``: ``vllm_admission``).

vLLM calls :func:`register` in every process it starts (front end, engine
core, workers). It does nothing unless the user asked for the plugin
(:func:`asked`: the command line names the AdmissionScheduler, a
``VLLM_ADMISSION_*`` setting is set, or the process that started this one was
asked, ``VLLM_ADMISSION_ACTIVE``); ``VLLM_ADMISSION_CPU_FIXES=1`` alone asks for
vLLM's fixes below and nothing else. Where asked, it runs before vLLM
validates the environment
(``vllm/engine/arg_utils.py``: ``EngineArgs.__post_init__`` loads the general
plugins; ``create_engine_config`` then runs
``Platform.validate_environ``, which warns about, or with
``--fail-on-environ-validation`` refuses, any ``VLLM_*`` variable missing from
``vllm.envs.environment_variables``). Registering the plugin's variables there
keeps that check quiet for them.

The registered getters return ``None`` on purpose: ``vllm.envs.compile_factors``
hashes the value of every registered variable into the ``torch.compile``
cache key, and scheduler settings must not force a recompile. The plugin
reads its settings through :class:`vllm_admission.plugin.env.Settings`.

Where asked, in every process it also installs vLLM's fixes
(:func:`install_vllm_fixes`: :func:`vllm_admission.plugin.repairs.cpu_block_size.install`,
CPU only, the engine core's block size kept through the config re-check its handshake
runs; :func:`vllm_admission.plugin.repairs.cpu_mamba2.install`, on
vLLM's CPU platform only, Mamba2 layers declare no prefill-checkpoint export there,
which the CPU kernels cannot write; :func:`vllm_admission.plugin.repairs.cpu_spec_decode.install`,
CPU only, the speculative-decoding state kernels the CPU build lacks, so MTP runs
there; :func:`vllm_admission.plugin.repairs.block_copy.install`, any platform, block copies of
whole pages, so a hit inside a block reads the copied attention block intact).

Where asked, in the process that starts vLLM (``MainProcess``), :func:`register` also

* sets ``VLLM_ADMISSION_ACTIVE=1``, so that the engine-core and worker processes
  (which inherit the environment, not the command line) know;

* sets ``VLLM_ADMISSION_METRICS_DIR`` (unless set) to a per-process temporary
  path, inherited by the engine-core processes, where the scheduler publishes
  its counters for the API server's ``/metrics``. That write into
  ``os.environ`` is how the directory crosses into the engine-core process
  vLLM spawns (the only variable the plugin sets for a child; the policy
  settings are the user's own variables, or, for an in-process engine built by
  :func:`vllm_admission.engine.llm.build_llm`, a ``Settings`` object)
  (:mod:`vllm_admission.plugin.metrics.prometheus`). That process owns the directory: it
  removes it when it exits (``atexit``: ``vllm serve`` stopped with Ctrl-C or
  SIGTERM exits normally, but force-kills its engine core first, with
  ``--shutdown-timeout 0`` by default, so the scheduler's own clean-up in
  ``shutdown()`` does not run), and at start it removes the directories left
  by processes that are gone (killed with SIGKILL, say); a directory the user
  named in ``VLLM_ADMISSION_METRICS_DIR`` is never removed;
* checks the ``VLLM_ADMISSION_*`` settings: when the command line names the
  AdmissionScheduler (``vllm serve ... --scheduler-cls
  vllm_admission.AdmissionScheduler``), an invalid value ends the process at
  once with one ``vllm_admission: error: ...`` line on stderr and exit status
  2, before the model loads; otherwise (``LLM(...)``) it logs that line as a
  warning and the scheduler refuses to start later;
* checks the settings against the engine's ``VllmConfig`` as soon as vLLM has
  built it, before the model loads
  (:func:`check_before_load`): a setting the configuration cannot run (a
  non-stock admission policy with MTP speculative decoding, say) ends
  ``vllm serve`` with one ``vllm_admission: error: ...`` line and status 2, and
  makes ``LLM(...)`` raise ``SettingsError`` with that line.

The scheduler itself is not installed here: it is chosen with
``scheduler_cls="vllm_admission.AdmissionScheduler"`` (``--scheduler-cls``).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm_admission.core.settings import Settings, SettingsError, setting_from_env
from vllm_admission.plugin.env import ENV_ACTIVE, ENV_CPU_FIXES, ENV_VARS
from vllm_admission.plugin.metrics.snapshots import (
    ENV_METRICS_DIR,
    default_metrics_dir,
    remove_snapshot_dir,
    remove_stale_snapshot_dirs,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["asked", "check_before_load", "install_vllm_fixes", "register"]

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


#: The snapshot directory this process named and removes at exit (once per process).
_OWNED: dict[int, str] = {}


def _own_metrics_dir() -> str:
    """This process's snapshot directory; the first call also removes stale ones
    and arranges the removal of this one at exit."""
    pid = os.getpid()
    if pid not in _OWNED:
        directory = _OWNED[pid] = default_metrics_dir()
        remove_stale_snapshot_dirs(os.path.dirname(directory))
        atexit.register(_remove_at_exit, pid, directory)
    return _OWNED[pid]


def _remove_at_exit(pid: int, directory: str) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the handler
        remove_snapshot_dir(directory)


def check_before_load(vllm_config: VllmConfig) -> None:
    """:func:`~vllm_admission.plugin.boundary.engine_setup.preflight` for an engine whose
    ``scheduler_cls`` is the AdmissionScheduler (by name, or a
    :meth:`~vllm_admission.plugin.scheduler.AdmissionScheduler.configured` class),
    on a supported vLLM release; nothing otherwise.

    Raises:
        SettingsError: a setting this configuration cannot run (one line),
            or ``SystemExit(2)`` with that line on stderr when the command line
            names the AdmissionScheduler (``vllm serve``).
    """
    from vllm_admission.plugin.boundary import surface

    named = vllm_config.scheduler_config.scheduler_cls
    if isinstance(named, str):
        if not named.startswith("vllm_admission"):
            return
        config = None
    else:
        from vllm_admission.plugin.scheduler import AdmissionScheduler

        if not (isinstance(named, type) and issubclass(named, AdmissionScheduler)):
            return
        config = named.admission_settings
    if not surface.check_version():
        return  # the scheduler builds vLLM's own class, or refuses, itself
    from vllm_admission.plugin.boundary.engine_setup import preflight

    try:
        preflight(vllm_config, config or Settings.from_env())
    except SettingsError as exc:
        _exit_if_serving(exc)
        raise


def _exit_if_serving(exc: SettingsError) -> None:
    """Where the command line names the AdmissionScheduler (``vllm serve``), end the
    process with ``exc`` as one ``vllm_admission: error:`` line on stderr and status 2
    (``SystemExit``); elsewhere return, for the caller to raise or warn."""
    if names_admission_scheduler(sys.argv):
        sys.stderr.write(f"vllm_admission: error: {exc}\n")
        raise SystemExit(2) from None


def install_vllm_fixes() -> None:
    """What vLLM 0.32 needs to run the plugin's settings correctly: the kernels its CPU
    platform lacks (each a no-op elsewhere: the block size kept through the engine core's
    config re-check, :mod:`~vllm_admission.plugin.repairs.cpu_block_size`; the Mamba2 prefill export off, since the
    engine core builds the KV cache specs; the speculative-decoding state copies, which
    the model runner uses under drafts) and, on any platform, block copies of whole pages
    (:mod:`~vllm_admission.plugin.repairs.block_copy`: a hit inside a block copies a page that an
    attention and a Mamba layer share). :func:`register` installs them where asked,
    :func:`vllm_admission.engine.llm.build_llm` before every engine it starts."""
    from vllm_admission.plugin.repairs import (
        block_copy,
        cpu_block_size,
        cpu_mamba2,
        cpu_spec_decode,
    )
    cpu_block_size.install()
    cpu_mamba2.install()
    install_gpu_export_off()
    cpu_spec_decode.install()
    block_copy.install()


def install_gpu_export_off() -> bool:
    """On a CUDA platform, make Mamba2 layers declare no prefill-checkpoint export of their
    own when the engine runs ``inpass`` (:func:`~vllm_admission.plugin.inpass.inpass_requested`), as the CPU platform's
    layers always do (:mod:`~vllm_admission.plugin.repairs.cpu_mamba2`): in-pass writes every
    checkpoint of the step through the same export fields
    (:func:`~vllm_admission.plugin.runner.inpass_runner.mamba2_step_metadata`), the prompt
    end included, and vLLM's own export would write into the same columns. Process-wide,
    once (:func:`vllm_admission.plugin.boundary.hooks.wrap_mamba2_spec`).

    Returns:
        True when the wrap is in place on a CUDA platform, False elsewhere.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False
    from vllm_admission.plugin import inpass
    from vllm_admission.plugin.boundary.hooks import wrap_mamba2_spec
    from vllm_admission.plugin.repairs.cpu_mamba2 import spec_without_export

    wrap_mamba2_spec(lambda spec, vllm_config: spec_without_export(spec)
                     if inpass.inpass_requested(vllm_config) else spec)
    return True


def install_inpass_runner_if_asked() -> bool:
    """Install the in-pass runner hooks in this process when ``VLLM_ADMISSION_CHECKPOINT``
    asks for ``inpass`` and the platform is vLLM's CPU or CUDA one.

    The model runner lives in a worker process of its own under a multi-process executor
    (what ``vllm serve`` runs here): the scheduler installs the hooks in its process, and
    this, run by the general plugin in every process vLLM starts, installs them where the
    runner is. The step's checkpoint list reaches it on the ``SchedulerOutput`` that vLLM
    itself sends each step (an instance attribute, pickled with it). An invalid value is
    left to the scheduler, which refuses it in one line.

    Returns:
        True when the hooks are in place in this process.
    """
    from vllm.platforms import current_platform

    try:
        inpass = setting_from_env("checkpoint") == "inpass"
    except SettingsError:
        inpass = False   # the scheduler refuses the value, in one line
    if not inpass or not (
            current_platform.is_cpu() or current_platform.is_cuda()):
        return False
    from vllm_admission.plugin.boundary.hooks import install_inpass_runner

    install_inpass_runner()
    return True


def asked() -> bool:
    """Whether the user asked for the plugin in this process tree: the command line names
    the AdmissionScheduler (``vllm serve ... --scheduler-cls``), one of the plugin's
    settings is set (:data:`~vllm_admission.plugin.env.ENV_VARS`), or the process that
    started this one decided so (:data:`~vllm_admission.plugin.env.ENV_ACTIVE`)."""
    if names_admission_scheduler(sys.argv) or os.environ.get(ENV_ACTIVE) == "1":
        return True
    return any(os.environ.get(name) for name in ENV_VARS
               if name not in (ENV_METRICS_DIR, ENV_ACTIVE, ENV_CPU_FIXES))


def register() -> None:
    """vLLM's general-plugin hook: nothing unless the user asked for the plugin.

    Installing the package changes no vLLM behaviour by itself: where :func:`asked` is
    false this returns at once, touching nothing of vLLM. ``VLLM_ADMISSION_CPU_FIXES=1``
    alone asks for vLLM's fixes only (:func:`install_vllm_fixes`).
    Where asked, in every process: the plugin's variables are registered with vLLM's
    environment validation and vLLM's fixes installed; in the process that starts vLLM
    it also marks the process tree as asked (``VLLM_ADMISSION_ACTIVE=1``, which the engine
    core and worker processes inherit), sets the metrics snapshot directory, installs the
    check before the model loads and checks the settings (module docstring). Idempotent.

    Raises:
        SystemExit: (status 2) an invalid setting while the command line
            names the AdmissionScheduler.
    """
    from vllm_admission.plugin.boundary.hooks import register_env_vars

    plugin = asked()
    if not plugin and os.environ.get(ENV_CPU_FIXES) != "1":
        return
    register_env_vars(ENV_VARS, _unset)
    install_vllm_fixes()  # every process (engine core, workers)
    if not plugin:
        return
    if multiprocessing.current_process().name != "MainProcess":
        # engine-core and worker processes (an engine core in the main process installs
        # the hooks itself, when its scheduler is built; the API server runs no model)
        install_inpass_runner_if_asked()
        return
    os.environ[ENV_ACTIVE] = "1"
    if not os.environ.get(ENV_METRICS_DIR):
        os.environ[ENV_METRICS_DIR] = _own_metrics_dir()
    from vllm_admission.plugin.boundary.hooks import install_preflight

    install_preflight(check_before_load)
    try:
        Settings.from_env()
    except SettingsError as exc:
        _exit_if_serving(exc)
        from vllm_admission.plugin.metrics.logs import ensure_log_output

        ensure_log_output()
        logger.warning("vllm_admission: %s (the AdmissionScheduler will refuse to start)", exc)
