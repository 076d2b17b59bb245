"""The progress bar of a fan-out (tqdm: terminals and notebooks; off otherwise)."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from durably.exceptions import DefinitionError

if TYPE_CHECKING:
    pass

log = logging.getLogger("durably")

__all__ = ["_Progress", "progress_enabled"]

_PROGRESS_DELAY = 0.5  # seconds: a fan-out shorter than this never shows a progress bar


# -- progress -------------------------------------------------------------------------------
def progress_enabled(progress: bool | None) -> bool:
    """``progress`` if given; else ``$DURABLY_PROGRESS`` (0/1); else on in a terminal or a
    notebook, off when output is not interactive."""
    if progress is not None:
        if not isinstance(progress, bool):
            raise DefinitionError(f"progress must be True, False or None, not {progress!r}")
        return progress
    env = os.environ.get("DURABLY_PROGRESS", "").strip().lower()
    if env in ("0", "false", "off", "no"):
        return False
    if env in ("1", "true", "on", "yes"):
        return True
    return _in_notebook() or _isatty(sys.stderr)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 - a replaced stream without isatty
        return False


def _in_notebook() -> bool:
    if "ipykernel" not in sys.modules:
        return False
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


class _Progress:
    """A tqdm bar with counts of ran / cached (/ replayed / failed) items, or nothing."""

    __slots__ = ("bar", "counts", "enabled", "name", "total")

    def __init__(self, name: str, total: int, enabled: bool) -> None:
        self.name = name
        self.total = total
        self.enabled = enabled
        self.counts = {"ran": 0, "cached": 0, "replayed": 0, "failed": 0}
        self.bar: Any = None

    def start(self) -> None:
        if not self.enabled:
            return
        try:
            if _in_notebook():
                from tqdm.auto import tqdm  # type: ignore[import-untyped]
            else:
                from tqdm import tqdm  # type: ignore[import-untyped]
        except ImportError:  # tqdm is a dependency; a broken install only loses the bar
            return
        self.bar = tqdm(total=self.total, initial=self.total - self.pending(),
                        desc=self.name, unit="item", delay=_PROGRESS_DELAY, dynamic_ncols=True)
        self._postfix()

    def pending(self) -> int:
        return self.total - sum(self.counts.values())

    def count(self, status: str) -> None:
        self.counts[status] += 1
        if self.bar is not None:
            self._postfix()
            self.bar.update(1)

    def _postfix(self) -> None:
        c = self.counts
        text = f"ran {c['ran']}, cached {c['cached']}"
        if c["replayed"]:
            text += f", replayed {c['replayed']}"
        if c["failed"]:
            text += f", failed {c['failed']}"
        self.bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


