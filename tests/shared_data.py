"""Where the tests find the shared data beside the checkout (``../shared``), in one place.

Module constants, so that parametrizations can name them at import; tests that need a file
call :func:`require` (or take ``conftest``'s ``shared_dir`` fixture), which skips naming the
missing path, and fails instead under ``.ci/run`` (``CI_REQUIRE_SHARED``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODEL_CONFIGS = SHARED / "model_configs"
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
VLLM_TESTS = SHARED / "vllm-0.32.0-tests"


def require(path: Path) -> Path:
    """``path`` if it exists; else skip the test, naming it (the word "shared" in the
    reason is what ``.ci/run`` turns into a failure)."""
    if not Path(path).exists():
        pytest.skip(f"{path} not found (the shared/ checkout beside the repository)")
    return Path(path)
