"""Helpers of the ``durably`` command: one-line errors, values parsed from the command line,
and the formatting of tables, sizes, times and durations."""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from durably._trace.tracer import short_repr
from durably.exceptions import DurablyError

__all__ = [
    "_CommandError",
    "_CtrlC",
    "_clip",
    "_describe",
    "_duration",
    "_fail",
    "_usage",
    "_fields",
    "_jsonable",
    "_one_line",
    "_parse_call",
    "_parse_duration",
    "_parse_json",
    "_parse_size",
    "_percent",
    "_short",
    "_size",
    "_table",
    "_when",
]


_EXIT_CTRL_C = 130

# -- errors: one line on stderr, never a traceback ---------------------------------------------
class _CommandError(click.ClickException):
    """An error the command reports in one line on stderr (``durably: error: ...``), with
    exit status 1."""

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))

    def show(self, file: Any = None) -> None:
        """Print the one line on stderr."""
        click.echo(f"durably: error: {self.format_message()}", err=True)


class _CtrlC(_CommandError):
    exit_code = _EXIT_CTRL_C


class _UsageError(_CommandError):
    """A value of an option or argument that is not one (exit status 2, as click's own)."""

    exit_code = 2


def _fail(message: str) -> NoReturn:
    raise _CommandError(message)


def _usage(message: str) -> NoReturn:
    """Fail as a usage error: an option's value is not one (exit status 2)."""
    raise _UsageError(message)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (DurablyError, OSError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# -- values from the command line --------------------------------------------------------------
_SIZE_UNITS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-z])")


def _parse_size(option: str, text: str) -> int:
    """Bytes from ``5GB``, ``500MB``, ``1.5GiB`` or plain bytes (kB, MB, GB, TB count in
    powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).

    Raises:
        _CommandError: not a size; the message names the option and gives an example.

    Example:
        >>> _parse_size("--max-size", "5GB"), _parse_size("--max-size", "1.5KiB")
        (5000000000, 1536)
        >>> _parse_size("--max-size", "1024")
        1024
    """
    m = _SIZE.fullmatch(text)
    unit = _SIZE_UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        _usage(f"{option} {text!r} is not a size. Give bytes or a number with a unit, for "
              f"example {option} 5GB, 500MB, 1.5GiB or 1000000.")
    return int(float(m.group(1)) * unit)


def _parse_duration(option: str, text: str) -> float:
    """Seconds from ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or a sum of them (``1h30m``);
    ``0`` is 0.

    Raises:
        _CommandError: not a duration; the message names the option and gives an example.

    Example:
        >>> _parse_duration("--older-than", "30d"), _parse_duration("--older-than", "1h30m")
        (2592000.0, 5400.0)
        >>> _parse_duration("--older-than", "0")
        0.0
    """
    compact = text.strip().lower().replace(" ", "")
    if compact == "0":
        return 0.0  # (no time at all needs no unit)
    parts = _DURATION_PART.findall(compact)
    if (not parts or "".join(n + u for n, u in parts) != compact
            or any(u not in _DURATION_UNITS for _, u in parts)):
        _usage(f"{option} {text!r} is not a duration. Give a number with a unit (s, m, h, d, "
              f"w), for example {option} 30d, 12h, 90m or 45s.")
    return float(sum(float(n) * _DURATION_UNITS[u] for n, u in parts))


def _parse_json(option: str, text: str) -> Any:
    """The value of a JSON option.

    Raises:
        _CommandError: not JSON; the message says where and how to quote a string.

    Example:
        >>> _parse_json("--value", '{"ok": true}')
        {'ok': True}
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _usage(f"{option} {text!r} is not valid JSON ({exc.msg} at character {exc.pos + 1}). "
              f"A string needs JSON quotes inside the shell's: {option} '\"yes\"'; numbers, "
              "true, false, null, [lists] and {objects} are written as in JSON.")


def _parse_argument(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


_KEYWORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)


def _parse_call(args: Sequence[str]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments from ``ARG`` and ``name=ARG``; each value is JSON
    when it parses as JSON, else the string itself.

    Example:
        >>> _parse_call(["3", "owls", "[1, 2]", "factor=2.5", "name=ada"])
        ([3, 'owls', [1, 2]], {'factor': 2.5, 'name': 'ada'})
    """
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for text in args:
        m = _KEYWORD.fullmatch(text)
        if m:
            if m.group(1) in keywords:
                _usage(f"argument {m.group(1)!r} is given twice ({m.group(1)}="
                       f"{json.dumps(keywords[m.group(1)])} and {text}). Fix: give it once.")
            keywords[m.group(1)] = _parse_argument(m.group(2))
        elif keywords:
            _usage(f"argument {text!r} comes after keyword arguments "
                  f"({', '.join(keywords)}). Fix: put positional arguments first.")
        else:
            positional.append(_parse_argument(text))
    return positional, keywords


# -- output ------------------------------------------------------------------------------------
def _short(value: Any, limit: int = 60) -> str:
    # (the tracer's short repr: it never writes the whole repr of a large bytes value, a
    # dataclass or a model first, which for a result of hundreds of MB took several times
    # its size in memory)
    return _clip(short_repr(value, max(limit, 120)), limit)


def _clip(text: str | None, limit: int) -> str:
    if text is None:
        return ""
    text = _one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _when(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _duration(seconds: float | None) -> str:
    """``12 ms``, ``1.25 s``, ``2 m 05 s``, ``1 h 02 m``.

    Example:
        >>> [_duration(s) for s in (0.0004, 0.012, 1.25, 125, 3720)]
        ['0.4 ms', '12 ms', '1.25 s', '2 m 05 s', '1 h 02 m']
    """
    if seconds is None or math.isnan(seconds):
        return ""
    if seconds < 0.001:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} m {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} m"


def _size(n: int | None) -> str:
    """Bytes in powers of 1000, as ``--max-size`` reads them.

    Example:
        >>> [_size(n) for n in (512, 1_500, 2_500_000, 5 * 10**9)]
        ['512 B', '1.5 kB', '2.5 MB', '5.0 GB']
    """
    if n is None:
        return ""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000
        if value < 1000 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def _percent(rate: float | None) -> str:
    return "" if rate is None else f"{rate:.0%}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]],
           right: Sequence[int] = ()) -> str:
    """Plain columns aligned with spaces; ``right`` are the columns aligned right."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if i in right else c.ljust(w)
               for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _fields(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in rows)


def _jsonable(value: Any) -> Any:
    """The value when JSON can write it as it is, else a short ``repr`` of it (long values
    abbreviated with ``...``, at most 2,000 characters)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return short_repr(value, 2000)
    return value


