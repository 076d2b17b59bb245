"""What a code object reads, imports and changes, read from its bytecode.

:func:`_scan` runs the bytecode of one code object on symbolic values: the global names it
reads, the modules it imports and the mutations of its globals, closure cells and parameters
(item and attribute stores, method calls, rebinding). Which of those mutations make a value
*state* is decided by the walk (see :mod:`durably._keys.state`).
"""

from __future__ import annotations

import dis
import sys
import types
import weakref
from typing import Any

# instructions that read a global (or builtin) name; what a function only writes is no input
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})

# A symbolic value on the stack: (kind, root name, attributes read from it, item taken
# from it); kind "g" a global, "d" a closure cell, "f" a local (a parameter). None: unknown.
_Sym = tuple[str, str, tuple[str, ...], bool]
# A mutation: a _Sym, then the operation ("store": the name is rebound, "item": an item is
# assigned or deleted, "setattr": attribute `name` is assigned or deleted, "call": method
# `name` is loaded) and the attribute or method name.
_Event = tuple[str, str, tuple[str, ...], bool, str, str]

_ENDS = frozenset(
    {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP",
     "JUMP_NO_INTERRUPT", "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"}
)
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_CONSTS = frozenset(dis.hasconst)
# instructions that only push (what is below stays as it was)
_PUSH_ONLY = frozenset(
    {"LOAD_CONST", "PUSH_NULL", "LOAD_CLOSURE", "LOAD_ASSERTION_ERROR", "LOAD_BUILD_CLASS",
     "LOAD_LOCALS", "LOAD_FAST_AND_CLEAR", "LOAD_SMALL_INT", "LOAD_CONST_IMMORTAL",
     "LOAD_CONST_MORTAL"}
)
# instructions that only pop (push no result)
_POP_ONLY = frozenset(
    name for name in dis.opname
    if name.startswith(("POP_JUMP", "JUMP", "STORE_", "DELETE_"))
    or name in {"POP_TOP", "NOP", "RESUME", "RETURN_VALUE", "RETURN_CONST", "POP_EXCEPT",
                "RERAISE", "RAISE_VARARGS", "EXTENDED_ARG", "CACHE", "END_FOR",
                "PRINT_EXPR", "SETUP_ANNOTATIONS", "KW_NAMES", "MAKE_CELL", "COPY_FREE_VARS",
                "IMPORT_STAR", "NOT_TAKEN", "POP_ITER"}
)
_METHOD_FLAG = sys.version_info >= (3, 12)  # LOAD_ATTR's low bit marks a method load
# a call: [NULL, callable, args] up to 3.12, [callable, NULL, args] from 3.13 (for a method:
# the method and its object instead); 3.11 announces it with PRECALL
_NULL_FIRST = sys.version_info < (3, 13)
_CALLS = frozenset({"PRECALL"} if sys.version_info < (3, 12) else {"CALL", "CALL_KW"})
_NULL: tuple[str, str, tuple[str, ...], bool] = ("", "", (), False)  # the NULL of a call


class _Scan:
    """What one code object (not the ones nested in it) reads and changes."""

    __slots__ = ("docstring", "events", "globals", "imports")

    def __init__(self) -> None:
        self.globals: set[str] = set()
        self.imports: set[tuple[str, int, tuple[str, ...]]] = set()
        self.events: list[_Event] = []
        self.docstring = False  # co_consts[0] is a docstring the code never loads


_SCANS: weakref.WeakKeyDictionary[types.CodeType, _Scan] = weakref.WeakKeyDictionary()


def _scan(code: types.CodeType) -> _Scan:
    found = _SCANS.get(code)
    if found is None:
        found = _SCANS[code] = _scan_code(code)
    return found


def _scan_code(code: types.CodeType) -> _Scan:
    """Run the bytecode on symbolic values, along the straight line and forward jumps: enough
    to see which global, cell or parameter an item store, attribute store or method call
    acts on. Whatever is not followed precisely becomes unknown, so a mistake can only miss a
    mutation (a value stays configuration), never invent one."""
    scan = _Scan()
    bc = dis.Bytecode(code)
    entries = getattr(bc, "exception_entries", ())  # (not in typeshed yet)
    handlers = {x.target: x.depth + int(x.lasti) + 1 for x in entries}
    pending: dict[int, list[_Sym | None]] = {}  # stacks of forward jumps, by target offset
    stack: list[_Sym | None] | None = []
    loads_first = False
    prev: list[Any] = [None, None]
    keywords: tuple[str, ...] = ()  # the keyword names of the call that comes next
    for ins in bc:
        came = pending.pop(ins.offset, None)
        if came is not None:
            stack = came if stack is None else _merge(stack, came)
        elif stack is None:  # reached by an exception, or dead code
            stack = [None] * handlers.get(ins.offset, 0)
        op = ins.opname
        if ins.opcode in _CONSTS and ins.arg == 0:
            loads_first = True
        if op in _GLOBAL_OPS:
            scan.globals.add(ins.argval)
        elif op == "IMPORT_NAME":
            level = prev[0] if isinstance(prev[0], int) else 0
            fromlist = tuple(prev[1]) if isinstance(prev[1], tuple) else ()
            scan.imports.add((ins.argval, level, fromlist))
        prev = [prev[1], ins.argval]
        if ins.opcode in _JUMPS and isinstance(ins.argval, int) and ins.argval > ins.offset:
            jumped = _generic(list(stack), ins, jump=True)
            earlier = pending.get(ins.argval)
            pending[ins.argval] = jumped if earlier is None else _merge(earlier, jumped)
        if op in _CALLS and "out" in keywords and stack is not None:
            # f(..., out=x) writes its result into x (numpy's ufuncs, np.clip, ...): x
            # changes; the keyword values are the last arguments (3.13: under the names)
            at = len(stack) - (op == "CALL_KW") - len(keywords) + keywords.index("out")
            if 0 <= at < len(stack):
                _event(scan.events, stack[at], "item", "")
        named = (code.co_consts[ins.arg] if op == "KW_NAMES" and ins.arg is not None
                 and ins.arg < len(code.co_consts)  # (3.11's dis gives no argval)
                 else ins.argval if op == "LOAD_CONST" else None)
        keywords = named if isinstance(named, tuple) and all(
            isinstance(k, str) for k in named) else ()
        stack = None if op in _ENDS else _step(stack, ins, scan.events)
    consts = code.co_consts
    scan.docstring = bool(consts) and isinstance(consts[0], str) and not loads_first
    return scan


