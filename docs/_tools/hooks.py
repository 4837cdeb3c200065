"""MkDocs hooks: the command-line reference and the settings table, generated from the code.

``docs/cli.md`` holds the marker ``<!-- cli-reference -->``; at build time it is replaced by
one section per ``vllm-admission`` subcommand (its usage line and a table of every option,
with its default and help text) read from ``vllm_admission.cli.build_parser()``, so the page
lists exactly the flags the installed command takes. ``<!-- settings-reference -->`` is
replaced by the table of every ``VLLM_ADMISSION_*`` variable, read from the fields of
``vllm_admission.core.settings.Settings`` (variable, default, flag, valid values, meaning) and
the plugin's internal variables (``vllm_admission.plugin.env``). Configured in
``mkdocs.yml`` (``hooks``).
"""

from __future__ import annotations

import argparse

MARKER = "<!-- cli-reference -->"
SETTINGS_MARKER = "<!-- settings-reference -->"


def _cell(text: str) -> str:
    """One table cell: whitespace folded; outside code spans, pipes and angle brackets escaped."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):     # the even parts lie outside code spans
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def _flags(action: argparse.Action) -> str:
    names = action.option_strings or [action.dest]
    metavar = action.metavar or (None if action.nargs == 0 else action.dest.upper())
    if action.choices and not action.metavar:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    shown = [f"`{name}{' ' + str(metavar) if metavar and action.option_strings else ''}`"
             for name in names]
    return _cell(", ".join(shown))


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return _cell(f"`{action.default}`")


def _subcommand(name: str, parser: argparse.ArgumentParser) -> list[str]:
    usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
    lines = [f"## `vllm-admission {name}`", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    lines += ["```text", usage, "```", "", "| option | default | what it does |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        lines.append(f"| {_flags(action)} | {_default(action)} | {_cell(action.help or '')} |")
    return [*lines, ""]


def cli_reference() -> str:
    from vllm_admission.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out: list[str] = []
    for name, subparser in sub.choices.items():
        out += _subcommand(name, subparser)
    return "\n".join(out)


def settings_reference() -> str:
    from vllm_admission.core.settings import default_text, knobs
    from vllm_admission.plugin import env as plugin_config

    lines = ["| variable | default | flag (`simulate`, `fidelity`, `replay`) | valid values | meaning |",
             "|---|---|---|---|---|"]
    for _, f, k in knobs():
        text = default_text(f)
        shown = text if text == "unset" else f"`{text}`"
        flag = f"`{k.flag}`" if k.flag else ""
        lines.append(f"| `{k.env}` | {shown} | {flag} | {_cell(k.valid_text())} | {_cell(k.help)} |")
    for name in (plugin_config.ENV_CPU_FIXES, plugin_config.ENV_METRICS_DIR, plugin_config.ENV_ACTIVE):
        lines.append(f"| `{name}` | | | | {_cell(plugin_config.ENV_VARS[name])} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if SETTINGS_MARKER in markdown:
        markdown = markdown.replace(SETTINGS_MARKER, settings_reference())
    return markdown
