"""Run leases: one process at a time executes a run.

The owner of a run is this process (host, pid, the process's start time, a token). A lease
whose owner is gone — the process died on this host, or on another host stopped renewing it
for :data:`LEASE_SECONDS` — is taken over, so a crashed run can always be resumed.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

__all__ = ["LEASE_SECONDS", "RENEW_SECONDS", "Owner", "hold", "let_go", "me"]

#: a lease held from another host expires when not renewed for this many seconds
LEASE_SECONDS = 120.0
#: how often a running run renews its lease, in seconds
RENEW_SECONDS = 30.0


def _start_ticks(pid: int) -> int | None:
    """When a process started (Linux: clock ticks since boot), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data.rpartition(b")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who executes a run."""

    host: str
    pid: int
    started: int | None
    token: str
    heartbeat: float = 0.0

    def alive(self, now: float) -> bool:
        """Whether the owner may still be executing the run."""
        if self.host != socket.gethostname():
            return now - self.heartbeat < LEASE_SECONDS
        if self.pid == os.getpid():
            # this process: alive while another thread (or a stream) executes the run; a
            # token no attempt holds was left by one interrupted before its release (Ctrl-C)
            return self.started == _ME.started and self.token in _LIVE
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by another user
        ticks = _start_ticks(self.pid)
        return ticks is None or self.started is None or ticks == self.started

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}"


_ME = Owner(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()), "")


#: tokens of the attempts this process is executing now (see :func:`hold`)
_LIVE: set[str] = set()


def hold(owner: Owner) -> None:
    """Mark ``owner`` as executing a run in this process (before its lease is taken): a
    lease of this process whose owner is not held is a leftover, taken over."""
    _LIVE.add(owner.token)


def let_go(owner: Owner) -> None:
    """The attempt of ``owner`` ended (its lease released, or left behind)."""
    _LIVE.discard(owner.token)


def me() -> Owner:
    """A fresh owner token for this process (recomputed after a fork)."""
    global _ME
    if _ME.pid != os.getpid():
        _ME = Owner(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()), "")
    return Owner(_ME.host, _ME.pid, _ME.started, os.urandom(16).hex(), time.time())
