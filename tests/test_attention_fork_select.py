"""When a step's attention forks (crucible/backend/cupy_fork.py ``fork_for``): only a mixed
step (both kinds of segment), only while the backend's options ask for it, and always the
backend's one Fork. Host-only: a Fork already made stands in, so no CuPy is needed."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from crucible.backend import cupy_fork
from crucible.backend.options import BackendOptions


def backend(fork_on: bool) -> SimpleNamespace:
    be = SimpleNamespace(options=dataclasses.replace(BackendOptions(), attention_fork=fork_on))
    be._fork = object()  # the one Fork this backend made earlier
    return be


def test_a_mixed_step_takes_the_backends_fork() -> None:
    be = backend(True)
    assert BackendOptions().attention_fork  # on by default
    assert cupy_fork.fork_for(be, SimpleNamespace(mixed=object())) is be._fork


def test_other_steps_and_the_switch_off_take_none() -> None:
    assert cupy_fork.fork_for(backend(True), SimpleNamespace(mixed=None)) is None
    assert cupy_fork.fork_for(backend(False), SimpleNamespace(mixed=object())) is None
