"""The library's backends as Python sees them."""
from __future__ import annotations

from dataclasses import dataclass

from flashtq import _flashtq as _ext


@dataclass(frozen=True)
class BackendInfo:
    name: str
    memory: str  # "host", "cuda" or "webgpu"
    available: bool
    description: str  # what it runs on, or why it is not available


def backends() -> list[BackendInfo]:
    """Every compiled-in backend, available or not, reference first."""
    return [BackendInfo(*b) for b in _ext.backends()]


def set_threads(backend: str, threads: int) -> None:
    """Threads a host backend uses (0 = all cores)."""
    _ext.set_threads(backend, threads)
