"""Cheap construction for the frozen records the engine builds per request per step.

The engine builds a handful of small frozen dataclasses for every running request at every
step (segment specs, scheduled slices, sampling rows, deltas). Their generated frozen
``__init__`` pays one ``object.__setattr__`` per field, which adds up to a measurable share
of a 64-request decode step's host time.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import TypeVar

_Cls = TypeVar("_Cls", bound=type)


def quick_init(cls: _Cls) -> _Cls:
    """Give a frozen dataclass an ``__init__`` that fills the instance ``__dict__`` directly.

    The frozen ``__init__`` that dataclasses generates calls ``object.__setattr__`` once per
    field, about twice the cost of this one (``slots=True`` does not help: it keeps those
    calls), and the engine builds such objects for every request at every step. The class
    stays a frozen dataclass: same fields, order and keywords; eq, repr, ``replace()`` and
    FrozenInstanceError on assignment are unchanged. Like dataclasses, the ``__init__`` is
    generated source, so it is as cheap as a hand-written one and cannot drift from the
    fields. Only for fields without defaults and no ``__post_init__`` (checked here).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" in cls.__dict__:
        raise TypeError(f"quick_init needs a frozen dataclass without slots, got {cls!r}")
    if hasattr(cls, "__post_init__") or any(
            f.default is not MISSING or f.default_factory is not MISSING or not f.init
            for f in fields(cls)):
        raise TypeError(f"quick_init: {cls.__name__} has defaults, init=False fields or "
                        f"__post_init__")
    names = [f.name for f in fields(cls)]
    src = (f"def __init__(self, {', '.join(names)}):\n    d = self.__dict__\n"
           + "".join(f"    d[{n!r}] = {n}\n" for n in names))
    namespace: dict[str, object] = {}
    exec(src, namespace)  # noqa: S102 - source built from the field names above
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[misc]
    return cls
