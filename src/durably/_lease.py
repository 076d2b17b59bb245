"""Run leases: one process at a time executes a run.

The owner of a run is this process (host, pid, the process's start time, a token). A lease
whose owner is gone — the process died on this host, or on another host stopped renewing it
for :data:`LEASE_SECONDS` — is taken over, so a crashed run can always be resumed.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["LEASE_SECONDS", "RENEW_SECONDS", "Owner", "beat", "hold", "let_go", "me"]

log = logging.getLogger("durably")

#: a lease held from another host expires when not renewed for this many seconds
LEASE_SECONDS = 120.0
#: how often a running run renews its lease, in seconds
RENEW_SECONDS = 30.0


def _proc_stat(pid: int) -> tuple[bytes, int] | None:
    """A process's state letter and when it started (Linux: clock ticks since boot, to tell
    a reused pid apart), or None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _threads_live(pid: int) -> bool:
    """Whether a thread of the process is neither a zombie nor dead."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            return True
    return False


def _start_ticks(pid: int) -> int | None:
    found = _proc_stat(pid)
    return None if found is None else found[1]


#: the pid namespace of the first process (the kernel's PROC_PID_INIT_INO)
_INIT_PID_NAMESPACE = 0xEFFFFFFC


def _machine() -> str:
    """Where a pid means this process's pids: the host name, and the pid namespace when it
    is not the host's (a container sharing the host's name, with its own pids): a lease of
    another namespace is judged by its heartbeat, as one of another host."""
    name = socket.gethostname()
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return name
    return name if namespace == _INIT_PID_NAMESPACE else f"{name} (pid namespace {namespace})"


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
        if self.host != _ME.host:
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
        found = _proc_stat(self.pid)
        if found is None:
            return True
        state, ticks = found
        if self.started is not None and ticks != self.started:
            return False  # another process with the pid
        # a zombie (killed, not yet reaped by its parent) is dead, unless only its main
        # thread ended (pthread_exit) and other threads go on
        return state not in (b"Z", b"X") or _threads_live(self.pid)

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}"


_ME = Owner(_machine(), os.getpid(), _start_ticks(os.getpid()), "")


#: tokens of the attempts this process is executing now (see :func:`hold`)
_LIVE: set[str] = set()


def hold(owner: Owner) -> None:
    """Mark ``owner`` as executing a run in this process (before its lease is taken): a
    lease of this process whose owner is not held is a leftover, taken over."""
    _LIVE.add(owner.token)


def let_go(owner: Owner) -> None:
    """The attempt of ``owner`` ended (its lease released, or left behind): its lease is
    no longer renewed."""
    _LIVE.discard(owner.token)
    with _beat:
        _BEATING.pop(owner.token, None)


#: the leases this process renews in the background, by owner token (see :func:`beat`),
#: and the thread renewing them (None: none runs), both guarded by ``_beat``
_BEATING: dict[str, Callable[[], None]] = {}
_beater: list[threading.Thread | None] = [None]
_beat = threading.Condition()
#: held while a renewal uses SQLite, and by fork() (see _before_fork): a child never
#: inherits SQLite's locks held by that thread
_renewing = threading.Lock()
_fork_held = [False]  # whether the fork in progress holds _renewing
#: seconds between two looks of the renewing thread at its leases (it is never woken by
#: an attempt's start or end: a loop of short runs would wake it twice a run), and how
#: long it has none before it ends (no thread is left behind a run, for fork() to inherit)
_TICK_SECONDS = 0.5
_IDLE_SECONDS = 1.0
#: seconds a renewal or a fork waits for the other, at most (never a hang: a fork that
#: could not wait goes on, a renewal that could not is skipped)
_LOCK_SECONDS = 10.0
#: set as the interpreter exits: no renewal starts after it
_exiting = [False]


def beat(owner: Owner, renew: Callable[[], None]) -> None:
    """Renew ``owner``'s lease (``renew()``) every ``RENEW_SECONDS`` from a background
    thread until :func:`let_go`: a step's body may run for hours, and a lease renewed only
    between steps would expire, letting a process of another host take the run over while
    it executes. One thread renews every lease of the process, and ends a second or two
    after the last one is let go. A failed renewal is logged (debug) and tried again next
    time."""
    with _beat:
        _BEATING[owner.token] = renew
        thread = _beater[0]
        if thread is not None and thread.is_alive():
            return
        thread = threading.Thread(target=_beat_loop, name="durably-lease", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # no new thread (the interpreter is shutting down)
            return
        _beater[0] = thread


def _beat_loop() -> None:
    due = time.monotonic() + RENEW_SECONDS
    idle_since: float | None = None
    with _beat:
        while True:
            now = time.monotonic()
            for token in [t for t in _BEATING if t not in _LIVE]:
                del _BEATING[token]  # let go, though let_go was cut short (Ctrl-C)
            if _BEATING:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= _IDLE_SECONDS:
                _beater[0] = None
                return
            if not _BEATING or now < due:
                _beat.wait(min(_TICK_SECONDS, max(due - now, 0.0)))
                continue
            due = now + RENEW_SECONDS
            renewals = list(_BEATING.values())
            _beat.release()
            try:
                for renew in renewals:
                    if _exiting[0] or not _renewing.acquire(timeout=_LOCK_SECONDS):
                        continue
                    try:
                        renew()
                    except Exception as exc:  # noqa: BLE001 - the next beat tries again
                        log.debug("durably: a run's lease was not renewed: %s", exc)
                    finally:
                        _renewing.release()
            finally:
                _beat.acquire()


def _before_fork() -> None:
    # (a Ctrl-C here is reported and ignored by fork(): the flag then says "not held")
    _fork_held[0] = _renewing.acquire(timeout=_LOCK_SECONDS)


def _after_fork_in_parent() -> None:
    if _fork_held[0]:
        _fork_held[0] = False
        _renewing.release()


def _after_fork_in_child() -> None:
    """In a forked child: its parent's leases are not its own, nor is its thread."""
    global _beat, _renewing
    _beat, _renewing = threading.Condition(), threading.Lock()
    _fork_held[0] = _exiting[0] = False
    _BEATING.clear()
    _beater[0] = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


@atexit.register
def _no_renewal_at_exit() -> None:
    """Let a renewal in progress finish (1 s at most), and start no other, while the
    process exits (the lock is not kept: an exit handler may still fork)."""
    got = _renewing.acquire(timeout=1.0)
    _exiting[0] = True
    if got:
        _renewing.release()


def me() -> Owner:
    """A fresh owner token for this process (recomputed after a fork)."""
    global _ME
    if _ME.pid != os.getpid():
        _ME = Owner(_machine(), os.getpid(), _start_ticks(os.getpid()), "")
    return Owner(_ME.host, _ME.pid, _ME.started, os.urandom(16).hex(), time.time())
