"""Loggers of the plugin, placed under vLLM's logger tree ("vllm.x86.*") so plugin
messages share vLLM's handlers, format and VLLM_LOGGING_LEVEL."""

from __future__ import annotations

import logging


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"vllm.x86.{name}")
