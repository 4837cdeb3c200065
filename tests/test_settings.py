"""The one settings object: each variable, flag and default declared once, and the edges
(environment, command line, child-process environment) generated from the declarations."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_admission.core.admission import ADMISSION_POLICIES
from vllm_admission.core.eviction import engine_eviction_policies
from vllm_admission.core.settings import (
    AutoSettings,
    Settings,
    SettingsError,
    add_flags,
    env_name,
    knobs,
    setting_from_env,
)

PACKAGE = Path(__file__).resolve().parents[1] / "vllm_admission"
SETTINGS_MODULE = PACKAGE / "core" / "settings.py"
PLUGIN_CONFIG = PACKAGE / "plugin" / "env.py"


def _code_strings(tree: ast.AST) -> list[str]:
    """Every string constant of a module's code (f-string pieces included), docstrings left
    out: a name in prose is documentation, a name in a constant is a definition."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def test_each_variable_is_written_in_one_package_module():
    """A ``VLLM_ADMISSION_*`` name in code is in ``core/settings.py`` (the settings) or
    ``plugin/env.py`` (the plugin's internal ones), and in no other module."""
    where: dict[str, set[Path]] = {}
    for path, tree in _modules():
        for text in _code_strings(tree):
            for name in re.findall(r"VLLM_ADMISSION_[A-Z][A-Z_]*", text):
                where.setdefault(name, set()).add(path)
    setting_vars = {k.env for _, _, k in knobs()}
    assert setting_vars <= set(where)
    for name, paths in where.items():
        assert paths == {SETTINGS_MODULE if name in setting_vars else PLUGIN_CONFIG}, (name, paths)


def test_each_flag_of_a_setting_is_declared_once():
    """No ``add_argument`` outside ``core/settings.py`` declares a setting's flag: each
    parser gets it from :func:`add_flags`."""
    flags = {k.flag for _, _, k in knobs() if k.flag}
    assert flags == {"--alpha", "--tune-grid", "--checkpoint", "--host-admission",
                     "--auto-interval", "--shadow-rate", "--auto-margin", "--auto-admissions"}
    for path, tree in _modules():
        if path == SETTINGS_MODULE:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                names = {a.value for a in node.args if isinstance(a, ast.Constant)}
                assert not names & flags, (path, node.lineno, names & flags)


#: The names a setting's default travels under through the package's signatures and fields.
_DEFAULT_NAMES = {
    "tune_multiplier", "multiplier", "tune_grid", "grid", "checkpoint", "host_admission",
    "log_interval", "auto_interval", "interval", "min_window", "shadow_rate", "auto_margin",
    "margin", "stock_margin", "auto_admissions", "admissions", "shadow_nice", "nice",
}