def _merge(a: list[_Sym | None], b: list[_Sym | None]) -> list[_Sym | None]:
    n = min(len(a), len(b))
    if not n:
        return []
    return [x if x == y else None for x, y in zip(a[-n:], b[-n:], strict=True)]


def _generic(stack: list[_Sym | None], ins: dis.Instruction, jump: bool) -> list[_Sym | None]:
    try:
        n = dis.stack_effect(
            ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=jump
        )
    except (ValueError, TypeError):
        return []
    if n < 0:
        del stack[n:]
    else:
        stack.extend([None] * n)
    if ins.opname not in _POP_ONLY and ins.opname not in _PUSH_ONLY:
        k = min(max(n, 0) + 1, len(stack))  # its results: unknown values
        stack[len(stack) - k:] = [None] * k
    return stack


def _event(events: list[_Event], sym: _Sym | None, op: str, name: str) -> None:
    if sym is not None and sym is not _NULL:
        events.append((*sym, op, name))


def _step(stack: list[_Sym | None], ins: dis.Instruction, events: list[_Event]
          ) -> list[_Sym | None]:
    op, arg = ins.opname, ins.argval
    if op == "LOAD_GLOBAL":
        called = (ins.arg or 0) & 1  # with the NULL of a call
        if called and _NULL_FIRST:
            stack.append(_NULL)
        stack.append(("g", arg, (), False))
        if called and not _NULL_FIRST:
            stack.append(_NULL)
    elif op == "PUSH_NULL":
        stack.append(_NULL)
    elif op in _CALLS:  # calling a value runs its class's __call__
        argc = (ins.arg or 0) + (op == "CALL_KW")
        if len(stack) >= argc + 2:
            first, second = stack[-argc - 2], stack[-argc - 1]
            if _NULL_FIRST and first is _NULL:
                _event(events, second, "call", "__call__")
            elif not _NULL_FIRST and second is _NULL:
                _event(events, first, "call", "__call__")
        return _generic(stack, ins, jump=False)
    elif op == "LOAD_NAME":
        stack.append(("g", arg, (), False))
    elif op in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
        stack.append(("d", arg, (), False))
    elif op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"):
        stack.append(("f", arg, (), False))
    elif op in ("LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"):
        stack += [("f", arg[0], (), False), ("f", arg[1], (), False)]
    elif op == "STORE_FAST_LOAD_FAST":
        del stack[-1:]
        stack.append(("f", arg[1], (), False))
    elif op == "LOAD_METHOD" or (op == "LOAD_ATTR" and _METHOD_FLAG and (ins.arg or 0) & 1):
        _event(events, stack.pop() if stack else None, "call", arg)
        stack += [None, None]
    elif op == "LOAD_ATTR":
        sym = stack.pop() if stack else None
        if sym is _NULL:
            sym = None
        elif sym is not None and not sym[3]:
            sym = (sym[0], sym[1], (*sym[2], arg), False)
        stack.append(sym)
    elif op in ("BINARY_SUBSCR", "BINARY_SLICE"):
        keys = 1 if op == "BINARY_SUBSCR" else 2
        sym = stack[-keys - 1] if len(stack) > keys else None
        sym = None if sym is _NULL else sym
        del stack[-keys - 1:]  # the container and the key(s): an item of the container
        stack.append(None if sym is None else (sym[0], sym[1], sym[2], True))
    elif op in ("STORE_SUBSCR", "DELETE_SUBSCR", "STORE_SLICE"):
        depth, size = {"STORE_SUBSCR": (2, 3), "DELETE_SUBSCR": (2, 2), "STORE_SLICE": (3, 4)}[op]
        _event(events, stack[-depth] if len(stack) >= depth else None, "item", "")
        del stack[-size:]
    elif op in ("STORE_ATTR", "DELETE_ATTR"):
        _event(events, stack[-1] if stack else None, "setattr", arg)
        del stack[-(2 if op == "STORE_ATTR" else 1):]
    elif op in ("STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF"):
        events.append(("g" if op.endswith("GLOBAL") else "d", arg, (), False, "store", ""))
        if op.startswith("STORE"):
            del stack[-1:]
    elif op == "COPY":
        n = ins.arg or 1
        stack.append(stack[-n] if len(stack) >= n else None)
    elif op == "SWAP":
        n = ins.arg or 2
        if len(stack) >= n:
            stack[-1], stack[-n] = stack[-n], stack[-1]
        else:
            stack[-1:] = [None] * min(1, len(stack))
    else:
        return _generic(stack, ins, jump=False)
    return stack


class _Refs:
    """What a function's bytecode (nested code included) refers to and changes."""

    __slots__ = ("events", "globals", "imports", "names")

    def __init__(self) -> None:
        self.globals: set[str] = set()  # global (or builtin) names it reads
        self.names: set[str] = set()  # every name, attributes included (`module.attr`)
        self.imports: set[tuple[str, int, tuple[str, ...]]] = set()  # (module, level, fromlist)
        self.events: list[_Event] = []  # mutations of its globals, cells and parameters
