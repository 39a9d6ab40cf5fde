"""The two ways ``dynspec proof`` stops before a check can run."""

from __future__ import annotations


class ProofUsageError(Exception):
    """The command line, or the SGLang it names, cannot be proved as asked (exit code 2)."""


class ServerStartError(Exception):
    """An SGLang server died or timed out before it answered; the message ends with its log tail."""
