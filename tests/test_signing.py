"""Integrity signing and who may write a store: a signed store loads only what its key signed,
and a directory other users can write is refused unless the user opts in."""

from __future__ import annotations

import logging
import os
import pickle
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durably
from durably._keys import serde as _serde
from durably._store.disk.store import JOURNAL_FORMAT
from durably._store.integrity import SigningKey, open_seal, seal

KEY = b"k" * 16 + b"-a-test-signing-key"
OTHER = b"o" * 16 + b"-another-signing-key"


class _Planted:
    """A pickle that creates a file when loaded: its absence proves nothing was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


@pytest.fixture
def signed(tmp_path: Path) -> Iterator[durably.DiskStore]:
    store = durably.DiskStore(tmp_path / "s")
    durably.configure(store=store, key=KEY)
    yield store
    durably.configure()
    store.close()


def _index(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "cache" / "cache.db", isolation_level=None)


def _journal(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "journal.sqlite3", isolation_level=None)


def _tasks(calls: list[Any]) -> tuple[Any, Any, Any]:
    @durably.task(name="double")
    def double(x: int) -> int:
        calls.append(("double", x))
        return 2 * x

    @durably.task(cache=False, name="send")
    def send(x: int) -> int:
        calls.append(("send", x))
        return x

    @durably.entrypoint(name="flow")
    def flow(x: int) -> int:
        return send(double(x))

    return double, send, flow


# -- signing -----------------------------------------------------------------------------------
def test_every_stored_value_is_signed(signed: durably.DiskStore) -> None:
    calls: list[Any] = []
    _, _, flow = _tasks(calls)
    assert flow(3) == 6 and signed.signed
    with _index(signed.path) as con:
        values = [v for (v,) in con.execute("SELECT value FROM Cache")]
    with _journal(signed.path) as con:
        blobs = [b for (b,) in con.execute("SELECT result FROM steps WHERE result IS NOT NULL")]
        blobs += [b for row in con.execute("SELECT args, result FROM runs") for b in row]
    assert values and blobs
    assert all(bytes(v[:4]) in (b"DRS1", b"DRS2") for v in values + blobs)
    assert flow(3) == 6 and calls == [("double", 3), ("send", 6)]


@pytest.mark.parametrize("forgery", ["unsigned", "bad signature", "another key"])
def test_a_tampered_cache_entry_is_rejected_recomputed_and_never_loaded(
        signed: durably.DiskStore, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        forgery: str) -> None:
    calls: list[Any] = []
    double, _, _ = _tasks(calls)
    assert double(4) == 8
    planted = tmp_path / "planted"
    payload = pickle.dumps(_Planted(planted))
    fake = {
        "unsigned": seal(payload),  # a valid checksum, no signature
        "bad signature": seal(payload, SigningKey(b"x" * 32, "forger"))[:12]
        + SigningKey(KEY, "").id + seal(payload, SigningKey(b"x" * 32, "forger"))[20:],
        "another key": seal(payload, SigningKey(OTHER, "other"), b"cache\x00"
                            + double.cache_key(4).encode()),
    }[forgery]
    with _index(signed.path) as con:
        con.execute("UPDATE Cache SET value=? WHERE key=?", (fake, double.cache_key(4)))
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert double(4) == 8
    assert not planted.exists() and calls == [("double", 4), ("double", 4)]
    reason = {"unsigned": "not signed", "bad signature": "does not match",
              "another key": "another key"}[forgery]
    assert reason in caplog.text and double.cache_key(4) in caplog.text
    assert len(list((signed.path / "damaged").iterdir())) == 1


def test_a_signed_entry_moved_to_another_key_is_rejected(signed: durably.DiskStore) -> None:
    calls: list[Any] = []
    double, _, _ = _tasks(calls)
    double(1), double(2)
    with _index(signed.path) as con:
        (one,) = con.execute("SELECT value FROM Cache WHERE key=?",
                             (double.cache_key(1),)).fetchone()
        con.execute("UPDATE Cache SET value=? WHERE key=?", (one, double.cache_key(2)))
    calls.clear()
    assert double(2) == 4 and calls == [("double", 2)]  # not 2: the entry of double(1)


def test_a_tampered_journal_value_is_never_loaded(signed: durably.DiskStore, tmp_path: Path
                                                  ) -> None:
    calls: list[Any] = []
    _, _, flow = _tasks(calls)
    run = flow.run(5)
    planted = tmp_path / "planted"
    evil = seal(pickle.dumps(_Planted(planted)))
    with _journal(signed.path) as con:
        con.execute("UPDATE steps SET result=? WHERE run_id=? AND task='send'", (evil, run.id))
    calls.clear()
    with pytest.raises(durably.CorruptJournalError, match="not signed") as info:
        flow(5)
    assert run.id in str(info.value) and not planted.exists() and calls == []
    # a cacheable step's forged result is recomputed instead (a miss, never loaded)
    with _journal(signed.path) as con:
        con.execute("UPDATE steps SET result=? WHERE run_id=? AND task='double'", (evil, run.id))
    signed.repair_run(run.id)
    signed.cache.clear()
    assert flow(5) == 10 and not planted.exists()
    assert calls == [("double", 5), ("send", 10)]


def test_large_values_are_signed_end_to_end(signed: durably.DiskStore, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(_serde, "SPILL_BYTES", 100_000)
    calls: list[int] = []

    @durably.task(name="blob")
    def blob(n: int) -> bytes:
        calls.append(n)
        return bytes(n)

    @durably.entrypoint(name="holder")
    def holder(n: int) -> int:
        return len(blob(n))

    run = holder.run(300_000)
    [cached] = sorted((signed.path / "cache").glob("*/*/*.val"))
    [kept] = sorted((signed.path / "blobs").iterdir())
    assert cached.read_bytes()[:4] == b"DRL2" and os.path.samefile(cached, kept)
    # rewrite the content with a consistent unkeyed checksum: only the signature can tell
    import xxhash

    forged = bytes([1]) * 300_000 + cached.read_bytes()[64 + 300_000:]
    forged_pickle = cached.read_bytes()[64:].replace(bytes(300_000), bytes([1]) * 300_000)
    head = bytearray(cached.read_bytes()[:64])
    head[4:20] = xxhash.xxh3_128_digest(forged_pickle)
    del forged
    cached.unlink()  # the cache's link; the journal's keeps the real value
    cached.write_bytes(bytes(head) + forged_pickle)
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert blob(300_000) == bytes(300_000)
    assert "does not match" in caplog.text and calls == [300_000, 300_000]
    assert holder.run(300_000).id == run.id and calls == [300_000, 300_000]  # journal sound
    # the journal's blob file replaced: rejected, and (a cacheable step) recomputed
    [kept] = sorted((signed.path / "blobs").iterdir())
    data = kept.read_bytes()
    kept.unlink()
    kept.write_bytes(data[:64] + forged_pickle)
    signed.cache.clear()
    calls.clear()
    assert holder(300_000) == 300_000 and calls == [300_000]


def test_without_a_key_a_signed_store_is_read_on_its_checksums(tmp_path: Path) -> None:
    calls: list[Any] = []
    double, _, flow = _tasks(calls)
    store = durably.DiskStore(tmp_path / "s", key=KEY)
    durably.configure(store=store)
    flow(2)
    store.close()
    durably.configure(store=durably.DiskStore(tmp_path / "s"))  # no key anywhere
    calls.clear()
    assert flow(2) == 4 and double(2) == 4 and calls == []


def test_turning_signing_on_recomputes_unsigned_entries(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[Any] = []
    double, _, _ = _tasks(calls)
    durably.configure(store=durably.DiskStore(tmp_path / "s"))
    double(7)
    durably.configure(key=KEY)  # the store is the same; its entries were never signed
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert double(7) == 14
    assert calls == [("double", 7), ("double", 7)] and "not signed" in caplog.text
    assert double(7) == 14 and len(calls) == 2


# -- where the key comes from ------------------------------------------------------------------
def _key_id_of(store: durably.DiskStore) -> bytes:
    store.cache_put("probe", b"v")
    with _index(store.path) as con:
        (value,) = con.execute("SELECT value FROM Cache WHERE key='probe'").fetchone()
    return bytes(value[12:20])


def test_key_sources_and_their_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_bytes(OTHER + b"\n")
    keyfile.chmod(0o600)
    ids = {k: SigningKey(k, "").id for k in (KEY, OTHER, b"e" * 20)}
    monkeypatch.setenv("DURABLY_KEY_FILE", str(keyfile))
    assert _key_id_of(durably.DiskStore(tmp_path / "a")) == ids[OTHER]
    monkeypatch.setenv("DURABLY_KEY", "e" * 20)
    assert _key_id_of(durably.DiskStore(tmp_path / "b")) == ids[b"e" * 20]
    durably.configure(key=KEY)
    assert _key_id_of(durably.DiskStore(tmp_path / "c")) == ids[KEY]
    assert _key_id_of(durably.DiskStore(tmp_path / "d", key=OTHER)) == ids[OTHER]
    durably.configure()
    monkeypatch.delenv("DURABLY_KEY")
    monkeypatch.delenv("DURABLY_KEY_FILE")
    store = durably.DiskStore(tmp_path / "e")
    assert not store.signed


@pytest.mark.parametrize("mode", [0o644, 0o622, 0o660])
def test_a_key_file_others_can_read_or_change_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_bytes(KEY)
    keyfile.chmod(mode)
    monkeypatch.setenv("DURABLY_KEY_FILE", str(keyfile))
    store = durably.DiskStore(tmp_path / "s")
    with pytest.raises(durably.StoreError, match="chmod 600") as info:
        store.cache_get("k")
    assert str(keyfile) in str(info.value) and f"{mode:#o}" in str(info.value)
    keyfile.chmod(0o640)  # readable by a group that shares the store: accepted
    assert durably.DiskStore(tmp_path / "s").signed


# -- who may write the store -------------------------------------------------------------------
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o703])
def test_a_store_others_can_write_is_refused_unless_shared_on_purpose(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        mode: int) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(mode)
    if mode & 0o070 and hasattr(os, "geteuid") and os.geteuid() == 0:
        os.chown(root, 0, 65534)  # a group other users are in (not the user's own group)
    with pytest.raises(durably.StoreError, match="refusing the store") as info:
        durably.DiskStore(root).cache_put("k", b"v")
    message = str(info.value)
    assert str(root) in message and f"{mode:#o}" in message and "chmod 700" in message
    assert "allow_shared=True" in message and "DURABLY_ALLOW_SHARED=1" in message
    assert sorted(root.iterdir()) == []  # nothing written
    with caplog.at_level(logging.WARNING, logger="durably"):
        shared = durably.DiskStore(root, allow_shared=True)
        shared.cache_put("k", b"v")
    assert shared.cache_get("k") == b"v" and "no signing key" in caplog.text
    monkeypatch.setenv("DURABLY_ALLOW_SHARED", "1")
    assert durably.DiskStore(root).cache_get("k") == b"v"


def test_a_group_writable_store_of_the_users_own_group_is_private(tmp_path: Path) -> None:
    import grp
    import pwd

    me = pwd.getpwuid(os.getuid())
    try:
        own = grp.getgrgid(me.pw_gid)
    except KeyError:
        pytest.skip("this user's group has no name")
    if own.gr_name != me.pw_name or set(own.gr_mem) - {me.pw_name}:
        pytest.skip("this system does not give each user a private group")
    root = tmp_path / "mine"
    root.mkdir()
    root.chmod(0o770)  # umask 002 on systems with user private groups
    os.chown(root, os.getuid(), me.pw_gid)
    durably.DiskStore(root).cache_put("k", b"v")


def test_a_store_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("only root can give a directory to another user")
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(durably.StoreError, match="belongs to user"):
        durably.DiskStore(root).cache_get("k")
    assert durably.DiskStore(root, allow_shared=True).cache_get("k") is None


def test_the_store_directory_is_private(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "new" / "store")
    store.cache_put("k", b"v" * 100_000)
    assert stat.S_IMODE((tmp_path / "new" / "store").stat().st_mode) == 0o700


# -- journals from before format 3 -------------------------------------------------------------
def test_a_format_2_journal_is_sealed_and_signed_on_upgrade(tmp_path: Path) -> None:
    root = tmp_path / "old"
    store = durably.DiskStore(root)
    assert store.list_runs() == []  # creates the journal
    store.close()
    with _journal(root) as con:  # make it what durably wrote last week: format 2, raw pickles
        con.execute("DROP INDEX runs_by_thread")  # (format 8's)
        con.execute("ALTER TABLE runs DROP COLUMN thread")
        con.execute("ALTER TABLE keys DROP COLUMN duration")  # (format 8's too)
        con.execute("ALTER TABLE steps DROP COLUMN saved")
        con.execute("INSERT INTO runs VALUES ('r', 'm:ep', 'ep', 'finished', 1, 1, 1, 'd', ?, ?, "
                    "NULL)", (pickle.dumps(((1,), {})), pickle.dumps(7)))
        con.execute("INSERT INTO steps (run_id, attempt, position, step_id, task, status, "
                    "started, ended, cache_key, result) VALUES ('r', 1, 0, 's', 't', 'ran', 1, 2, "
                    "'k', ?)", (pickle.dumps("step result"),))
        con.execute("PRAGMA user_version=2")
    store = durably.DiskStore(root, key=KEY)
    assert _serde.loads(store.find_step("r", "s")) == "step result"
    rec = store.find_run("r")
    assert rec is not None and _serde.loads(rec.result) == 7
    assert _serde.loads(rec.args) == ((1,), {})
    with _journal(root) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT
        (blob,) = con.execute("SELECT result FROM steps").fetchone()
    assert open_seal(blob, SigningKey(KEY, ""), b"step\x00r\x00s")[0] == pickle.dumps(
        "step result")
    store.close()


def test_a_store_from_someone_else_opened_with_your_key_unpickles_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every blob of a store replaced by a pickle that would create a file when loaded: with a
    key of your own, reading runs, events, history and calling the tasks loads none of them."""
    root = tmp_path / "theirs"
    calls: list[Any] = []
    double, _, flow = _tasks(calls)

    @durably.task(name="ask")
    def ask(x: int) -> str:
        return str(durably.interrupt(f"ok {x}?"))

    @durably.entrypoint(name="asking")
    def asking(x: int) -> str:
        return ask(x)

    durably.configure(store=durably.DiskStore(root))
    flow.run(3)
    waiting = asking.run(1)
    asking.resume(waiting.id, "yes")
    durably.configure()
    planted = tmp_path / "planted"
    evil = seal(pickle.dumps(_Planted(planted)))
    with _journal(root) as con:
        con.execute("UPDATE steps SET result=? WHERE result IS NOT NULL", (evil,))
        con.execute("UPDATE runs SET args=?, result=?", (evil, evil))
        con.execute("UPDATE events SET data=? WHERE data IS NOT NULL", (evil,))
    with _index(root) as con:
        con.execute("UPDATE Cache SET value=?", (evil,))
    durably.configure(store=durably.DiskStore(root), key=KEY)
    with caplog.at_level(logging.WARNING, logger="durably"):
        for r in durably.list_runs():
            r.events(), r.history(), r.steps
            with pytest.raises(durably.DurablyError):
                r.result  # noqa: B018
        with pytest.raises(durably.CorruptJournalError):
            flow(3)
        with pytest.raises(durably.CorruptJournalError):
            asking.resume(waiting.id, "again")
        assert double(3) == 6
    assert not planted.exists()
    assert "not signed" in caplog.text  # the cache entry of double(3), set aside



