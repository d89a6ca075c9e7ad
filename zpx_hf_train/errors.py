"""The training stack's error for bad user input, below every module that raises it (`config`, `distributed`, ...)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file or command-line value is invalid; the message names the key and the fix."""


__all__ = ["ConfigError"]
