"""The package's docstrings and comments point only at pages that exist (issue 63: three
docstrings once cited a ``docs/research-log-adaptive.md`` that never did)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = re.compile(r"(?<![\w/.])((?:docs|research-log|benchmarks|simulations|scripts)/[\w./-]+\.(?:md|py|json|patch))")


def test_every_page_a_module_names_exists():
    missing = []
    for path in sorted((ROOT / "vllm_admission").rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for page in PAGE.findall(line):
                if not (ROOT / page).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{lineno} {page}")
    assert missing == []


def test_the_check_sees_a_missing_page():
    assert PAGE.findall("see ``docs/research-log-adaptive.md``") == ["docs/research-log-adaptive.md"]
    assert not (ROOT / "docs/research-log-adaptive.md").exists()