@durably.task(name="team_make")
def _team_make(i: int) -> bytes:
    return bytes([i]) * (10 if i == 0 else 50_000 if i == 1 else 300_000)


@durably.entrypoint(name="team_job")
def _team_job(n: int) -> int:
    return sum(len(_team_make(i)) for i in range(n))


def _as_member(uid: int, group: int, env: dict[str, str], n: int) -> tuple[int, str]:
    """Run the team's job as user ``uid`` of ``group`` in a forked process (everything is
    imported already: the interpreter's own files may not be readable by that user);
    returns (the result, what it logged)."""
    import grp  # noqa: F401 - imported before the fork, as the member may not read them
    import logging as logs
    import pwd  # noqa: F401
    import sys

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the member
        code = 1
        try:
            os.close(read)
            os.setgroups([group])
            os.setgid(group)
            os.setuid(uid)
            os.environ.update(env)
            handler = logs.StreamHandler(os.fdopen(write, "w", buffering=1))
            logs.getLogger("durably").addHandler(handler)
            durably.configure(store=durably.DiskStore())
            _serde.SPILL_BYTES = 100_000
            handler.stream.write(f"result {_team_job.run(n, fresh=True).result}\n")
            code = 0
        except BaseException as exc:  # noqa: BLE001 - report it to the parent
            os.write(write, f"error {type(exc).__name__}: {exc}\n".encode())
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, out
    result = int(out.strip().splitlines()[-1].split()[1])
    return result, out


