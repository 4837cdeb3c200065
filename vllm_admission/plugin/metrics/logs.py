"""Where the plugin's log lines go (logger ``vllm_admission``)."""

from __future__ import annotations

import logging

__all__ = ["ensure_log_output", "logger"]

logger = logging.getLogger("vllm_admission")


def ensure_log_output() -> None:
    """Send the plugin's lines through vLLM's handler, at vLLM's level.

    vLLM configures only its own ``vllm`` logger (its handler, no
    propagation). When nobody gave the ``vllm_admission`` logger a handler,
    borrow vLLM's, so the plugin's INFO lines appear with vLLM's format and
    obey ``VLLM_LOGGING_LEVEL``. Configure the ``vllm_admission`` logger
    yourself (a handler of its own) to change that.
    """
    if logger.handlers:
        return
    vllm_logger = logging.getLogger("vllm")
    if not vllm_logger.handlers:
        return
    for handler in vllm_logger.handlers:
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(vllm_logger.level or logging.INFO)
    logger.propagate = False
