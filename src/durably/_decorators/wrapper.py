"""What ``@task`` and ``@entrypoint`` wrappers share: the generic wrapt base they subclass,
the instance a bound wrapper passes as ``self``, their repr, and the check of a bare
decorator's argument.

The wrappers are :class:`wrapt.FunctionWrapper` subclasses, so they bind correctly on
functions, methods, classmethods and staticmethods, keep ``__name__``, ``__doc__``,
``__wrapped__`` and the signature, and ``inspect`` sees the original function. No execution
logic lives in :mod:`durably._decorators`: calls go to :mod:`durably._runtime.call`.
Separate so that :mod:`.pickling`, :mod:`.task` and :mod:`.entrypoint` use them without
importing one another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

import wrapt

from durably._runtime.spec import Spec
from durably.exceptions import DefinitionError

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from wrapt import FunctionWrapper as _Wrapper
else:
    # wrapt < 2.5 cannot subscript FunctionWrapper at run time: add the generic parameters here
    class _Wrapper(wrapt.FunctionWrapper, Generic[P, R]):
        pass


def _describe(kind: str, spec: Spec) -> str:
    """``<durably.Task 'pkg.mod.fetch'>``: the repr of a task or an entrypoint, by its
    module and name (wrapt's own showed two addresses and the wrapped object's type)."""
    module, _, name = spec.identity.partition(":")
    return f"<durably.{kind} {f'{module}.{name}'!r}>"


def _instance_of(bound: Any) -> Any:
    """The instance (or, for a classmethod, the class) a bound wrapper passes as ``self``."""
    instance = bound._self_instance
    if bound._self_binding == "classmethod":
        return bound._self_owner if instance is None else (
            instance if isinstance(instance, type) else type(instance))
    return instance


def _check_bare(kind: str, func: Any) -> None:
    if isinstance(func, str):
        raise DefinitionError(
            f"@{kind}({func!r}): options are keywords. Fix: @{kind}(name={func!r})"
        )