def test_no_setting_default_is_written_twice():
    """Outside the constants that own them, no parameter or field named for a setting has a
    literal default (``checkpoint: str = "split"``): it names the constant instead, so a
    default is written once."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                positional = a.posonlyargs + a.args
                pairs += list(zip(positional[len(positional) - len(a.defaults):], a.defaults,
                                  strict=True))
                pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                          if d is not None]
                pairs = [(arg.arg, d) for arg, d in pairs]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                pairs = [(node.target.id, node.value)]
            for name, default in pairs:
                if (name in _DEFAULT_NAMES and isinstance(default, ast.Constant)
                        and default.value is not None):
                    found.append(f"{path.relative_to(PACKAGE)}:{default.lineno} {name}={default.value!r}")
    assert found == []


def test_the_other_settings_objects_default_to_the_settings_defaults():
    from vllm_admission.fidelity.spec import FidelitySpec
    from vllm_admission.sim.simulation_settings import SimulationSettings
    from vllm_admission.sim.sweep import SweepSpec

    s = Settings()
    expected = {"alpha": s.alpha, "tune_multiplier": s.tune_multiplier, "tune_grid": s.tune_grid,
                "checkpoint": s.checkpoint, "host_admission": s.host_admission,
                "auto_interval": s.auto.interval, "shadow_rate": s.auto.shadow_rate,
                "auto_margin": s.auto.margin, "auto_admissions": s.auto.admissions}
    for cls in (SimulationSettings, SweepSpec, FidelitySpec):
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for name, value in expected.items():
            if name in defaults:
                assert defaults[name] == value, (cls.__name__, name)
    assert SimulationSettings.of("auto", "auto").policy.auto == AutoSettings()


_NAMES = st.sampled_from


@st.composite
def _settings(draw) -> Settings:
    auto = AutoSettings(
        interval=draw(st.integers(1, 10_000)),
        shadow_rate=draw(st.none() | st.floats(0.001, 1.0)),
        margin=draw(st.floats(0.0, 5.0)),
        admissions=draw(st.none() | st.lists(_NAMES(list(ADMISSION_POLICIES)), min_size=1,
                                             unique=True).map(tuple)),
        shadow_nice=draw(st.integers(0, 19)))
    return Settings(
        admission="auto" if auto.admissions is not None else draw(_NAMES([*ADMISSION_POLICIES, "auto"])),
        eviction=draw(_NAMES([*engine_eviction_policies(), "auto"])),
        alpha=draw(st.none() | st.floats(0.0, 100.0)),
        tune_multiplier=draw(st.integers(1, 50)), tune_grid=draw(_NAMES(["coarse", "paper"])),
        checkpoint=draw(_NAMES(["split", "inpass"])),
        host_admission=draw(st.none() | _NAMES(list(ADMISSION_POLICIES))),
        log_interval=draw(st.floats(0.0, 1e6)), auto=auto)


@settings(max_examples=200, deadline=None)
@given(_settings())
def test_the_environment_a_child_process_gets_reads_back_equal(s):
    assert Settings.from_env(s.to_env()) == s


def test_the_flags_are_generated_from_the_fields_and_parse_like_the_variables():
    parser = argparse.ArgumentParser()
    add_flags(parser, [".".join(p) for p, _, k in knobs() if k.flag])
    args = parser.parse_args(["--alpha", "0.5", "--tune-grid", "paper", "--checkpoint", "inpass",
                              "--host-admission", "dense", "--auto-interval", "7",
                              "--shadow-rate", "0.25", "--auto-margin", "0.3",
                              "--auto-admissions", "last,written"])
    got = Settings.from_args(args)
    assert got == Settings(alpha=0.5, tune_grid="paper", checkpoint="inpass", host_admission="dense",
                           auto=AutoSettings(interval=7, shadow_rate=0.25, margin=0.3,
                                             admissions=("last", "written")))
    assert Settings.from_args(parser.parse_args([])) == Settings()
    for _, _, k in knobs():
        if k.flag:
            action = next(a for a in parser._actions if k.flag in a.option_strings)
            assert k.env in action.help   # the flag says which variable the plugin reads
    with pytest.raises(SettingsError, match=r"^--auto-interval='0' is invalid; valid: an integer >= 1"):
        Settings.from_args(parser.parse_args(["--auto-interval", "0"]))
    with pytest.raises(ValueError, match="not a setting with a command-line flag"):
        add_flags(argparse.ArgumentParser(), ["log_interval"])


def test_simulate_takes_its_settings_flags_from_the_object():
    from vllm_admission.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["simulate", "--out", "x", "--auto-margin", "0.3", "--checkpoint", "inpass"])
    got = Settings.from_args(args)
    assert got.auto.margin == 0.3 and got.checkpoint == "inpass"
    assert got.admission == Settings().admission   # the pair is a grid there, not a flag


def test_one_setting_is_read_alone_and_named_in_messages():
    assert setting_from_env("checkpoint", {}) == "split"
    assert setting_from_env("checkpoint", {env_name("checkpoint"): " inpass "}) == "inpass"
    assert setting_from_env("auto.margin", {"VLLM_ADMISSION_AUTO_MARGIN": "0.5"}) == 0.5
    with pytest.raises(SettingsError, match="VLLM_ADMISSION_CHECKPOINT='fused' is invalid"):
        setting_from_env("checkpoint", {"VLLM_ADMISSION_CHECKPOINT": "fused"})
    with pytest.raises(KeyError):
        env_name("policy")   # the old name of the admission field


def test_a_parser_reason_is_kept_in_the_one_line():
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"VLLM_ADMISSION_POLICY": "auto", "VLLM_ADMISSION_AUTO_ADMISSIONS": "vllm,vllm"})
    msg = str(info.value)
    assert "\n" not in msg and "twice" in msg
