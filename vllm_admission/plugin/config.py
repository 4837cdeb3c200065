"""The plugin's settings, read from environment variables.

This module does not import vLLM. Every variable is optional:

=============================  ===========  ==============================================
variable                       default      valid values
=============================  ===========  ==============================================
``VLLM_ADMISSION_POLICY``      ``vllm``     an admission policy name (``none``, ``last``,
                                            ``vllm``, ``marconi``, ``dense``,
                                            ``written``), or ``auto``
``VLLM_ADMISSION_EVICTION``    ``lru``      an engine eviction policy (``lru``, ``flop``,
                                            ``lfu``, ``reuse``, ``conversation``,
                                            ``s3fifo``, ``mix``: every registered one
                                            that needs no future), or ``auto``
``VLLM_ADMISSION_ALPHA``       unset        a finite float >= 0: fixes ``flop``'s alpha
                                            (unset: tuned online)
``VLLM_ADMISSION_LOG_INTERVAL`` ``10``      seconds between metric log lines, a finite
                                            float >= 0 (0 switches the lines off)
``VLLM_ADMISSION_TUNE_MULTIPLIER`` ``5``    integer >= 1: the alpha tuner's bootstrap
                                            window, in multiples of the requests served
                                            before the first eviction
``VLLM_ADMISSION_TUNE_GRID``   ``coarse``   a grid name of ``vllm_admission.core.tuning.GRIDS``
                                            (``coarse``, ``paper``): the alphas the tuner
                                            tries at bootstrap
``VLLM_ADMISSION_AUTO_INTERVAL`` ``50``     integer >= 1: with ``auto``, finished requests
                                            between two policy decisions
``VLLM_ADMISSION_SHADOW_RATE`` ``auto``    with ``auto``: the fraction of finished requests
                                            its shadow caches serve (``auto``: chosen from
                                            the traffic; a number in (0, 1]; 1: full
                                            shadows)
``VLLM_ADMISSION_AUTO_MARGIN`` ``0``       with ``auto``: a finite number >= 0; stock's
                                            pair is left only for one whose shadow saved
                                            more than (1 + margin) times stock's, and no
                                            pair whose shadow saved less than stock's is
                                            served (0: off)
``VLLM_ADMISSION_AUTO_ADMISSIONS`` unset    with ``VLLM_ADMISSION_POLICY=auto``: the
                                            admission policies it chooses among,
                                            comma-separated (unset: every registered
                                            ``auto`` candidate)
``VLLM_ADMISSION_SHADOW_NICE`` ``19``      with ``auto``: added to the niceness of its
                                            shadow process, an integer from 0 to 19
                                            (19: the lowest priority; 0: the engine's)
``VLLM_ADMISSION_CHECKPOINT``  ``split``    ``split`` (a chunk ends at every kept state, as
                                            vLLM) or ``inpass`` (states written inside the
                                            forward pass; Gated DeltaNet and Mamba2, on
                                            vLLM's CPU build and on CUDA)
``VLLM_ADMISSION_HOST_ADMISSION`` unset     an admission policy name: with vLLM's
                                            ``OffloadingConnector`` (a host tier), the
                                            states it keeps that the GPU policy does not
                                            go to host memory only (per-tier admission)
=============================  ===========  ==============================================

An empty value counts as unset. A bad value raises :class:`AdmissionConfigError`
whose message is one line naming the variable, the value and the valid values.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from vllm_admission.core.adaptive import (
    AUTO,
    DEFAULT_INTERVAL,
    parse_auto_admissions,
    parse_shadow_rate,
    stock_pair,
)
from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission
from vllm_admission.core.cache import CHECKPOINT_MODES
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import engine_eviction_policies, eviction_class
from vllm_admission.core.shadows import DEFAULT_NICE, MAX_NICE
from vllm_admission.core.tuning import GRIDS

__all__ = [
    "ENV_ACTIVE",
    "ENV_ALPHA",
    "ENV_AUTO_INTERVAL",
    "ENV_SHADOW_NICE",
    "ENV_SHADOW_RATE",
    "ENV_CHECKPOINT",
    "ENV_CPU_FIXES",
    "ENV_EVICTION",
    "ENV_HOST_ADMISSION",
    "ENV_LOG_INTERVAL",
    "ENV_POLICY",
    "ENV_TUNE_GRID",
    "ENV_TUNE_MULTIPLIER",
    "ENV_VARS",
    "AdmissionConfig",
    "AdmissionConfigError",
]

ENV_POLICY = "VLLM_ADMISSION_POLICY"
ENV_EVICTION = "VLLM_ADMISSION_EVICTION"
ENV_ALPHA = "VLLM_ADMISSION_ALPHA"
ENV_LOG_INTERVAL = "VLLM_ADMISSION_LOG_INTERVAL"
ENV_TUNE_MULTIPLIER = "VLLM_ADMISSION_TUNE_MULTIPLIER"
ENV_TUNE_GRID = "VLLM_ADMISSION_TUNE_GRID"
ENV_AUTO_INTERVAL = "VLLM_ADMISSION_AUTO_INTERVAL"
ENV_SHADOW_RATE = "VLLM_ADMISSION_SHADOW_RATE"
ENV_SHADOW_NICE = "VLLM_ADMISSION_SHADOW_NICE"
ENV_AUTO_MARGIN = "VLLM_ADMISSION_AUTO_MARGIN"
ENV_AUTO_ADMISSIONS = "VLLM_ADMISSION_AUTO_ADMISSIONS"
ENV_CHECKPOINT = "VLLM_ADMISSION_CHECKPOINT"
ENV_HOST_ADMISSION = "VLLM_ADMISSION_HOST_ADMISSION"
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

#: Stock vLLM's pair (``vllm`` + ``lru``): the plugin changes nothing by default.
DEFAULT_POLICY, DEFAULT_EVICTION = stock_pair().admission, stock_pair().eviction
DEFAULT_LOG_INTERVAL = 10.0
DEFAULT_TUNE_MULTIPLIER = 5
DEFAULT_TUNE_GRID = "coarse"
DEFAULT_CHECKPOINT = "split"

#: Every variable the plugin reads: name -> one-line description (for the
#: docs and for registering the names with vLLM's environment validation).
ENV_VARS: dict[str, str] = {
    ENV_POLICY: (f"admission policy, one of {', '.join(ADMISSION_POLICIES)}, or {AUTO} "
                 f"(default {DEFAULT_POLICY})"),
    ENV_EVICTION: (f"eviction policy, one of {', '.join(engine_eviction_policies())}, or {AUTO} "
                   f"(default {DEFAULT_EVICTION})"),
    ENV_ALPHA: "fixed alpha (float >= 0) for flop eviction; unset = tuned online",
    ENV_LOG_INTERVAL: f"seconds between metric log lines, 0 = off (default {DEFAULT_LOG_INTERVAL:g})",
    ENV_TUNE_MULTIPLIER: (f"alpha tuner bootstrap multiplier, integer >= 1 "
                          f"(default {DEFAULT_TUNE_MULTIPLIER})"),
    ENV_TUNE_GRID: f"alpha tuner bootstrap grid, one of {', '.join(GRIDS)} (default {DEFAULT_TUNE_GRID})",
    ENV_AUTO_INTERVAL: (f"auto: finished requests between two policy decisions, integer >= 1 "
                        f"(default {DEFAULT_INTERVAL})"),
    ENV_SHADOW_RATE: ("auto: the fraction of finished requests its shadow caches serve, 'auto' "
                      "(chosen from the traffic; default) or a number in (0, 1] (1: full shadows)"),
    ENV_AUTO_MARGIN: ("auto: the relative lead over stock's pair a pair's shadow needs before "
                      "it is served, a finite number >= 0 (default 0: off; 0.3 = a 30% lead)"),
    ENV_AUTO_ADMISSIONS: ("auto admission: the admission policies it chooses among, "
                          "comma-separated (default: every registered auto candidate)"),
    ENV_SHADOW_NICE: (f"auto: added to the niceness of its shadow process, an integer from 0 "
                      f"to {MAX_NICE} (default {DEFAULT_NICE}: the lowest priority)"),
    ENV_CHECKPOINT: (f"where recurrent states are written, one of {', '.join(CHECKPOINT_MODES)} "
                     f"(default {DEFAULT_CHECKPOINT})"),
    ENV_HOST_ADMISSION: (f"per-tier admission with a host tier (vLLM's OffloadingConnector): the "
                         f"states this policy keeps go to host memory only where the GPU "
                         f"policy does not keep them, one of {', '.join(ADMISSION_POLICIES)} "
                         f"(default unset: none)"),
    ENV_METRICS_DIR: ("directory where the scheduler publishes its counters for the server's "
                      "/metrics (set by the plugin in the process that starts vLLM)"),
    ENV_ACTIVE: "1 = the user asked for the plugin (set by the plugin for its child processes)",
    ENV_CPU_FIXES: ("1 = install vLLM's fixes (on the CPU platform the engine core's block "
                    "size kept and the Mamba2 and speculative-decoding kernels; whole-page "
                    "block copies) without the scheduler"),
}


class AdmissionConfigError(UserError):
    """A plugin environment variable has a value the plugin cannot use.

    The message is a single line: ``"<VAR>=<value> is invalid; valid: ..."``.
    """


@dataclass(frozen=True)
class AdmissionConfig:
    """Validated plugin settings.

    Attributes:
        policy: admission policy name (a key of ``ADMISSION_POLICIES``).
        eviction: eviction policy name (a key of ``EVICTION_POLICIES`` that the
            engine offers, or ``auto``).
        alpha: fixed ``flop`` weight, or ``None`` to tune it online.
        log_interval: seconds between metric log lines; 0 disables them.
        tune_multiplier: bootstrap window multiplier of the alpha tuner.
        tune_grid: name of the tuner's bootstrap grid (a key of ``GRIDS``).
        auto_interval: with ``auto``, finished requests between two decisions.
        shadow_rate: with ``auto``, the shadows' sample rate (``None``: chosen
            from the traffic; 1: full shadows).
        auto_margin: with ``auto``, the relative lead over stock's pair a pair's
            shadow needs for ``auto`` to leave stock's pair for it (0: off;
            :attr:`~vllm_admission.core.adaptive.PolicyController.stock_margin`).
        auto_admissions: with ``auto`` admission, the admission policies it chooses
            among (``None``: every registered candidate;
            :func:`~vllm_admission.core.adaptive.parse_auto_admissions`).
        shadow_nice: with ``auto``, added to the shadow process's niceness (0 to 19;
            :mod:`~vllm_admission.core.shadows`).
        checkpoint: ``split`` (a prefill chunk ends at every state kept) or
            ``inpass`` (states at block boundaries inside a chunk are written
            during its forward pass).
        host_admission: per-tier admission: an admission policy name whose states go
            to a host tier only where ``policy`` does not keep them (``None``: none).
    """

    policy: str = DEFAULT_POLICY
    eviction: str = DEFAULT_EVICTION
    alpha: float | None = None
    log_interval: float = DEFAULT_LOG_INTERVAL
    tune_multiplier: int = DEFAULT_TUNE_MULTIPLIER
    tune_grid: str = DEFAULT_TUNE_GRID
    auto_interval: int = DEFAULT_INTERVAL
    shadow_rate: float | None = None
    auto_margin: float = 0.0
    auto_admissions: tuple[str, ...] | None = None
    shadow_nice: int = DEFAULT_NICE
    checkpoint: str = DEFAULT_CHECKPOINT
    host_admission: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AdmissionConfig:
        """Read and validate the settings from ``environ`` (default ``os.environ``).

        Raises:
            AdmissionConfigError: the first invalid variable, in one line.
        """
        from vllm_admission.core.policies import load_policy_plugins

        load_policy_plugins()   # other packages' policies are valid names too
        env = os.environ if environ is None else environ

        def raw(name: str) -> str | None:
            value = env.get(name)
            if value is None:
                return None
            value = value.strip()
            return value or None

        policy = raw(ENV_POLICY) or DEFAULT_POLICY
        if policy not in ADMISSION_POLICIES and policy != AUTO:
            raise _invalid(ENV_POLICY, policy, ", ".join([*ADMISSION_POLICIES, AUTO]))
        eviction = raw(ENV_EVICTION) or DEFAULT_EVICTION
        if eviction not in engine_eviction_policies() and eviction != AUTO:
            raise _invalid(ENV_EVICTION, eviction, ", ".join([*engine_eviction_policies(), AUTO]))

        alpha = _non_negative_float(ENV_ALPHA, raw(ENV_ALPHA), None,
                                    "a finite number >= 0, or unset to tune alpha online")
        log_interval = _non_negative_float(ENV_LOG_INTERVAL, raw(ENV_LOG_INTERVAL), DEFAULT_LOG_INTERVAL,
                                           "seconds, a finite number >= 0 (0 = no log lines)")
        multiplier = _positive_int(ENV_TUNE_MULTIPLIER, raw(ENV_TUNE_MULTIPLIER),
                                   DEFAULT_TUNE_MULTIPLIER)
        grid = raw(ENV_TUNE_GRID) or DEFAULT_TUNE_GRID
        if grid not in GRIDS:
            raise _invalid(ENV_TUNE_GRID, grid, ", ".join(GRIDS))
        interval = _positive_int(ENV_AUTO_INTERVAL, raw(ENV_AUTO_INTERVAL), DEFAULT_INTERVAL)
        text = raw(ENV_SHADOW_RATE)
        try:
            shadow_rate = parse_shadow_rate(text)
        except UserError:
            assert text is not None  # unset is auto, never refused
            raise _invalid(ENV_SHADOW_RATE, text, "auto, or a number in (0, 1] (1 = full shadows)") from None
        auto_margin = _non_negative_float(ENV_AUTO_MARGIN, raw(ENV_AUTO_MARGIN), 0.0,
                                          "a finite number >= 0 (0 = off; 0.3 = a 30% lead)")
        text = raw(ENV_AUTO_ADMISSIONS)
        try:
            auto_admissions = parse_auto_admissions(text)
        except UserError:   # UnknownPolicyError is one
            raise _invalid(ENV_AUTO_ADMISSIONS, text or "",
                           f"admission policy names, comma-separated, each once, from "
                           f"{', '.join(ADMISSION_POLICIES)}") from None
        if auto_admissions is not None and policy != AUTO:
            raise AdmissionConfigError(
                f"{ENV_AUTO_ADMISSIONS}={text} names the policies {ENV_POLICY}={AUTO} chooses "
                f"among, but {ENV_POLICY}={policy} (valid here: unset, or {ENV_POLICY}={AUTO})")
        shadow_nice = _int_in(ENV_SHADOW_NICE, raw(ENV_SHADOW_NICE), DEFAULT_NICE, 0, MAX_NICE)
        checkpoint = raw(ENV_CHECKPOINT) or DEFAULT_CHECKPOINT
        if checkpoint not in CHECKPOINT_MODES:
            raise _invalid(ENV_CHECKPOINT, checkpoint, ", ".join(CHECKPOINT_MODES))
        host_admission = raw(ENV_HOST_ADMISSION)
        if host_admission is not None and host_admission not in ADMISSION_POLICIES:
            raise _invalid(ENV_HOST_ADMISSION, host_admission, ", ".join(ADMISSION_POLICIES))
        return cls(policy=policy, eviction=eviction, alpha=alpha, log_interval=log_interval,
                   tune_multiplier=multiplier, tune_grid=grid, auto_interval=interval,
                   shadow_rate=shadow_rate, auto_margin=auto_margin,
                   auto_admissions=auto_admissions, shadow_nice=shadow_nice,
                   checkpoint=checkpoint,
                   host_admission=host_admission)

    def wants_changes(self) -> bool:
        """Whether these settings ask for anything but vLLM's own behaviour."""
        if AUTO in (self.policy, self.eviction):
            return True
        if self.checkpoint != DEFAULT_CHECKPOINT or self.host_admission is not None:
            return True
        return not (get_admission(self.policy).vllm_native
                    and eviction_class(self.eviction).vllm_order)

    def describe(self) -> str:
        """``"admission=<p> eviction=<e>[ alpha=<a>]"`` for log lines."""
        text = f"admission={self.policy} eviction={self.eviction}"
        if AUTO in (self.policy, self.eviction):
            text += f" decisions every {self.auto_interval} requests"
            if self.shadow_rate is not None:
                text += f" shadow rate {self.shadow_rate:g}"
            if self.auto_margin:
                text += f" margin {self.auto_margin:g}"
            if self.auto_admissions is not None:
                text += f" admissions {','.join(self.auto_admissions)}"
            if self.shadow_nice != DEFAULT_NICE:
                text += f" shadow nice {self.shadow_nice}"
        if self.eviction != AUTO and eviction_class(self.eviction).tunable:
            text += f" alpha={'tuned online' if self.alpha is None else f'{self.alpha:g}'}"
        if self.checkpoint != DEFAULT_CHECKPOINT:
            text += f" checkpoint={self.checkpoint}"
        if self.host_admission is not None:
            text += f" host_admission={self.host_admission}"
        return text


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


_D = TypeVar("_D", float, None)


def _non_negative_float(name: str, text: str | None, default: _D, valid: str) -> float | _D:
    """``text`` as a finite number >= 0 (``default`` when unset); ``valid`` says what is
    valid when it is not."""
    if text is None:
        return default
    value = _float(text)
    if value is None or value < 0:
        raise _invalid(name, text, valid)
    return value


def _positive_int(name: str, text: str | None, default: int) -> int:
    return _int_in(name, text, default, 1)


def _int_in(name: str, text: str | None, default: int, low: int, high: int | None = None) -> int:
    """``text`` as an integer from ``low`` to ``high`` (no upper bound when ``None``;
    ``default`` when unset)."""
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        raise _invalid(name, text, f"an integer >= {low}" if high is None
                       else f"an integer from {low} to {high}")
    return value


def _invalid(name: str, value: str, valid: str) -> AdmissionConfigError:
    shown = value if len(value) <= 60 else value[:57] + "..."
    return AdmissionConfigError(f"{name}={shown!r} is invalid; valid: {valid}")