def test_the_readme_recipe_shares_a_store_between_two_users(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real users of one group share a store with a group key, as the README says: each
    loads what the other wrote, and the store stays sound."""
    import secrets
    import shutil
    import tempfile

    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("only root can become two users")
    group = 4242
    team = Path(tempfile.mkdtemp(prefix="durably-team-", dir="/tmp"))
    try:
        team.chmod(0o755)
        key = team / "durably.key"
        key.write_text(secrets.token_hex(32) + "\n")
        os.chown(key, 0, group)
        key.chmod(0o640)
        store = team / "store"
        store.mkdir()
        os.chown(store, 0, group)
        store.chmod(0o2770)
        env = {"DURABLY_DIR": str(store), "DURABLY_KEY_FILE": str(key),
               "DURABLY_ALLOW_SHARED": "1"}
        monkeypatch.setattr(_serde, "SPILL_BYTES", 100_000)  # warm every lazy import up
        durably.configure(store=durably.DiskStore(tmp_path / "warm-up", key=KEY))
        _team_job.run(4)
        durably.configure()
        sizes = [10, 50_000, 300_000, 300_000]
        # "nobody" creates the store's files; a second user (uid 4243) reuses them and adds a
        # value; nobody reuses that one: every value is loaded across users
        assert _as_member(65534, group, env, 3)[0] == sum(sizes[:3])
        result, log = _as_member(4243, group, env, 4)
        assert result == sum(sizes) and "damaged" not in log and "refus" not in log
        result, log = _as_member(65534, group, env, 4)
        assert result == sum(sizes) and "damaged" not in log
        for m in (store / "journal.sqlite3", store / "cache" / "cache.db"):
            assert m.stat().st_mode & 0o060 == 0o060, m  # the group can write the databases
        reader = durably.DiskStore(store, key=key.read_text().strip(), allow_shared=True)
        runs = reader.list_runs()
        assert len(runs) == 3 and {r.status for r in runs} == {"finished"}
        steps = [s.status for r in runs for s in reader.list_steps(r.run_id)]
        assert steps.count("ran") == 4 and steps.count("cached") == 7
        assert not (store / "damaged").exists()
        reader.close()
    finally:
        shutil.rmtree(team, ignore_errors=True)


@given(st.binary(max_size=200), st.integers(0, 250), st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_short_path_opens_exactly_what_open_seal_opens_without_a_key(
        payload: bytes, flip: int, signed: bool) -> None:
    """open_plain (a replayed step's result) answers as open_seal without a key does for a
    value sealed without a key, damaged or not; for a signed value it defers to open_seal."""
    from durably._store.integrity import key_from, open_plain, open_seal, seal

    data = bytearray(seal(payload, key_from(b"k" * 32, "a test")) if signed else seal(payload))
    if flip < len(data):
        data[flip] ^= 0x01
    sealed = bytes(data)
    short = open_plain(sealed)
    full, _ = open_seal(sealed)
    if short is not None:
        assert short == full
    else:
        assert signed or full is None


def test_a_store_refuses_another_key_than_its_values_are_signed_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store keeps the id of the first key that opened it (its KEY_ID file: a hash of
    the key, never the key); a process with another key is refused when the store opens,
    or when the key is configured after, with a StoreError naming the store and where the
    key came from. A store made without a key takes the first key that opens it; one
    opened without a key checks nothing (a private store is read on its checksums)."""
    calls: list[Any] = []
    double, _, flow = _tasks(calls)
    root = tmp_path / "s"
    store = durably.DiskStore(root)  # made without a key: no key id yet
    durably.configure(store=store)
    assert double(3) == 6
    store.close()
    assert not (root / "KEY_ID").exists()
    keyed = durably.DiskStore(root, key=KEY)
    durably.configure(store=keyed)
    keyed.path_checked()
    assert (root / "KEY_ID").read_text().strip() == SigningKey(KEY, "").id.hex()
    assert KEY.decode() not in (root / "KEY_ID").read_text()
    assert flow(2) == 4
    keyed.close()
    keyfile = tmp_path / "wrong.key"
    keyfile.write_bytes(OTHER)
    keyfile.chmod(0o600)
    monkeypatch.setenv("DURABLY_KEY_FILE", str(keyfile))
    wrong = durably.DiskStore(root)
    durably.configure(store=wrong)
    calls.clear()
    with pytest.raises(durably.StoreError) as refused:
        flow(2)
    said = str(refused.value)
    assert str(root) in said and "signed with another key" in said, said
    assert f"DURABLY_KEY_FILE ({keyfile})" in said and "durably.configure(key=" in said, said
    assert calls == []  # nothing executed
    wrong.close()
    # the right key, configured in code, comes before the file: opens
    durably.configure(store=durably.DiskStore(root), key=KEY)
    assert flow(2) == 4 and calls == []
    # another key configured once the store is open: refused at its next use
    durably.configure(key=OTHER)
    with pytest.raises(durably.StoreError, match="signed with another key"):
        double(2)
    monkeypatch.delenv("DURABLY_KEY_FILE")
    durably.configure(key=None)
    assert flow(2) == 4 and calls == []  # without a key: read on its checksums
    durably.configure()


def test_a_process_that_cannot_read_a_finished_run_leaves_its_record_as_it_was(
        tmp_path: Path) -> None:
    """A finished run whose side effect's (cache=False) journaled value is damaged: a call
    that replays it raises CorruptJournalError, and the run stays finished with its one
    attempt (a process that cannot read a run changes nothing of it; it was turned into
    failed, one attempt more each call)."""
    from durably.exceptions import CorruptJournalError

    done: list[int] = []

    @durably.task(cache=False)
    def send(n: int) -> int:
        done.append(n)
        return n * 2

    @durably.entrypoint
    def job(n: int) -> int:
        return send(n) + 1

    store = durably.DiskStore(tmp_path / "s", key=KEY)
    durably.configure(store=store)
    assert job.run(4, run_id="shared").result == 9
    with _journal(store.path) as con:
        con.execute("UPDATE steps SET result=? WHERE run_id='shared'", (seal(b"garbage"),))
    for _ in range(2):
        with pytest.raises(CorruptJournalError) as caught:
            job.run(4, run_id="shared")
        assert any("journaled nothing" in note for note in caught.value.__notes__)
        run = durably.get_run("shared")
        assert (run.status, run.attempt, run.result) == ("finished", 1, 9)
    assert [r.status for r in durably.list_runs()] == ["finished"] and done == [4]
    durably.configure()
    store.close()
