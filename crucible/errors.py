"""Error types that callers can tell apart (the server maps them to HTTP statuses)."""

from __future__ import annotations


class CrucibleError(Exception):
    """Base class for every error Crucible raises on purpose."""


class ConfigError(CrucibleError, ValueError):
    """A setting (CLI flag, env var, constructor argument) has a bad value."""


class ModelLoadError(CrucibleError):
    """A model file or directory is missing, corrupt, truncated or unsupported."""


class BatchValidationError(CrucibleError, ValueError):
    """Packed-batch metadata failed host validation; nothing reached a backend."""


class QueueFullError(CrucibleError):
    """The waiting queue is at its bound; the request was refused at once (HTTP 429)."""


class RequestError(CrucibleError, ValueError):
    """A request cannot be served as given (too long for the context, bad params)."""


class BackendUnavailableError(CrucibleError):
    """The requested device/backend cannot run here (e.g. --device cuda without a GPU)."""
