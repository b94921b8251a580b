"""Stand-ins for CuPy streams and events that record, in order, what is queued on them: the
host-side tests of the GPU backend's stream order (test_gpu_host_plans.py,
test_decode_twins.py) run them in place of a device."""

from __future__ import annotations


class Event(str):
    """An event, named by its string (so logged waits compare with plain names); ``done``:
    whether the device has reached it (cupy.cuda.Event.done)."""

    done = False


def event(name: str, done: bool = False) -> Event:
    e = Event(name)
    e.done = done
    return e


def stream_class(log: list[tuple]) -> type:
    """A stream class whose instances append (stream, what, ...) tuples to ``log``."""

    class Stream:
        def __init__(self, name: str) -> None:
            self.name = name

        def record(self) -> Event:
            return Event(f"event({self.name})")

        def wait_event(self, event: Event) -> None:
            log.append((self.name, "waits", event))

        def __enter__(self) -> "Stream":
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def synchronize(self) -> None:
            log.append((self.name, "sync"))

        def begin_capture(self) -> None:
            log.append((self.name, "begin"))

        def end_capture(self) -> str:
            log.append((self.name, "end"))
            return "graph"

    return Stream
