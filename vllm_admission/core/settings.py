"""The policy settings a user gives, as one typed object: :class:`Settings`.

One frozen dataclass holds what an operator or a researcher chooses about cache policy:
the admission and eviction pair, ``flop``'s alpha and its tuner, ``auto``'s settings
(:class:`AutoSettings`), the checkpoint mode, per-tier admission and the plugin's log
interval. Each field is declared once, with its default and, in the field's metadata, a
:class:`Knob`: the ``VLLM_ADMISSION_*`` environment variable that sets it, the command-line
flag that sets it (where one does), the parser that turns the text into the typed value
and says what is valid, and a one-line description.

Everything else is generated from those declarations: :meth:`Settings.from_env` (the
plugin), :func:`add_flags` and :meth:`Settings.from_args` (the command line),
:func:`env_vars` (the documentation's table and vLLM's environment registration), and
:meth:`Settings.to_env` (an engine started in another process). The simulator's, sweep's
and fidelity's settings take their defaults from here (``tests/test_settings.py``
checks that no default, variable or flag is written twice).

Pure Python: the core's registries and parsers only.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vllm_admission.core.adaptive import (
    AUTO,
    DEFAULT_INTERVAL,
    DEFAULT_MARGIN,
    check_stock_margin,
    parse_auto_admissions,
    parse_shadow_rate,
    stock_pair,
)
from vllm_admission.core.admission import ADMISSION_POLICIES, get_admission
from vllm_admission.core.cache import CHECKPOINT_MODES, DEFAULT_CHECKPOINT
from vllm_admission.core.errors import UserError
from vllm_admission.core.eviction import engine_eviction_policies, eviction_class
from vllm_admission.core.shadows import DEFAULT_NICE, MAX_NICE
from vllm_admission.core.tuning import DEFAULT_GRID, DEFAULT_MULTIPLIER, GRIDS

__all__ = ["KNOB", "STOCK_SETTINGS", "AutoSettings", "Knob", "Settings", "SettingsError", "add_flags",
           "default_text", "env_name", "env_vars", "knobs", "setting_from_env"]

#: The metadata key under which a field declares its :class:`Knob`.
KNOB = "knob"


class SettingsError(UserError):
    """A setting has a value that cannot be used. The message is one line:
    ``"<VARIABLE or --flag>=<value> is invalid; valid: ..."``."""


@dataclass(frozen=True)
class Knob:
    """How the user sets one field of :class:`Settings` or :class:`AutoSettings`.

    Attributes:
        env: the ``VLLM_ADMISSION_*`` variable (every field has one).
        flag: the command-line flag of ``simulate`` and ``fidelity``, or ``None`` where the
            command line has none (the policy pair is a list there: a sweep's grid).
        parse: the text (stripped, never empty) to the typed value; raises
            :class:`~vllm_admission.core.errors.UserError` (or ``ValueError``) when invalid.
        valid: what is valid, for the one-line error (a callable where it lists the
            registries' names: :meth:`valid_text`).
        help: one line for ``--help``, the documentation and vLLM's environment registry.
        metavar: the flag's placeholder in ``--help``.
        unset: how a default of ``None`` reads (``--help``, the docs, vLLM's registry).
    """

    env: str
    flag: str | None
    parse: Callable[[str], Any]
    valid: str | Callable[[], str]
    help: str
    metavar: str | None = None
    unset: str = "unset"

    def valid_text(self) -> str:
        """``valid``, built now where it is read from the registries (plugins add names)."""
        return self.valid if isinstance(self.valid, str) else self.valid()


_T = TypeVar("_T")


def _knob(default: _T, **knob: Any) -> _T:
    return field(default=default, metadata={KNOB: Knob(**knob)})


def _finite_at_least_zero(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(text)
    return value


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value
    return parse


def _one_of(names: Callable[[], Sequence[str]]) -> Callable[[str], str]:
    # A callable: the registries are read when the text is parsed, after plugins loaded.
    def parse(text: str) -> str:
        if text not in names():
            raise ValueError(text)
        return text
    return parse


def _admission_names() -> tuple[str, ...]:
    return (*ADMISSION_POLICIES, AUTO)


def _eviction_names() -> tuple[str, ...]:
    return (*engine_eviction_policies(), AUTO)


def _margin(text: str) -> float:
    return check_stock_margin(float(text))


@dataclass(frozen=True)
class AutoSettings:
    """``auto``'s settings (:class:`~vllm_admission.core.adaptive.PolicyController`).

    Attributes:
        interval: requests between two policy decisions (``min_window``), >= 1.
        shadow_rate: the fraction of requests the shadow caches serve, in ``(0, 1]``
            (``None``: chosen from the traffic; 1: full shadows).
        margin: the relative lead over stock's pair a pair's shadow needs before ``auto``
            leaves stock's pair for it (``stock_margin``; 0: off).
        admissions: the admission policies ``auto`` admission chooses among (``None``:
            every registered ``auto`` candidate).
        shadow_nice: in the plugin, added to the shadow process's niceness, 0 to 19.
    """

    interval: int = _knob(
        DEFAULT_INTERVAL, env="VLLM_ADMISSION_AUTO_INTERVAL", flag="--auto-interval",
        parse=_int_in(1), valid="an integer >= 1",
        help="auto: requests between two policy decisions")
    shadow_rate: float | None = _knob(
        None, env="VLLM_ADMISSION_SHADOW_RATE", flag="--shadow-rate", metavar="auto|R",
        unset="auto", parse=parse_shadow_rate, valid="auto, or a number in (0, 1] (1 = full shadows)",
        help="auto: the fraction of requests its shadow caches serve, on pools scaled alike "
             "('auto': chosen from the traffic; 1: full shadows)")
    margin: float = _knob(
        DEFAULT_MARGIN, env="VLLM_ADMISSION_AUTO_MARGIN", flag="--auto-margin", metavar="M",
        parse=_margin, valid="a finite number >= 0 (0 = off; 0.3 = a 30% lead)",
        help="auto: leave stock's pair only for one whose shadow saved more than (1 + M) "
             "times stock's, and serve no pair whose shadow saved less than stock's (0: off)")
    admissions: tuple[str, ...] | None = _knob(
        None, env="VLLM_ADMISSION_AUTO_ADMISSIONS", flag="--auto-admissions", metavar="NAMES",
        parse=parse_auto_admissions,
        valid=(lambda: "admission policy names, comma-separated, each once, from "
                            + ", ".join(ADMISSION_POLICIES)),
        help="auto admission: the admission policies it chooses among, comma-separated "
             "(unset: every registered auto candidate)")
    shadow_nice: int = _knob(
        DEFAULT_NICE, env="VLLM_ADMISSION_SHADOW_NICE", flag=None,
        parse=_int_in(0, MAX_NICE), valid=f"an integer from 0 to {MAX_NICE}",
        help=f"auto: added to the niceness of its shadow process ({MAX_NICE}: the lowest "
             f"priority; 0: the engine's)")


@dataclass(frozen=True)
class Settings:
    """The policy settings of one run or one engine (module docstring).

    Attributes:
        admission: an admission policy name, or ``auto``.
        eviction: an eviction policy an engine can run (needs no future), or ``auto``.
        alpha: ``flop``'s alpha, fixed (``None``: tuned online).
        tune_multiplier: the alpha tuner's bootstrap window, in multiples of the requests
            served before the first eviction (Marconi: 5).
        tune_grid: the alphas the tuner tries at bootstrap, a key of
            :data:`~vllm_admission.core.tuning.GRIDS`.
        checkpoint: where recurrent states are written, one of
            :data:`~vllm_admission.core.cache.CHECKPOINT_MODES`.
        host_admission: per-tier admission with a host tier: an admission policy whose
            states go to host memory only where ``admission`` does not keep them (``None``:
            none).
        log_interval: the plugin's seconds between metric log lines (0: none).
        auto: ``auto``'s settings.

    Raises:
        SettingsError: from :meth:`from_env` and :meth:`from_args`, the first invalid value,
            in one line.
    """

    admission: str = _knob(
        stock_pair().admission, env="VLLM_ADMISSION_POLICY", flag=None,
        parse=_one_of(_admission_names),
        valid=(lambda: ", ".join(_admission_names())),
        help="admission policy: a registered name, or auto")
    eviction: str = _knob(
        stock_pair().eviction, env="VLLM_ADMISSION_EVICTION", flag=None,
        parse=_one_of(_eviction_names),
        valid=(lambda: ", ".join(_eviction_names())),
        help="eviction policy: a registered one an engine can run (no future), or auto")
    alpha: float | None = _knob(
        None, env="VLLM_ADMISSION_ALPHA", flag="--alpha", metavar="A",
        parse=_finite_at_least_zero, valid="a finite number >= 0, or unset to tune alpha online",
        help="flop eviction's alpha, fixed instead of tuned online")
    tune_multiplier: int = _knob(
        DEFAULT_MULTIPLIER, env="VLLM_ADMISSION_TUNE_MULTIPLIER", flag=None,
        parse=_int_in(1), valid="an integer >= 1",
        help="the alpha tuner's bootstrap window, in multiples of the requests served before "
             "the first eviction")
    tune_grid: str = _knob(
        DEFAULT_GRID, env="VLLM_ADMISSION_TUNE_GRID", flag="--tune-grid",
        parse=_one_of(lambda: tuple(GRIDS)), valid=", ".join(GRIDS),
        help="the alphas flop's tuner tries at bootstrap: 'coarse' (0, 0.1, 0.2, 0.5, 1, 2) "
             "or Marconi's 'paper' grid (0 to 2 by 0.1)")
    checkpoint: str = _knob(
        DEFAULT_CHECKPOINT, env="VLLM_ADMISSION_CHECKPOINT", flag="--checkpoint",
        metavar="|".join(CHECKPOINT_MODES),
        parse=_one_of(lambda: CHECKPOINT_MODES), valid=", ".join(CHECKPOINT_MODES),
        help="where recurrent states are written: 'split' (a prefill chunk ends at every "
             "kept state, as vLLM 0.32) or 'inpass' (inside the forward pass; "
             "docs/checkpoints.md)")
    host_admission: str | None = _knob(
        None, env="VLLM_ADMISSION_HOST_ADMISSION", flag="--host-admission",
        parse=_one_of(lambda: tuple(ADMISSION_POLICIES)),
        valid=(lambda: ", ".join(ADMISSION_POLICIES)),
        help="per-tier admission with a host tier (vLLM's OffloadingConnector): the states "
             "this admission policy keeps go to host memory only where the GPU policy does "
             "not keep them")
    log_interval: float = _knob(
        10.0, env="VLLM_ADMISSION_LOG_INTERVAL", flag=None,
        parse=_finite_at_least_zero, valid="seconds, a finite number >= 0 (0 = no log lines)",
        help="the plugin's seconds between metric log lines (0: none)")
    auto: AutoSettings = field(default_factory=AutoSettings)

    # -- the edges -----------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the ``VLLM_ADMISSION_*`` variables of ``environ`` (default
        ``os.environ``) give; an unset or empty variable keeps the default. Other
        packages' policies (entry points) are loaded first, so their names are valid.

        Raises:
            SettingsError: the first invalid variable, in one line.
        """
        from vllm_admission.core.policies import load_policy_plugins

        load_policy_plugins()
        env = os.environ if environ is None else environ
        texts = {k.env: env.get(k.env) for _, _, k in knobs()}
        return cls._build(texts, lambda k: k.env, check_pair=True)

    @classmethod
    def from_args(cls, args: argparse.Namespace, base: Settings | None = None) -> Settings:
        """``base`` (default: the defaults) with the flags :func:`add_flags` added to a parser
        replaced by what ``args`` holds for them (a flag not given, or not on that parser,
        keeps ``base``'s value). The policy pair is not a flag (a sweep's grid is a list):
        the caller sets it and checks ``--auto-admissions`` against it.

        Raises:
            SettingsError: the first invalid flag, in one line.
        """
        texts = {}
        for path, _, k in knobs():
            if k.flag is not None:
                texts[k.env] = getattr(args, _dest(path), None)
        return cls._build(texts, lambda k: k.flag or k.env, base)

    @classmethod
    def _build(cls, texts: Mapping[str, str | None], shown: Callable[[Knob], str],
               base: Settings | None = None, check_pair: bool = False) -> Settings:
        base = cls() if base is None else base
        values: dict[tuple[str, ...], Any] = {}
        for path, _, k in knobs():
            text = texts.get(k.env)
            text = text.strip() if isinstance(text, str) else None
            if not text:
                continue
            try:
                values[path] = k.parse(text)
            except (UserError, ValueError) as exc:
                shown_text = text if len(text) <= 60 else text[:57] + "..."
                # A parser's own one-line reason (UserError) is kept after the valid values.
                reason = f" ({exc})" if isinstance(exc, UserError) else ""
                raise SettingsError(f"{shown(k)}={shown_text!r} is invalid; valid: "
                                    f"{k.valid_text()}{reason}") from None
        auto = dataclasses.replace(base.auto, **{p[1]: v for p, v in values.items() if len(p) == 2})
        made = dataclasses.replace(base, auto=auto,
                                   **{p[0]: v for p, v in values.items() if len(p) == 1})
        if check_pair and made.auto.admissions is not None and made.admission != AUTO:
            first = _field_knob(AutoSettings, "admissions")
            policy = _field_knob(Settings, "admission")
            raise SettingsError(
                f"{shown(first)}={(texts.get(first.env) or '').strip()} names the policies "
                f"{policy.env}={AUTO} chooses among, but "
                f"{policy.env}={made.admission} (valid here: unset, or {policy.env}={AUTO})")
        return made

    def to_env(self) -> dict[str, str]:
        """The ``VLLM_ADMISSION_*`` variables that give these settings to another process
        (only those that differ from the defaults); :meth:`from_env` reads them back
        equal."""
        default = Settings()
        out = {}
        for path, _, k in knobs():
            value, base = _get(self, path), _get(default, path)
            if value == base:
                continue
            if value is None:
                raise ValueError(f"{k.env}: a default that is set cannot be unset by a variable")
            out[k.env] = ",".join(value) if isinstance(value, tuple) else f"{value}"
        return out

    # -- reading ---------------------------------------------------------------
    @property
    def adaptive(self) -> bool:
        """Whether ``auto`` chooses the admission or the eviction policy."""
        return AUTO in (self.admission, self.eviction)

    def wants_changes(self) -> bool:
        """Whether these settings ask for anything but vLLM's own behaviour."""
        if self.adaptive or self.checkpoint != DEFAULT_CHECKPOINT or self.host_admission is not None:
            return True
        return not (get_admission(self.admission).vllm_native
                    and eviction_class(self.eviction).vllm_order)

    def describe(self) -> str:
        """``"admission=<a> eviction=<e>[ ...]"``: the settings that differ, for log lines."""
        text = f"admission={self.admission} eviction={self.eviction}"
        a = self.auto
        if self.adaptive:
            text += f" decisions every {a.interval} requests"
            if a.shadow_rate is not None:
                text += f" shadow rate {a.shadow_rate:g}"
            if a.margin:
                text += f" margin {a.margin:g}"
            if a.admissions is not None:
                text += f" admissions {','.join(a.admissions)}"
            if a.shadow_nice != DEFAULT_NICE:
                text += f" shadow nice {a.shadow_nice}"
        if self.eviction != AUTO and eviction_class(self.eviction).tunable:
            text += f" alpha={'tuned online' if self.alpha is None else f'{self.alpha:g}'}"
        if self.checkpoint != DEFAULT_CHECKPOINT:
            text += f" checkpoint={self.checkpoint}"
        if self.host_admission is not None:
            text += f" host_admission={self.host_admission}"
        return text


def _get(settings: Settings, path: tuple[str, ...]) -> Any:
    value: Any = settings
    for name in path:
        value = getattr(value, name)
    return value


def _field_knob(cls: type, name: str) -> Knob:
    (f,) = (f for f in dataclasses.fields(cls) if f.name == name)
    knob: Knob = f.metadata[KNOB]
    return knob


def knobs() -> Iterator[tuple[tuple[str, ...], dataclasses.Field[Any], Knob]]:
    """Every field of :class:`Settings` with a :class:`Knob`, those of
    :class:`AutoSettings` under ``("auto", name)``: ``(path, field, knob)``."""
    for f in dataclasses.fields(Settings):
        if KNOB in f.metadata:
            yield (f.name,), f, f.metadata[KNOB]
    for f in dataclasses.fields(AutoSettings):
        yield ("auto", f.name), f, f.metadata[KNOB]


def _dest(path: tuple[str, ...]) -> str:
    return "_".join(path)


def add_flags(parser: argparse.ArgumentParser | Any, names: Sequence[str]) -> None:
    """Add the flags of the settings ``names`` (dotted paths, ``"alpha"``, ``"auto.margin"``)
    to ``parser`` (or an argument group), as text defaulting to ``None`` (unset), each
    ``--help`` line from its :class:`Knob` and default; :meth:`Settings.from_args` parses
    them.

    Raises:
        ValueError: a name that is not a setting with a flag.
    """
    by_path = {".".join(p): (p, f, k) for p, f, k in knobs()}
    for name in names:
        if name not in by_path or by_path[name][2].flag is None:
            raise ValueError(f"{name!r} is not a setting with a command-line flag")
        path, f, k = by_path[name]
        assert k.flag is not None
        parser.add_argument(k.flag, dest=_dest(path), default=None, metavar=k.metavar,
                            help=f"{k.help} (default {default_text(f)}; {k.env} in the plugin)"
                            .replace("%", "%%"))


def env_name(name: str) -> str:
    """The ``VLLM_ADMISSION_*`` variable of the setting ``name`` (a dotted path:
    ``"admission"``, ``"auto.margin"``), for messages that name it.

    Raises:
        KeyError: not a setting.
    """
    for path, _, k in knobs():
        if ".".join(path) == name:
            return k.env
    raise KeyError(name)


def setting_from_env(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The one setting ``name`` (a dotted path) as ``environ`` (default ``os.environ``)
    gives it, parsed; its default when unset. For a process that must know one setting
    before it may read them all (the others are checked where the scheduler starts).

    Raises:
        KeyError: not a setting.
        SettingsError: its variable holds an invalid value.
    """
    env = os.environ if environ is None else environ
    variable = env_name(name)
    settings = Settings._build({variable: env.get(variable)}, lambda k: k.env)
    return _get(settings, tuple(name.split(".")))


def env_vars() -> dict[str, str]:
    """Every settings variable: name -> one line (its help and default), for the
    documentation and for vLLM's registry of environment variables."""
    return {k.env: f"{k.help} (default {default_text(f)})" for _, f, k in knobs()}


def default_text(f: dataclasses.Field[Any]) -> str:
    """How the default of the setting field ``f`` (one :func:`knobs` yields) reads:
    the value, or its knob's ``unset`` text where it is ``None``."""
    knob: Knob = f.metadata[KNOB]
    return knob.unset if f.default is None else str(f.default)


#: Stock vLLM's pair as the plugin's variables give it, for messages that say what runs
#: where the plugin cannot change anything.
STOCK_SETTINGS = (f"{env_name('admission')}={stock_pair().admission} with "
                  f"{env_name('eviction')}={stock_pair().eviction}")
