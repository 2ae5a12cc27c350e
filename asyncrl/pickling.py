"""User code that worker processes receive: env factories, custom networks and extractors, policy
mappings and rule-based policies. Pickled with cloudpickle: by reference where the object lives
in an importable module, by value where it cannot be imported there (defined in a notebook cell
or a script's ``__main__``, a lambda, a closure, a class made inside a function)."""
from __future__ import annotations

from typing import Any

import cloudpickle

from .config import ConfigError


def dumps(obj: Any, what: str) -> bytes:
    """``obj`` as bytes any worker can load; ConfigError naming ``what`` where even pickling by
    value fails."""
    try:
        return cloudpickle.dumps(obj)
    except Exception as e:
        raise ConfigError(f"{what} {obj!r} cannot be pickled, not even by value ({type(e).__name__}: "
                          f"{e}); worker processes must receive it: avoid capturing open files, "
                          "locks, threads or live envs in it") from e


def loads(blob: bytes) -> Any:
    return cloudpickle.loads(blob)


def saved(obj: Any) -> Any:
    """What ``save()`` stores for user code: bytes pickled by value where needed (None stays)."""
    return None if obj is None else cloudpickle.dumps(obj)


def restored(value: Any) -> Any:
    """The inverse of ``saved``; a file of an older version stored the object itself."""
    return cloudpickle.loads(value) if isinstance(value, (bytes, bytearray)) else value
