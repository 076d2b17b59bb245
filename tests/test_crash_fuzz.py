"""Crash fuzzing: real processes killed with SIGKILL at random moments, then resumed.

Three driver processes (run in parallel) each import durably once and, for every trial, fork a
child that runs a pipeline on a fresh store and kills itself — inside a task body, between
tasks, inside a journal write (a SQLite progress handler fires mid-statement), right after a
journal commit, inside a cache write (SQLite or a value file half written), inside the spill
of a large value, or from a timer thread at a random instant. Forked children again resume the
run (sometimes killed again) until one finishes. After every trial the driver checks:

- the store opens and the final result is correct;
- no journaled step executed again: no task body ran in an attempt after the one whose
  journal row recorded it, nor twice in one attempt;
- every ``cache=False`` side effect has one idempotency key, and ran again only when the kill
  fell inside its window (after its body, before its journal commit: the documented case);
- every journaled value and cache entry is sound; nothing was found damaged.

The figures (trials, kills by phase, double executions) are printed and asserted. Set
``DURABLY_FUZZ_TRIALS`` / ``DURABLY_FUZZ_SEED`` to run more trials or replay a seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from .conftest import script_env, write_script

pytestmark = pytest.mark.slow

#: drivers run at once: each child spends much of its time waiting on the filesystem
#: (creating a store), so three keep two cores busy
DRIVERS = 3

DRIVER = r'''
import json, logging, os, random, signal, sqlite3, sys, threading, time, traceback
from collections import Counter
import durably
from durably._store.disk import blobs as _blobs
from durably._keys import serde as _serde
from durably._runtime.context import current_run

BASE, TRIALS, SEED, WORKER = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
N = 8
SIZES = {0: 100, 1: 40_000, 2: 100, 3: 200_000}  # inline, value file, inline, spilled
_serde.SPILL_BYTES = 150_000
EXPECTED = sum(SIZES[i % 4] + i for i in range(N))
PHASE, FILES = ["starting"], {}  # PHASE is state (the tasks change it): not in their keys


def plan():
    """This attempt's kill plan. It lives in the environment: a module-level dict the tasks
    read would be configuration, part of their cache keys (and differ per attempt)."""
    return json.loads(os.environ.get("FUZZ_PLAN") or "{}")

KINDS = ["task", "side window", "between", "journal", "cache sql", "cache file", "spill",
         "timer", "timer", "timer"]


def die(phase):
    fd = os.open(FILES["kill"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, phase.encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def mark(line):
    fd = os.open(FILES["marks"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, (line + "\n").encode())
    os.close(fd)


def attempt():
    ctx = current_run.get()
    return ctx.attempt if ctx is not None else 0


@durably.task(name="work")
def work(i):
    PHASE[0] = "task body"
    mark(f"work {i} {attempt()}")
    if plan().get("kind") == "task" and plan()["at"] == i:
        die("task body")
    return bytes([i]) * SIZES[i % 4]


@durably.task(cache=False, name="side")
def side(i):
    PHASE[0] = "task body"
    mark(f"side {i} {attempt()} {durably.idempotency_key()}")
    if plan().get("kind") == "side window" and plan()["at"] == i:
        die("side effect done, not yet journaled")
    return i


@durably.entrypoint(name="pipeline")
def pipeline(n):
    total = 0
    for i in range(n):
        PHASE[0] = "between tasks"
        if plan().get("kind") == "between" and plan()["at"] == i:
            die("between tasks")
        total += len(work(i))
        total += side(i)
    PHASE[0] = "ending the run"
    return total


def hooks(store, rng):
    PLAN = plan()
    kind = PLAN.get("kind")
    count = {"n": 0}
    if kind == "journal":
        for name in ("append_steps", "append_steps_if_current", "put_run", "put_run_if_current",
                     "append_events"):
            real = getattr(store, name)

            def wrapped(*args, _real=real, **kwargs):
                count["n"] += 1
                PHASE[0] = "inside a journal write"
                if count["n"] != PLAN["at"]:
                    return _real(*args, **kwargs)
                con = store._db()
                con.set_progress_handler(lambda: die("inside a journal write"), PLAN["ops"])
                out = _real(*args, **kwargs)
                con.set_progress_handler(None, 0)
                die("right after a journal commit")
                return out

            setattr(store, name, wrapped)
    elif kind in ("cache sql", "cache file"):
        real_put = store.cache_put_many

        def put(items):
            count["n"] += 1
            PHASE[0] = "inside a cache write"
            if count["n"] == PLAN["at"] and kind == "cache sql":
                store.cache._con.set_progress_handler(
                    lambda: die("inside a cache write (SQLite)"), PLAN["ops"])
            return real_put(items)

        store.cache_put_many = put
        real_write, real_place = _blobs._write_new, _blobs.place

        def write_half(path, data):
            if kind == "cache file":
                with open(path, "xb") as f:
                    f.write(data[: len(data) // 2])
                    f.flush()
                die("inside a cache value file write")
            return real_write(path, data)

        def place_half(src, dest):
            if kind == "cache file" and rng.random() < 0.5:
                with open(src, "rb") as r, open(dest, "xb") as w:
                    w.write(r.read(1000))
                    w.flush()
                die("inside a cache value file write")
            return real_place(src, dest)

        _blobs._write_new = write_half
        _blobs.place = place_half
    elif kind == "spill":
        real_os_write = _serde._os_write

        def os_write(fd, data):
            n = real_os_write(fd, memoryview(data)[:PLAN["ops"] * 1000])
            die("inside a large value's spill write")
            return n

        _serde._os_write = os_write
    elif kind == "timer":
        def fire():
            time.sleep(PLAN["delay"])
            die(f"timer: {PHASE[0]}")

        threading.Thread(target=fire, daemon=True).start()


def child(folder, kill_plan, rng):
    fd = os.open(folder + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    try:
        os.environ["FUZZ_PLAN"] = json.dumps(kill_plan)
        FILES.update(kill=folder + ".kill", marks=folder + ".marks")
        store = durably.DiskStore(folder + "/store")
        durably.configure(store=store)
        PHASE[0] = "opening the store or starting the run"
        hooks(store, rng)
        result = pipeline(N)
        with open(folder + ".result", "w") as f:
            f.write(str(result))
        os._exit(0)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def plan_for(rng):
    kind = rng.choice(KINDS)
    at = {"journal": rng.randrange(1, 21), "cache sql": rng.randrange(1, 3)}.get(
        kind, rng.randrange(N))
    return {"kind": kind, "at": at,
            "ops": rng.choice((rng.randrange(1, 60), rng.randrange(60, 600))),
            "delay": rng.uniform(0.0, 0.12)}


def check(folder, stats):
    """What the trial left: the figures, or the list of what went wrong."""
    problems = []
    result = open(folder + ".result").read()
    if result != str(EXPECTED):
        problems.append(f"result {result} != {EXPECTED}")
    log = open(folder + ".log").read() if os.path.exists(folder + ".log") else ""
    if "damaged" in log or "Traceback" in log or "cannot be trusted" in log:
        problems.append("log: " + log[-2000:])
    marks = [line.split() for line in open(folder + ".marks").read().splitlines()]
    con = sqlite3.connect(f"file:{folder}/store/journal.sqlite3?mode=ro", uri=True)
    finished = {}
    for task, inputs, status, att in con.execute(
            "SELECT task, inputs, status, attempt FROM steps WHERE status IN ('ran', 'cached')"):
        finished.setdefault((task, int(inputs.split("=")[1])), []).append(att)
    con.close()
    for (task, i), atts in finished.items():
        if len(atts) != 1:
            problems.append(f"{task}({i}) has {len(atts)} finished journal rows")
    seen, keys = Counter(), {}
    for m in marks:
        task, i, att = m[0], int(m[1]), int(m[2])
        seen[(task, i, att)] += 1
        if seen[(task, i, att)] > 1:
            problems.append(f"{task}({i}) executed twice in attempt {att}")
            stats["double"] += 1
        journaled = finished.get((task, i), [None])[0]
        if journaled is None:
            problems.append(f"{task}({i}) never journaled")
        elif att > journaled:
            problems.append(f"{task}({i}) executed in attempt {att} after being journaled "
                            f"in attempt {journaled}")
            stats["double"] += 1
        if task == "side":
            keys.setdefault(i, set()).add(m[3])
    for i in range(N):
        runs_of_side = sum(1 for m in marks if m[0] == "side" and int(m[1]) == i)
        stats["side effects"] += 1
        stats["side effects repeated in their window"] += runs_of_side - 1
        if len(keys.get(i, ())) != 1:
            problems.append(f"side({i}) had idempotency keys {keys.get(i)}")
    works = [int(m[1]) for m in marks if m[0] == "work"]
    stats["bodies re-run before being journaled"] += len(works) - len(set(works))
    store = durably.DiskStore(folder + "/store")
    try:
        keys_in_cache = [k for (k,) in store.cache._sql("SELECT key FROM Cache").fetchall()]
        # opening the store removed what killed processes left in tmp/: nothing else remains
        if os.listdir(folder + "/store/tmp") if os.path.exists(folder + "/store/tmp") else []:
            problems.append("stale temporary files: " + str(os.listdir(folder + "/store/tmp")))
        for key in keys_in_cache:
            data = store.cache_get(key)
            if data is None:
                problems.append(f"cache entry {key} unreadable")
            else:
                _serde.loads(data)
        for s in store.list_steps(store.list_runs()[0].run_id):
            if s.status in ("ran", "cached"):
                _serde.loads(store.find_step(s.run_id, s.step_id))
        if os.path.exists(folder + "/store/damaged"):
            problems.append("damaged entries: " + str(os.listdir(folder + "/store/damaged")))
    finally:
        store.close()
    return problems


def main():
    stats = {"double": 0, "side effects": 0, "side effects repeated in their window": 0,
             "bodies re-run before being journaled": 0}
    phases, problems = {}, []
    trials = kills = attempts = 0
    for trial in range(TRIALS):
        rng = random.Random(SEED * 1_000_003 + trial)
        folder = f"{BASE}/{WORKER}-{trial}"
        os.makedirs(folder, exist_ok=True)
        trial_kills = 0
        while True:
            attempts += 1
            kill_plan = plan_for(rng) if trial_kills == 0 or (
                trial_kills < 4 and rng.random() < 0.5) else {}
            pid = os.fork()
            if pid == 0:
                child(folder, kill_plan, rng)
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                phase = open(folder + ".kill").read()
                phases[phase] = phases.get(phase, 0) + 1
                kills += 1
                trial_kills += 1
                continue
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                break
            problems.append(f"trial {trial}: attempt exited with {status}: "
                            + open(folder + ".log").read()[-3000:])
            break
        trials += 1
        if not os.path.exists(folder + ".result"):
            continue
        found = check(folder, stats)
        problems.extend(f"trial {trial} (seed {SEED}): {p}" for p in found)
    print(json.dumps({"trials": trials, "kills": kills, "attempts": attempts, "phases": phases,
                      "problems": problems, **stats}))


main()
'''


def test_sigkill_at_random_moments_never_breaks_a_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trials = int(os.environ.get("DURABLY_FUZZ_TRIALS", "200"))
    seed = int(os.environ.get("DURABLY_FUZZ_SEED", "20261130"))
    script = write_script(tmp_path / "driver.py", DRIVER)
    env = script_env(tmp_path / "unused-default-store")
    started = time.perf_counter()
    parts = [trials // DRIVERS + (k < trials % DRIVERS) for k in range(DRIVERS)]
    drivers = [subprocess.Popen([sys.executable, str(script), str(tmp_path), str(n),
                                 str(seed + k), f"w{k}"], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for k, n in enumerate(parts) if n]
    outputs = []
    try:
        for d in drivers:
            out, err = d.communicate(timeout=600)
            assert d.returncode == 0, err[-4000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for d in drivers:
            if d.poll() is None:
                d.kill()
                d.communicate()
    seconds = time.perf_counter() - started
    total: Counter[str] = Counter()
    phases: Counter[str] = Counter()
    problems: list[str] = []
    for o in outputs:
        phases.update(o.pop("phases"))
        problems.extend(o.pop("problems"))
        total.update(o)
    with capsys.disabled():
        print(f"\ncrash fuzz: {total['trials']} trials, {total['kills']} SIGKILLs, "
              f"{total['attempts']} processes, {seconds:.1f} s (seed {seed})")
        for phase, n in sorted(phases.items(), key=lambda p: -p[1]):
            print(f"  {n:4d}  killed {phase}")
        print(f"  double executions of journaled steps: {total['double']}")
        print(f"  cacheable bodies run again (killed before their journal commit): "
              f"{total['bodies re-run before being journaled']}")
        print(f"  cache=False side effects: {total['side effects']}, repeated because the kill "
              f"fell after the side effect and before its journal commit: "
              f"{total['side effects repeated in their window']} (same idempotency key)")
        print(f"  problems: {len(problems)}")
        for p in problems[:10]:
            print("   ", p[:500])
    assert not problems, problems[:5]
    assert total["trials"] == trials and total["kills"] >= trials
    assert total["double"] == 0
    for where in ("task body", "between tasks", "inside a journal write",
                  "inside a cache write (SQLite)", "inside a cache value file write",
                  "inside a large value's spill write"):
        assert phases[where] > 0, (where, phases)
