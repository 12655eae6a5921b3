"""A cheaper ``__init__`` for the frozen dataclasses built for every job in every round.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__``
(its own ``__setattr__`` refuses). For the small value objects the round loop builds per
job and round (``JobProgress``, ``JobView``, ``ChangeHistory``, ``Allocation``) that is
most of their cost: about 2.3 µs for ``JobProgress``'s eleven fields here, against
0.8 µs writing the instance's ``__dict__``. ``quick_init`` gives the class such an
``__init__``: the same parameters, defaults and ``__post_init__`` call, the same object
(still frozen: assigning a field afterwards raises ``FrozenInstanceError``). It takes
only what these classes use: fields with a plain default or none, no ``__slots__``.
"""
from __future__ import annotations

import dataclasses
from typing import TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Replace the frozen dataclass ``cls``'s generated ``__init__`` (see module doc)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} is not a frozen dataclass without __slots__")
    names, args, defaults = [], [], {}
    for f in dataclasses.fields(cls):
        if (not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING
                or f.name in ("self", "_fields") or f.name.startswith("_default_")):
            raise TypeError(f"quick_init: field {cls.__name__}.{f.name} is not a plain positional field")
        names.append(f.name)
        if f.default is dataclasses.MISSING:
            args.append(f.name)
        else:
            defaults[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
    body = [" _fields = self.__dict__"] + [f" _fields[{n!r}] = {n}" for n in names]
    if hasattr(cls, "__post_init__"):
        body.append(" self.__post_init__()")
    namespace: dict = dict(defaults)
    exec(f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init     # type: ignore[misc]
    return cls
