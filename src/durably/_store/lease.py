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
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

__all__ = ["LEASE_SECONDS", "RENEW_SECONDS", "Owner", "beat", "hold", "let_go", "me"]

log = logging.getLogger("durably")

#: a lease held from another host expires when not renewed for this many seconds
LEASE_SECONDS = 120.0
#: how often a running run renews its lease, in seconds
RENEW_SECONDS = 30.0


#: this process's id, kept up to date across fork() (os.getpid() is a system call, and the
#: runtime and the stores ask on every journal read and write whether they were inherited
#: from a parent)
_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


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
    _BEATING.pop(owner.token, None)


# The attempts' threads take no lock the renewing thread needs, nor the reverse: a Ctrl-C
# landing between a lock's acquisition and its release would leave it held for good.
# Single dict and list operations are atomic under the GIL.
#: the leases this process renews in the background, by owner token (see :func:`beat`)
_BEATING: dict[str, Callable[[], None]] = {}
_beater: list[threading.Thread | None] = [None]  # the renewing thread, or None
#: forks in progress, by thread: when each began (see _before_fork); an entry left by a
#: fork whose hook was cut short counts for _FORK_SECONDS at most
_FORKS: dict[int, float] = {}
_FORK_SECONDS = 10.0
_renewal_active = [False]  # a renewal is using SQLite
#: seconds between two looks of the renewing thread at its leases (it is never woken by
#: an attempt's start or end: a loop of short runs would wake it twice a run), and how
#: long it has none before it ends (no thread is left behind a run, for fork() to inherit)
_TICK_SECONDS = 0.5
_IDLE_SECONDS = 1.0
#: set as the interpreter exits: no renewal starts after it
_exiting = [False]


def beat(owner: Owner, renew: Callable[[], None]) -> None:
    """Renew ``owner``'s lease (``renew()``) every ``RENEW_SECONDS`` from a background
    thread until :func:`let_go`: a step's body may run for hours, and a lease renewed only
    between steps would expire, letting a process of another host take the run over while
    it executes. One thread renews every lease of the process, and ends a second or two
    after the last one is let go. A failed renewal is logged (debug) and tried again next
    time."""
    _BEATING[owner.token] = renew
    thread = _beater[0]
    if thread is not None and thread.is_alive():
        return  # (if it is ending, it sees this lease and goes on: see _beat_loop)
    thread = threading.Thread(target=_beat_loop, name="durably-lease", daemon=True)
    _beater[0] = thread
    try:
        thread.start()
    except RuntimeError:  # no new thread (the interpreter is shutting down)
        _beater[0] = None


def _beat_loop() -> None:
    me = threading.current_thread()
    #: when each lease was last renewed (or first seen: it was written as it was taken)
    renewed: dict[str, float] = {}
    idle_since: float | None = None
    while True:
        if _beater[0] is not me:
            return  # another renewing thread took over
        now = time.monotonic()
        for token in list(_BEATING):
            if token not in _LIVE:
                _BEATING.pop(token, None)  # let go, though let_go was cut short (Ctrl-C)
        for token in [t for t in renewed if t not in _BEATING]:
            del renewed[token]
        if _BEATING:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= _IDLE_SECONDS:
            _beater[0] = None
            if not _BEATING:  # (a lease added meanwhile: go on renewing it)
                return
            _beater[0], idle_since = me, None
        for token, renew in list(_BEATING.items()):
            if now - renewed.setdefault(token, now) < RENEW_SECONDS:
                continue
            _renewal_active[0] = True
            try:
                forking = any(time.monotonic() - t < _FORK_SECONDS for t in _FORKS.values())
                if _exiting[0] or forking:
                    # a fork must not inherit SQLite's locks: tried again at the next look
                    # (not a whole period later: a few forks in a row would let it expire)
                    continue
                renewed[token] = now
                renew()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.debug("durably: a run's lease was not renewed: %s", exc)
            finally:
                _renewal_active[0] = False
        due = min((t + RENEW_SECONDS for t in renewed.values()), default=now + _TICK_SECONDS)
        time.sleep(min(_TICK_SECONDS, max(due - time.monotonic(), 0.001)))


def _before_fork() -> None:
    """fork() waits for a renewal in progress (it holds SQLite's locks), 10 s at most, and
    no renewal starts until it is done. A Ctrl-C meanwhile does not cut the wait short (a
    child forked during a renewal can hang for ever; fork() would drop the exception too):
    it is raised again once the fork is done (see _after_fork_in_parent)."""
    me = threading.get_ident()
    _FORKS[me] = time.monotonic()
    deadline = time.monotonic() + _FORK_SECONDS
    while _renewal_active[0] and time.monotonic() < deadline:
        try:
            time.sleep(0.0005)
        except KeyboardInterrupt:  # delivered after the fork
            _INTERRUPTED_FORKS.add(me)


#: threads whose fork() was interrupted (Ctrl-C) while it waited for a renewal
_INTERRUPTED_FORKS: set[int] = set()


def _after_fork_in_parent() -> None:
    me = threading.get_ident()
    _FORKS.pop(me, None)
    if me in _INTERRUPTED_FORKS:
        _INTERRUPTED_FORKS.discard(me)
        raise_after_fork(me, sys._getframe(1))


#: threads a Ctrl-C is waiting to be raised in, once their fork() has returned
_RAISING: set[int] = set()
_raising_lock = threading.Lock()


def raise_after_fork(me: int, caller: FrameType) -> None:
    """From an after-fork hook in the parent, ``caller`` the frame that called
    ``os.fork()``: raise the Ctrl-C a before-fork wait held back in thread ``me`` once fork()
    has returned to ``caller`` (raised in a hook, it would be reported and dropped). A
    thread sends SIGINT when ``caller`` has moved on from the call, seen in ``me``'s stack:
    never while a hook (ours or another's) still runs, however busy the machine. Once per
    fork, whichever hooks held a Ctrl-C back."""
    with _raising_lock:
        if me in _RAISING:
            return
        _RAISING.add(me)
    at = caller.f_lasti

    def in_fork() -> bool:
        frame = sys._current_frames().get(me)
        while frame is not None:
            if frame is caller:
                return caller.f_lasti == at  # (still at the call: in its hooks)
            frame = frame.f_back
        return False  # (returned from the caller too)

    def send() -> None:
        try:
            while in_fork():
                time.sleep(0.001)
            signal.pthread_kill(me, signal.SIGINT)
        finally:
            with _raising_lock:
                _RAISING.discard(me)

    threading.Thread(target=send, name="durably-fork-ctrl-c", daemon=True).start()


def _after_fork_in_child() -> None:
    """In a forked child: its parent's leases are not its own, nor is its thread."""
    _FORKS.clear()
    _INTERRUPTED_FORKS.clear()
    _renewal_active[0] = _exiting[0] = False
    _BEATING.clear()
    _beater[0] = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


@atexit.register
def _no_renewal_at_exit() -> None:
    """Let a renewal in progress finish (1 s at most), and start no other, while the
    process exits."""
    _exiting[0] = True
    deadline = time.monotonic() + 1.0
    while _renewal_active[0] and time.monotonic() < deadline:
        time.sleep(0.001)


def me() -> Owner:
    """A fresh owner token for this process (recomputed after a fork)."""
    global _ME
    if _ME.pid != os.getpid():
        _ME = Owner(_machine(), os.getpid(), _start_ticks(os.getpid()), "")
    return Owner(_ME.host, _ME.pid, _ME.started, os.urandom(16).hex(), time.time())
