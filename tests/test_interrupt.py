"""interrupt() / resume, idempotency keys, run history and fork, on every store."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import entrypoint, task
from tests.conftest import run_script, script_env, write_script

pytestmark = pytest.mark.usefixtures("store")


def _n(name: str) -> str:
    return name.rpartition(".")[2]


# -- interrupts ------------------------------------------------------------------------------
def test_interrupt_pauses_and_resume_continues_without_rerunning_finished_steps() -> None:
    ran: list[str] = []

    @task
    def draft(topic: str) -> str:
        ran.append("draft")
        return f"draft on {topic}"

    @task
    def review(text: str) -> str:
        ran.append("review")
        verdict = durably.interrupt({"please review": text})
        return f"{text} [{verdict}]"

    @entrypoint
    def pipeline(topic: str) -> str:
        return review(draft(topic))

    with pytest.raises(durably.RunInterrupted) as paused:
        pipeline("owls")
    [pending] = paused.value.interrupts
    assert pending.payload == {"please review": "draft on owls"}
    assert len(pending.id) == 16 and _n(pending.task) == "review"
    assert "pipeline.resume(" in str(paused.value) and paused.value.run_id in str(paused.value)
    run = durably.get_run(paused.value.run_id)
    assert run.status == "interrupted" and run.interrupts == [pending]
    assert ran == ["draft", "review"]

    assert pipeline.resume(paused.value.run_id, "approved") == "draft on owls [approved]"
    assert ran == ["draft", "review", "review"]  # the interrupting task runs again; draft not
    run = durably.get_run(paused.value.run_id)
    assert run.status == "finished" and run.interrupts == []
    assert [(_n(s.task), s.status) for s in run.steps] == [("draft", "replayed"),
                                                           ("review", "ran")]


def test_the_signal_is_not_swallowed_by_except_exception() -> None:
    @task
    def ask() -> str:
        try:
            return str(durably.interrupt("name?"))
        except Exception:  # noqa: BLE001 - a user's broad handler
            return "swallowed"

    @entrypoint
    def pipeline() -> str:
        try:
            return ask()
        except Exception:  # noqa: BLE001 - and another one
            return "swallowed too"

    with pytest.raises(durably.RunInterrupted):
        pipeline()


def test_run_returns_a_handle_with_status_interrupted() -> None:
    @entrypoint
    def pipeline(x: int) -> int:
        return int(durably.interrupt(f"double {x}?")) * x

    run = pipeline.run(4)
    assert run.status == "interrupted" and [i.payload for i in run.interrupts] == ["double 4?"]
    assert _n(run.interrupts[0].task) == "pipeline" and run.interrupts[0].step_id is None
    with pytest.raises(durably.RunStateError, match="interrupted"):
        _ = run.result
    assert "waiting for 1 answer" in run.summary()
    assert pipeline.resume(run.id, 2) == 8


def test_a_second_interrupt_later_in_the_run_works_the_same_way() -> None:
    @task
    def ask(question: str) -> Any:
        return durably.interrupt(question)

    @entrypoint
    def pipeline() -> tuple[Any, Any]:
        return ask("first?"), ask("second?")

    run = pipeline.run()
    assert [i.payload for i in run.interrupts] == ["first?"]
    with pytest.raises(durably.RunInterrupted) as again:
        pipeline.resume(run.id, 1)
    assert [i.payload for i in again.value.interrupts] == ["second?"]
    assert pipeline.resume(run.id, 2) == (1, 2)


def test_several_interrupts_in_one_task_are_told_apart_by_order() -> None:
    @task
    def form() -> tuple[Any, Any]:
        return durably.interrupt("name?"), durably.interrupt("age?")

    @entrypoint
    def pipeline() -> tuple[Any, Any]:
        return form()

    first = pipeline.run()
    [name] = first.interrupts
    with pytest.raises(durably.RunInterrupted) as second:
        pipeline.resume(first.id, "ada")
    assert [i.payload for i in second.value.interrupts] == ["age?"]
    assert second.value.interrupts[0].id != name.id
    assert first.refresh().interrupts == second.value.interrupts  # only age? is pending
    assert pipeline.resume(first.id, 36) == ("ada", 36)


def test_several_pending_interrupts_are_answered_by_id_and_partially() -> None:
    @task
    def ask(q: str) -> Any:
        return durably.interrupt(q)

    @entrypoint
    def pipeline() -> list[Any]:
        # two branches that both wait: collected like a parallel fan-out does
        from durably._runtime.interrupt import InterruptSignal

        found, pending = [], []
        for q in ("a?", "b?"):
            try:
                found.append(ask(q))
            except InterruptSignal as signal:
                pending.extend(signal.interrupts)
        if pending:
            raise InterruptSignal(pending)
        return found

    run = pipeline.run()
    a, b = run.interrupts
    with pytest.raises(durably.RunStateError, match="cannot say which"):
        pipeline.resume(run.id, "x")
    with pytest.raises(durably.RunStateError, match="not an interrupt of this run"):
        pipeline.resume(run.id, {"0123456789abcdef": 1})
    with pytest.raises(durably.RunInterrupted) as rest:
        pipeline.resume(run.id, {a.id: "A"})
    assert [i.payload for i in rest.value.interrupts] == ["b?"]
    assert pipeline.resume(run.id, {b.id: "B"}) == ["A", "B"]


def test_resume_of_a_run_that_is_not_interrupted_says_its_status() -> None:
    @entrypoint
    def pipeline(x: int) -> int:
        return x

    run = pipeline.run(1)
    with pytest.raises(durably.RunStateError, match="is finished, not interrupted"):
        pipeline.resume(run.id, "yes")
    with pytest.raises(durably.NotFoundError):
        pipeline.resume("no-such-run", "yes")
    with pytest.raises(durably.DefinitionError):
        pipeline.resume("bad id!", "yes")


def test_answers_are_journaled_before_the_run_continues() -> None:
    fail = [True]

    @task
    def after(answer: str) -> str:
        if fail[0]:
            raise RuntimeError("crash after the answer")
        return answer.upper()

    @entrypoint
    def pipeline() -> str:
        return after(str(durably.interrupt("word?")))

    run = pipeline.run()
    with pytest.raises(RuntimeError):
        pipeline.resume(run.id, "kept")
    fail[0] = False
    assert pipeline() == "KEPT"  # a plain rerun finds the journaled answer


def test_a_task_that_asked_a_person_is_never_served_from_the_cache() -> None:
    @task
    def decide(q: str) -> Any:
        return durably.interrupt(q)

    @task
    def around(q: str) -> Any:
        return ("around", decide(q))

    @entrypoint
    def agent(q: str) -> Any:
        return around(q)

    first = agent.run("go?")
    assert agent.resume(first.id, "left") == ("around", "left")
    other = agent.run("go?", fresh=True)  # a new run asks again
    assert other.status == "interrupted"
    assert agent.resume(other.id, "right") == ("around", "right")


def test_interrupt_outside_a_run_says_so() -> None:
    with pytest.raises(durably.NoActiveRunError, match="outside a run"):
        durably.interrupt("hello?")

    @task
    def lonely() -> Any:
        return durably.interrupt("anyone?")

    with pytest.raises(durably.NoActiveRunError):
        lonely()


def test_async_entrypoint_interrupt_and_resume() -> None:
    @task
    async def ask(q: str) -> Any:
        await asyncio.sleep(0)
        return durably.interrupt(q)

    @entrypoint
    async def pipeline(q: str) -> Any:
        return await ask(q)

    run = asyncio.run(pipeline.run("ok?"))
    assert run.status == "interrupted"
    assert asyncio.run(pipeline.resume(run.id, "yes")) == "yes"


def test_resume_from_another_process(tmp_path: Path) -> None:
    script = write_script(tmp_path / "approval.py", """
        import sys
        import durably

        @durably.task
        def draft(topic):
            print("drafting", flush=True)
            return f"draft on {topic}"

        @durably.task
        def approve(text):
            return durably.interrupt({"approve?": text})

        @durably.entrypoint
        def flow(topic):
            return draft(topic) + " -> " + str(approve(draft(topic)))

        if __name__ == "__main__":
            if sys.argv[1:] == []:
                try:
                    flow("owls")
                except durably.RunInterrupted as paused:
                    print("PAUSED", paused.run_id, paused.interrupts[0].payload)
            else:
                print("RESULT", flow.resume(sys.argv[1], sys.argv[2]))
    """)
    env = script_env(tmp_path / "store")
    first = run_script(script, env).stdout
    assert "drafting" in first and "PAUSED" in first
    run_id = first.split("PAUSED ")[1].split()[0]
    import subprocess
    import sys

    second = subprocess.run([sys.executable, str(script), run_id, "yes"], env=env,
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "drafting" not in second.stdout  # replayed from the journal
    assert "RESULT draft on owls -> yes" in second.stdout


def test_resume_after_a_resume_that_crashed_says_to_call_the_entrypoint(
        tmp_path: Path) -> None:
    """A resume killed after its answer was journaled leaves the run crashed, not waiting:
    resume() again says so and how to continue; calling the entrypoint again continues it
    with the recorded answer."""
    script = write_script(tmp_path / "approval.py", """
        import os, signal, sys
        import durably

        @durably.task
        def publish(answer):
            if os.environ.get("CRASH"):
                os.kill(os.getpid(), signal.SIGKILL)  # the resume dies here
            return f"published ({answer})"

        @durably.entrypoint
        def flow(topic):
            return publish(durably.interrupt(f"publish {topic}?"))

        if __name__ == "__main__":
            if sys.argv[1] == "start":
                print("PAUSED", flow.run("owls").id)
            elif sys.argv[1] == "resume":
                flow.resume(sys.argv[2], "yes")
            else:
                try:
                    flow.resume(sys.argv[2], "yes")
                except durably.RunStateError as exc:
                    print("REFUSED", exc)
                print("RESULT", flow("owls"), durably.get_run(sys.argv[2]).status)
    """)
    env = script_env(tmp_path / "store")
    import subprocess
    import sys

    def call(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    run_id = call("start").stdout.split("PAUSED ")[1].split()[0]
    killed = call("resume", run_id, CRASH="1")
    assert killed.returncode == -9, killed.stderr
    again = call("again", run_id)
    assert again.returncode == 0, again.stderr
    assert f"REFUSED run {run_id!r} crashed" in again.stdout
    assert "call the entrypoint again" in again.stdout
    assert "RESULT published (yes) finished" in again.stdout


# -- idempotency keys ------------------------------------------------------------------------
def test_idempotency_key_is_stable_across_resume_and_differs_per_step() -> None:
    keys: list[str] = []

    @task(cache=False)
    def charge(amount: int) -> int:
        keys.append(durably.idempotency_key())
        if durably.interrupt("confirm?") != "yes":
            return 0
        return amount

    @task(cache=False)
    def refund(amount: int) -> str:
        return durably.idempotency_key()

    @entrypoint
    def checkout(amount: int) -> tuple[int, str]:
        return charge(amount), refund(amount)

    run = checkout.run(10)
    total, other = checkout.resume(run.id, "yes")
    assert total == 10 and len(keys) == 2 and keys[0] == keys[1] and other != keys[0]

    @entrypoint
    def body_only() -> str:
        return durably.idempotency_key()

    with pytest.raises(durably.NoActiveRunError, match=r"inside the @durably\.task"):
        body_only()


# -- history and fork ------------------------------------------------------------------------
def _pipeline(calls: list[str], flavour: list[str]) -> Any:
    @task
    def research(topic: str) -> str:
        calls.append("research")
        return f"notes on {topic}"

    @task
    def write(notes: str) -> str:
        calls.append("write")
        return f"{flavour[0]} essay from {notes}"

    @task
    def publish(text: str) -> str:
        calls.append("publish")
        return text.upper()

    @entrypoint
    def blog(topic: str) -> str:
        return publish(write(research(topic)))

    return blog


def test_history_lists_checkpoints_newest_first() -> None:
    blog = _pipeline([], ["dull"])
    run = blog.run("owls")
    history = run.history()
    assert [(c.kind, _n(c.task), c.steps_done) for c in history] == [
        ("step", "publish", 3), ("step", "write", 2), ("step", "research", 1)]
    assert history[-1].state == "'notes on owls'" and len(history[0].id) == 32
    assert history[0].time >= history[-1].time


def test_fork_replays_up_to_the_checkpoint_and_executes_the_rest() -> None:
    calls: list[str] = []
    flavour = ["dull"]
    blog = _pipeline(calls, flavour)
    source = blog.run("owls")
    before = [(s.step_id, s.status) for s in source.records()]
    at = source.history()[-1]  # after research
    flavour[0] = "lively"  # the "changed prompt": same code, other behaviour
    calls.clear()
    fork = blog.fork(source.id, at=at.id[:8])
    assert fork.status == "finished" and fork.id != source.id
    assert fork.result == "LIVELY ESSAY FROM NOTES ON OWLS"
    assert calls == ["write", "publish"]  # research replayed; the rest executed (no cache)
    assert fork.resumed_from == "forked"
    # the source run is untouched
    again = durably.get_run(source.id)
    assert [(s.step_id, s.status) for s in again.records()] == before
    assert again.result == "DULL ESSAY FROM NOTES ON OWLS"
    # fork with cache=True may take unchanged steps from the cache
    calls.clear()
    cached = blog.fork(source.id, at=at.id, cache=True)
    assert calls == [] and cached.result == "LIVELY ESSAY FROM NOTES ON OWLS"


def test_fork_with_an_update_replaces_the_checkpoint_result() -> None:
    blog = _pipeline([], ["dull"])
    source = blog.run("owls")
    at = source.history()[-1]
    fork = durably.fork(source.id, at=at.id, update="better notes")
    assert fork.result == "DULL ESSAY FROM BETTER NOTES"


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_fork_whose_updated_task_changed_warns_that_the_update_is_unused(
        is_async: bool) -> None:
    import warnings

    tone = "plain"

    @task
    def research(topic: str) -> str:
        return f"{tone} notes on {topic}"

    @task
    def write(notes: str) -> str:
        return notes.upper()

    if is_async:
        @entrypoint
        async def blog(topic: str) -> str:
            return write(research(topic))
    else:
        @entrypoint  # type: ignore[no-redef]
        def blog(topic: str) -> str:
            return write(research(topic))

    def fork(source: str, at: str) -> Any:
        made = blog.fork(source, at=at, update="my notes")
        return asyncio.run(made) if is_async else made

    source = blog.run("owls")
    source = asyncio.run(source) if is_async else source
    at = source.history()[-1].id  # research's result
    tone = "vivid"  # research's code changed (a closure's value is part of it)
    with pytest.warns(UserWarning, match=r"update given for checkpoint \w+ \(task '.*research'"
                                         r"\) was not used: .* another cache key"):
        changed = fork(source.id, at)
    assert changed.result == "VIVID NOTES ON OWLS"  # what the fork did instead
    tone = "plain"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same code: the update is used, no warning
        assert fork(source.id, at).result == "MY NOTES"


def test_fork_at_an_interrupt_uses_the_new_answer() -> None:
    @task
    def decide(options: list[str]) -> Any:
        return durably.interrupt({"choose": options})

    @task
    def act(choice: str) -> str:
        return f"did {choice}"

    @entrypoint
    def agent(options: list[str]) -> str:
        return act(decide(options))

    run = agent.run(["left", "right"])
    assert agent.resume(run.id, "left") == "did left"
    checkpoint = next(c for c in durably.get_run(run.id).history() if c.kind == "interrupt")
    assert checkpoint.answer == "'left'" and checkpoint.state == "{'choose': ['left', 'right']}"
    fork = agent.fork(run.id, at=checkpoint.id, update="right")
    assert fork.result == "did right"
    pending = agent.fork(run.id, at=checkpoint.id)  # no answer: waits again
    assert pending.status == "interrupted"
    assert agent.resume(pending.id, "up") == "did up"
    assert durably.get_run(run.id).result == "did left"


def test_fork_errors_name_the_run_and_checkpoint() -> None:
    blog = _pipeline([], ["dull"])
    source = blog.run("owls")
    with pytest.raises(durably.NotFoundError, match="no checkpoint 'ffffffff'"):
        blog.fork(source.id, at="ffffffff")
    with pytest.raises(durably.NotFoundError, match="no run"):
        durably.fork("missing-run")
    with pytest.raises(durably.NotFoundError, match=r"6\+ of its first characters"):
        blog.fork(source.id, at="ab")


def test_checkpoint_is_a_frozen_record() -> None:
    blog = _pipeline([], ["dull"])
    cp = blog.run("x").history()[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.id = "other"  # type: ignore[misc]


# -- found by a new user trying to break it --------------------------------------------------
def test_a_resume_that_cannot_take_the_lease_answers_nothing() -> None:
    from durably._store.lease import hold, let_go, me

    @entrypoint
    def flow() -> Any:
        return durably.interrupt("value?")

    run = flow.run()
    store = durably.get_run(run.id)._store
    other = dataclasses.replace(me(), token="other-token")  # a live owner
    hold(other)
    try:
        assert store.acquire_run(run.id, other) is None  # another thread is resuming it
        with pytest.raises(durably.RunStateError, match="being executed"):
            flow.resume(run.id, "A")
        assert store.list_events(run.id, ("answer",)) == []  # A's answer was not recorded
    finally:
        let_go(other)
    store.release_run(run.id, other)
    assert flow.resume(run.id, "B") == "B"


def test_a_fork_of_a_fork_keeps_the_answers_it_inherited() -> None:
    @task
    def ask(q: str) -> Any:
        return durably.interrupt(q)

    @entrypoint
    def flow() -> tuple[Any, Any]:
        a = durably.interrupt("in body")
        return a, ask("in task")

    run = flow.run()
    with pytest.raises(durably.RunInterrupted):
        flow.resume(run.id, "A")
    flow.resume(run.id, "B")
    def in_task(run_id: str) -> durably.Checkpoint:
        return next(c for c in durably.get_run(run_id).history()
                    if c.kind == "interrupt" and c.task.endswith("ask"))

    first = durably.fork(run.id, at=in_task(run.id).id)
    assert [(c.kind, c.answer) for c in first.history()] == [("interrupt", None),
                                                              ("interrupt", "'A'")]
    assert flow.resume(first.id, "B2") == ("A", "B2")
    at = in_task(first.id)
    second = durably.fork(first.id, at=at.id, update="B3")
    assert second.status == "finished" and second.result == ("A", "B3")


def test_async_siblings_finish_before_the_run_is_released() -> None:
    charges: list[str] = []

    @task(cache=False)
    async def charge(n: str) -> str:
        await asyncio.sleep(0.2)
        charges.append(n)
        return n

    @task
    async def ask(n: str) -> Any:
        await asyncio.sleep(0.01)
        return durably.interrupt("ok?")

    @entrypoint
    async def flow() -> list[Any]:
        return list(await asyncio.gather(ask("a"), charge("b")))

    run = asyncio.run(flow.run())
    assert run.status == "interrupted" and charges == ["b"]  # waited for, and journaled
    assert asyncio.run(flow.resume(run.id, "yes")) == ["yes", "b"]
    assert charges == ["b"]  # replayed, not charged twice


def test_interrupts_inside_a_task_group_or_swallowed_still_pause_the_run() -> None:
    @task
    async def ask(q: str) -> Any:
        return durably.interrupt(q)

    @task
    async def other() -> int:
        return 1

    @entrypoint
    async def grouped() -> Any:
        async with asyncio.TaskGroup() as g:
            t1 = g.create_task(ask("group?"))
            g.create_task(other())
        return t1.result()

    run = asyncio.run(grouped.run())
    assert run.status == "interrupted" and [i.payload for i in run.interrupts] == ["group?"]
    assert asyncio.run(grouped.resume(run.id, "yes")) == "yes"

    @entrypoint
    async def swallowed() -> Any:
        return await asyncio.gather(ask("swallowed?"), other(), return_exceptions=True)

    run = asyncio.run(swallowed.run())
    assert run.status == "interrupted" and [i.payload for i in run.interrupts] == ["swallowed?"]


def test_every_interrupt_of_parallel_threads_is_reported() -> None:
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    @task
    def branch(n: str) -> Any:
        return durably.interrupt(f"ok {n}?")

    @entrypoint
    def fan(names: list[str]) -> list[Any]:
        with ThreadPoolExecutor(3) as ex:
            futures = [ex.submit(contextvars.copy_context().run, branch, n) for n in names]
            return [f.result() for f in futures]

    with pytest.raises(durably.RunInterrupted) as paused:
        fan(["a", "b", "c"])
    assert sorted(i.payload for i in paused.value.interrupts) == ["ok a?", "ok b?", "ok c?"]
    answers = {i.id: i.payload.upper() for i in paused.value.interrupts}
    assert fan.resume(paused.value.run_id, answers) == ["OK A?", "OK B?", "OK C?"]


def test_a_stale_interrupt_id_is_refused_even_with_one_pending() -> None:
    @entrypoint
    def two(tag: str) -> dict[str, Any]:
        return {"budget": durably.interrupt("budget?"), "launch": durably.interrupt("launch?")}

    run = two.run("x")
    first = run.interrupts[0].id
    with pytest.raises(durably.RunInterrupted):
        two.resume(run.id, {first: "yes"})
    with pytest.raises(durably.RunStateError, match="was already answered"):
        two.resume(run.id, {first: "yes"})  # the same request, retried
    with pytest.raises(durably.RunStateError, match="not an interrupt of this run"):
        two.resume(run.id, {"deadbeefdeadbeef": "yes"})
    second = durably.get_run(run.id).interrupts[0].id
    assert two.resume(run.id, {second[:8]: "go"}) == {"budget": "yes", "launch": "go"}


def test_a_mistyped_interrupt_id_is_refused_never_taken_as_the_answer() -> None:
    """With one interrupt pending, a mapping is the answer itself, unless a key names the
    interrupt or was meant to: an id in upper case or with spaces is taken as the id; one
    with a character too many, or mistyped after its first 6, is refused naming the id it
    was likely meant to be (before, it was journaled as the answer). A mapping whose keys
    only look like ids is refused with how to answer with it."""
    @entrypoint
    def one(tag: str) -> Any:
        return durably.interrupt("approve?")

    run = one.run("x")
    pending = run.interrupts[0].id
    other = {c: "0" if c != "0" else "1" for c in pending}
    typos = (pending + "x", pending[:6] + other[pending[6]] * 10,
             (pending[:2] + other[pending[2]] + pending[3:]).upper(),  # upper case, mistyped
             pending[1:], "id:" + pending, pending[:3] + "-" + pending[3:])
    for typo in typos:
        with pytest.raises(durably.RunStateError,
                           match=f"not an interrupt of this run \\(did you mean '{pending}'"):
            one.resume(run.id, {typo: "yes"})
    with pytest.raises(durably.RunStateError, match="wrap it"):
        one.resume(run.id, {"a1b2c3d4e5": True, "0123456789abcdef": False})
    assert durably.get_run(run.id).status == "interrupted"  # nothing was journaled
    assert one.resume(run.id, {f" {pending.upper()} ": {"ok": 1}}) == {"ok": 1}
    run2 = one.run("y")
    answer = {"reviewer": "ana", "notes": "fine"}  # keys that are not ids: the answer
    assert one.resume(run2.id, answer) == answer


def test_an_answer_is_not_used_for_a_changed_question(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from tests.conftest import load_source

    v1 = load_source(tmp_path, monkeypatch, "deploy_flow", """
import durably
@durably.entrypoint
def deploy(env):
    ok = durably.interrupt(f"deploy to {env}?")
    return f"deployed={ok}"
""")
    run = v1.deploy.run("prod")
    v2 = load_source(tmp_path, monkeypatch, "deploy_flow", """
import durably
@durably.entrypoint
def deploy(env):
    wipe = durably.interrupt(f"WIPE the {env} database first?")
    ok = durably.interrupt(f"deploy to {env}?")
    return f"wiped={wipe} deployed={ok}"
""")
    with pytest.raises(durably.RunInterrupted) as again:
        v2.deploy.resume(run.id, "yes")  # answers "deploy to prod?", which moved
    assert [i.payload for i in again.value.interrupts] == ["WIPE the prod database first?"]
    assert "the question of interrupt" in caplog.text


def test_a_question_that_changes_on_every_execution_is_an_error_not_a_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A draft made inside the asking task by a call that gives another value each time (a
    fake LLM): each resume re-executes the task, the question differs, and asking again
    would never end. The code did not change, so that is said, with both questions and the
    fix; the answer is never applied to the new question. Once the draft is made by a task
    of its own, the run asks once more and the answer is used."""
    from tests.conftest import load_source

    v1 = load_source(tmp_path, monkeypatch, "drafting_flow", """
import itertools, durably
_llm = itertools.count(1)
@durably.task
def review(topic):
    draft = f"{topic} draft #{next(_llm)}"     # not a task: another draft on each execution
    verdict = durably.interrupt({"approve": draft})
    return f"{verdict}: {draft}"
@durably.entrypoint
def post(topic):
    return review(topic)
""")
    run = v1.post.run("owls")
    assert run.interrupts[0].payload == {"approve": "owls draft #1"}
    with pytest.raises(durably.NondeterminismError, match=(
            r"task 'review' asked interrupt \w+ again with another question than the one "
            r"answered, although its code and inputs are the same.*The question answered: "
            r"\{'approve': 'owls draft #1'\}; asked now: \{'approve': 'owls draft #2'\}\. "
            r"Fix: compute that value in a task of its own")):
        v1.post.resume(run.id, "yes")
    assert durably.get_run(run.id).status == "failed"
    v2 = load_source(tmp_path, monkeypatch, "drafting_flow", """
import itertools, durably
_llm = itertools.count(10)
@durably.task
def write(topic):
    return f"{topic} draft #{next(_llm)}"
@durably.task
def review(topic):
    draft = write(topic)                      # journaled: the same draft on every replay
    verdict = durably.interrupt({"approve": draft})
    return f"{verdict}: {draft}"
@durably.entrypoint
def post(topic):
    return review(topic)
""")
    again = v2.post.run("owls")
    assert again.status == "interrupted"
    assert again.interrupts[0].payload == {"approve": "owls draft #10"}
    assert v2.post.resume(run.id, "yes") == "yes: owls draft #10"


def test_a_changing_question_in_a_graph_node_and_in_the_entrypoint_body_is_named() -> None:
    """The same in a StateGraph node (journaled, not cached: its code may change between
    question and answer, which is told apart) and in the entrypoint's own body."""
    import itertools
    from typing import TypedDict

    clock = itertools.count()

    class S(TypedDict):
        verdict: str

    def review(s: S) -> dict[str, Any]:
        return {"verdict": durably.interrupt({"approve": "draft", "asked_at": next(clock)})}

    g = durably.StateGraph(S, name="timestamped")
    g.add_node("review", review).add_edge(durably.START, "review")
    app = g.add_edge("review", durably.END).compile()
    run = app.run({"verdict": ""})
    with pytest.raises(durably.NondeterminismError, match=r"task 'timestamped.review' asked"):
        app.resume(run.id, "yes")

    @entrypoint
    def body(topic: str) -> str:
        return str(durably.interrupt(f"{topic} #{next(clock)}?"))

    first = body.run("x")
    with pytest.raises(durably.NondeterminismError, match=r"entrypoint '[^']*body' asked"):
        body.resume(first.id, "yes")


def test_an_answer_finds_its_question_after_the_asking_task_was_edited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A task edited while its run waits for an answer (a deploy) asks under a new id: its
    step id follows its code. The answer to the same question, which no call of the
    attempt reached, is taken (once, with a warning) instead of asking again; it is
    journaled for the new id, so later attempts find it there. Two answered questions
    alike are ambiguous: the question is asked again."""
    from tests.conftest import load_source

    flow = """
import durably
@durably.task
def write(topic):
    return f"draft on {topic}"
@durably.task
def ask(draft):
    $EDIT
    return durably.interrupt({"question": "Publish?", "draft": draft})
@durably.entrypoint
def newsletter(topic):
    draft = write(topic)
    return f"published={ask(draft)}"
"""
    v1 = load_source(tmp_path, monkeypatch, "news_flow", flow.replace("$EDIT", "pass"))
    run = v1.newsletter.run("owls")
    (first,) = run.interrupts
    v2 = load_source(tmp_path, monkeypatch, "news_flow", flow.replace("$EDIT", "x = 1"))
    assert v2.newsletter.resume(run.id, "yes") == "published=yes"
    assert "takes that answer" in caplog.text and first.id in caplog.text
    done = durably.get_run(run.id)
    assert done.status == "finished" and [s.task for s in done.steps if s.status == "ran"] \
        == ["ask"]  # the edited task ran again; write was replayed
    assert v2.newsletter("owls") == "published=yes"  # (finished: its result)

    twice = """
import durably
@durably.task
def ask(n):
    $EDIT
    return durably.interrupt("Approve?")
@durably.entrypoint
def approvals(tag):
    return [ask(1), ask(2), ask(2)]
"""
    # the same question three times: told apart by the asking step's inputs, and calls
    # alike (the same inputs) take the answers in the order they were asked
    w1 = load_source(tmp_path, monkeypatch, "twice_flow", twice.replace("$EDIT", "pass"))
    run = w1.approvals.run("t")
    for answer in ("first", "second"):
        with pytest.raises(durably.RunInterrupted):
            w1.approvals.resume(run.id, answer)
    (last,) = durably.get_run(run.id).interrupts
    w2 = load_source(tmp_path, monkeypatch, "twice_flow", twice.replace("$EDIT", "y = 2"))
    caplog.clear()
    assert w2.approvals.resume(run.id, {last.id: "third"}) == ["first", "second", "third"]
    assert caplog.text.count("takes that answer") == 3

    fan = """
import durably
@durably.task
def review(item):
    $EDIT
    return durably.interrupt({"approve": item})
@durably.entrypoint
def reviews(items):
    return review.map(items)
"""
    f1 = load_source(tmp_path, monkeypatch, "fan_flow", fan.replace("$EDIT", "pass"))
    run = f1.reviews.run(["x", "y"])
    answers = {i.id: f"ok {i.payload['approve']}" for i in run.interrupts}
    f2 = load_source(tmp_path, monkeypatch, "fan_flow", fan.replace("$EDIT", "z = 3"))
    assert f2.reviews.resume(run.id, answers) == ["ok x", "ok y"]  # items of a fan-out too

    nested = '''
import durably
@durably.task
def ask(q):
    return durably.interrupt(q)
@durably.task
def outer(topic):
    $EDIT
    return ask(f"Publish {topic}?")
@durably.entrypoint
def flow(topic):
    return outer(topic)
'''
    n1 = load_source(tmp_path, monkeypatch, "nested_flow", nested.replace("$EDIT", "pass"))
    run = n1.flow.run("owls")
    n2 = load_source(tmp_path, monkeypatch, "nested_flow", nested.replace("$EDIT", "q = 1"))
    assert n2.flow.resume(run.id, "yes") == "yes"  # the caller edited: the asker's id moved


def test_an_answer_spent_by_a_replay_is_never_given_to_another_question() -> None:
    """Without any edit, the same question asked for two invoices (or by two callers):
    once the first is answered, calling the entrypoint again replays the first asker, and
    the second question stays pending; its id is new, but the first answer is spent."""
    @task
    def approve(amount: int) -> Any:
        return durably.interrupt(f"approve payment of {amount}?")

    @entrypoint
    def pay(invoices: list[str]) -> list[Any]:
        return [approve(100) if inv else None for inv in invoices]

    @task
    def charge(user: str) -> Any:
        return approve(100)

    @entrypoint
    def billing(users: list[str]) -> list[Any]:
        return [charge(u) for u in users]

    for flow, arg in ((pay, ["inv-1", "inv-2"]), (billing, ["alice", "bob"])):
        run = flow.run(arg)
        with pytest.raises(durably.RunInterrupted):
            flow.resume(run.id, "yes")
        again = flow.run(arg)  # a retry, cron, another process: no answer given
        assert again.status == "interrupted", flow
        assert flow.resume(run.id, "no") == ["yes", "no"]


def test_an_edited_side_effect_does_not_happen_again_in_its_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import load_source

    sent = tmp_path / "sent.txt"
    source = """
import durably
@durably.task(cache=False)
def send_email(to):
    with open(SENT, "a") as f:
        f.write("MESSAGE" + "\\n")
@durably.entrypoint
def onboarding(user):
    send_email(user)
    return durably.interrupt(f"activate {user}?")
"""
    v1 = load_source(tmp_path, monkeypatch, "mail_flow",
                     f"SENT = {str(sent)!r}\n" + source)
    run = v1.onboarding.run("ada")
    v2 = load_source(tmp_path, monkeypatch, "mail_flow",
                     f"SENT = {str(sent)!r}\n" + source.replace("MESSAGE", "Message"))
    assert v2.onboarding.resume(run.id, True) is True
    assert sent.read_text().splitlines() == ["MESSAGE"]  # sent once


def test_an_async_resume_that_never_ran_answers_nothing() -> None:
    @entrypoint
    async def flow() -> Any:
        return ("answer", durably.interrupt("ok?"))

    run = asyncio.run(flow.run())
    forgotten = flow.resume(run.id, "yes")
    forgotten.close()  # never awaited (a cancelled request)
    assert durably.get_run(run.id).interrupts[0].payload == "ok?"
    assert asyncio.run(flow.resume(run.id, "no")) == ("answer", "no")


def test_calling_again_after_a_fork_continues_the_source_run() -> None:
    @task
    def model(name: str) -> str:
        return "model-A"

    @entrypoint
    def nightly(data: str) -> str:
        return f"used {model(data)}"

    run = nightly.run("data")
    durably.fork(run.id, at=run.history()[-1].id, update="model-B")
    again = nightly.run("data")
    assert again.id == run.id and again.result == "used model-A"


def test_pending_payloads_that_cannot_be_loaded_here_are_described() -> None:
    from durably._runtime.interrupt import pending_interrupts
    from durably._store.records import EventRecord

    @entrypoint
    def flow() -> Any:
        return durably.interrupt("q")

    run = flow.run()
    store = durably.get_run(run.id)._store
    store.append_events([EventRecord(run.id, "interrupt", 0.0, run.attempt, None,
                                     "0123456789abcdef", b"\x80\x04garbage")])
    found = pending_interrupts(store, run.id, run.attempt)
    assert any(isinstance(i.payload, str) and "not loadable here" in i.payload for i in found)


def test_a_forks_answer_is_never_cached_even_in_a_caller_that_catches_a_failure() -> None:
    """A fork answering an interrupt (update=) journals the question with the answer, so the
    fork's steps that depend on it are known: the step that asked and its callers are
    never cached. Here the asking step raises on "no" and its caller catches it: the
    caller's "skipped" was cached, and served outside any run without asking."""

    class Rejected(Exception):
        pass

    @task
    def approve(doc: str) -> str:
        if durably.interrupt({"publish?": doc}) != "yes":
            raise Rejected(doc)
        return doc

    @task
    def publish_or_skip(doc: str) -> str:
        try:
            approve(doc)
            return "published"
        except Rejected:
            return "skipped"

    @entrypoint
    def flow(doc: str) -> str:
        return publish_or_skip(doc)

    with pytest.raises(durably.RunInterrupted) as paused:
        flow("d1")
    run_id = paused.value.run_id
    assert flow.resume(run_id, "yes") == "published"
    [cp] = [c for c in durably.get_run(run_id).history() if c.kind == "interrupt"]
    assert flow.fork(run_id, at=cp.id, update="no").result == "skipped"
    for call in (publish_or_skip, approve):
        with pytest.raises(durably.NoActiveRunError):
            call("d1")  # asks again (outside a run, it cannot)


def test_a_fork_that_fails_after_its_answer_caches_no_caller_when_continued(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork's answer is in its journal with its question: when the fork fails after
    the answer and is continued, the callers finishing in that later attempt are known to
    depend on it (they were cached, and served the fork's answer outside any run)."""
    import os

    @task
    def ask(x: int) -> str:
        return f"ans={durably.interrupt('go?')}/{x}"

    @task
    def mid(x: int) -> str:
        out = ask(x) + "/mid"
        if os.environ.get("DURABLY_TEST_FAIL_MID"):
            raise ConnectionError("the network went down")
        return out

    @entrypoint
    def chain(x: int) -> str:
        return mid(x)

    with pytest.raises(durably.RunInterrupted) as paused:
        chain(7)
    run_id = paused.value.run_id
    assert chain.resume(run_id, "yes") == "ans=yes/7/mid"
    [cp] = [c for c in durably.get_run(run_id).history() if c.kind == "interrupt"]
    monkeypatch.setenv("DURABLY_TEST_FAIL_MID", "1")
    with pytest.raises(ConnectionError):
        chain.fork(run_id, at=cp.id, update="no")
    monkeypatch.delenv("DURABLY_TEST_FAIL_MID")
    [fork] = [r for r in durably.list_runs(chain) if r.id != run_id]
    assert chain.run(7, run_id=fork.id).result == "ans=no/7/mid"
    for call in (mid, ask):
        with pytest.raises(durably.NoActiveRunError):
            call(7)


def test_resume_without_an_answer_is_refused_and_journals_nothing() -> None:
    """resume(run_id) (or None) is no answer: an approval is never given by accident (the
    CLI refuses the same); the question stays pending and answers later."""
    @entrypoint
    def approve(item: str) -> str:
        return f"{item}: {durably.interrupt(f'ship {item}?')}"

    run = approve.run("crate")
    with pytest.raises(durably.DefinitionError, match=r"was given no answer.*Fix: resume"):
        approve.resume(run.id)
    assert durably.get_run(run.id).status == "interrupted"
    assert approve.resume(run.id, "yes") == "crate: yes"


def test_a_fork_at_the_input_executes_every_step_anew() -> None:
    """fork(run_id, at='') starts from the run's input (the first snapshot a graph's
    history shows): nothing replayed; an update there is refused (no step to replace)."""
    calls: list[int] = []

    @task
    def double(x: int) -> int:
        calls.append(x)
        return 2 * x

    @entrypoint
    def job(x: int) -> int:
        return double(x) + 1

    source = job.run(4)
    anew = job.fork(source.id, at="")
    assert anew.result == 9 and calls == [4, 4]
    assert [s.status for s in anew.steps] == ["ran"]
    with pytest.raises(durably.DefinitionError, match=r"at '' \(its input\): there is no step"):
        job.fork(source.id, at="", update=5)


def test_an_answer_racing_another_attempt_is_told_to_wait_and_answer_again() -> None:
    """A scheduler calls the waiting run again while a person answers: the answer is not
    recorded, and the message says to wait for that attempt and resume again (not to call
    the entrypoint, which would only pause again)."""
    import threading

    entered, gate, blocking = threading.Event(), threading.Event(), [False]

    @entrypoint
    def ship(item: str) -> str:
        if blocking[0]:
            entered.set()
            gate.wait(30)
        return f"{item}: {durably.interrupt('ship it?')}"

    run = ship.run("crate")
    blocking[0] = True
    other = threading.Thread(target=ship.run, args=("crate",))
    other.start()
    try:
        assert entered.wait(30)
        with pytest.raises(durably.RunStateError, match=r"is being executed right now.*this "
                           r"answer is not recorded.*call resume\(\) again"):
            ship.resume(run.id, "yes")
    finally:
        gate.set()
        other.join(30)
    blocking[0] = False
    assert ship.resume(run.id, "yes") == "crate: yes"


def test_two_keys_naming_one_interrupt_are_refused() -> None:
    """{prefix: a, full id: b} gives one question two answers: refused, nothing recorded."""
    @entrypoint
    def pick(item: str) -> str:
        return f"{item}: {durably.interrupt('which?')}"

    run = pick.run("x")
    iid = run.interrupts[0].id
    with pytest.raises(durably.RunStateError, match=r"names interrupt \w+ twice"):
        pick.resume(run.id, {iid[:6]: "a", iid: "b"})
    assert pick.resume(run.id, {iid: "b"}) == "x: b"


def test_a_side_effect_inside_an_edited_task_does_not_happen_again_in_its_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A deploy while the run waits: the cached task that sent a notification, then asked,
    gets a new line. Its step id follows its code, so the notification nested in it was a
    new step and was sent again (a break-it helper's ledger: NOTIFY twice). A side effect
    inside another step is now identified by its callers' tasks and inputs, not by their
    code: replayed. With other inputs it is another call, and happens."""
    from tests.conftest import load_source

    ledger = tmp_path / "ledger.txt"
    source = """
import durably
@durably.task(cache=False)
def notify(channel, text):
    with open(LEDGER, "a") as f:
        f.write(f"NOTIFY {text}\\n")
    return "ok"
@durably.task
def review(draft):
    notify("#approvals", f"please review: {draft}")
    return durably.interrupt({"approve": draft})
@durably.task
def outer(draft):
    return review(draft)
@durably.entrypoint
def publish(draft):
    return outer(draft)
"""
    v1 = load_source(tmp_path, monkeypatch, "notify_flow",
                     f"LEDGER = {str(ledger)!r}\n" + source)
    run = v1.publish.run("d1")
    assert run.status == "interrupted"
    v2 = load_source(tmp_path, monkeypatch, "notify_flow",
                     f"LEDGER = {str(ledger)!r}\n" + source.replace(
                         "    return review(draft)", "    review_of = review(draft)\n"
                         "    return review_of").replace(
                         "    return durably.interrupt(", "    x = 1\n"
                         "    return durably.interrupt("))
    assert v2.publish.resume(run.id, "yes") == "yes"
    assert ledger.read_text().splitlines() == ["NOTIFY please review: d1"]  # sent once
    other = v2.publish.run("d2")
    assert other.status == "interrupted"
    assert ledger.read_text().splitlines()[-1] == "NOTIFY please review: d2"


def test_a_nested_side_effect_journaled_by_an_older_durably_is_replayed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Journals written before nested side effects were identified by their callers'
    tasks and inputs hold them under their caller's step id: a run resumed after the
    upgrade finds them there (replayed, not sent again)."""
    from durably._decorators import tasks as _task_module
    from durably._runtime import call as _call

    sent: list[str] = []

    @task(cache=False)
    def send(x: int) -> int:
        sent.append(f"send {x}")
        return x

    @task
    def step(x: int) -> int:  # asks after its side effect: it runs again on resume
        sent_value = send(x)
        return int(durably.interrupt("go?")) + sent_value + 1

    @entrypoint
    def legacy_job(x: int) -> int:
        return step(x)

    # the older durably: a nested side effect's id from its caller's step id
    monkeypatch.setattr(_call, "call_path", lambda ctx, step_id: f"{step_id}~legacy")
    real = _call.begin_step

    def older(spec: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        ctx = _call.current_run.get()
        parent = _call.current_step.get()
        if ctx is not None and parent is not None and not spec.cache:
            # made as before: parent/journal key, its occurrence
            digest = spec.digest_inputs(spec.arguments(instance, args, kwargs))
            head = f"{parent}/{spec.side_effect_key(digest)}".encode()
            value, call = real(spec, instance, args, kwargs)
            call.step_id = _call._xxh3_128_hex(b"%s/%d" % (head, 0))
            return value, call
        return real(spec, instance, args, kwargs)

    monkeypatch.setattr(_call, "begin_step", older)
    monkeypatch.setattr(_task_module, "begin_step", older)  # (a task's call uses it directly)
    run = legacy_job.run(3)
    assert run.status == "interrupted" and sent == ["send 3"]
    monkeypatch.undo()
    assert legacy_job.resume(run.id, 10) == 14
    assert sent == ["send 3"]  # found under the old id: not sent again


def test_a_question_asked_again_after_a_fix_takes_its_new_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the entrypoint's body (no task: the interrupt id does not follow the code): a
    question with a random nonce fails as nondeterministic; once the nonce is taken out,
    the question is asked again, and its new answer is the one used (the old answer,
    kept under the same id, won: a reviewer's 'NEW-ANSWER' came back 'old-answer')."""
    from tests.conftest import load_source

    source = """
import random, durably
@durably.entrypoint
def publish(topic):
    return durably.interrupt({"q": f"publish {topic}?", "nonce": random.random()})
"""
    v1 = load_source(tmp_path, monkeypatch, "nonce_flow", source)
    run = v1.publish.run("owls")
    with pytest.raises(durably.NondeterminismError):
        v1.publish.resume(run.id, "old-answer")
    v2 = load_source(tmp_path, monkeypatch, "nonce_flow",
                     source.replace(', "nonce": random.random()', ""))
    again = v2.publish.run("owls")
    assert again.status == "interrupted"
    assert [i.payload for i in again.interrupts] == [{"q": "publish owls?"}]
    assert again.interrupts[0].id != run.interrupts[0].id  # asked under an id of its own
    assert v2.publish.resume(run.id, "NEW-ANSWER") == "NEW-ANSWER"
    assert v2.publish("owls") == "NEW-ANSWER"  # and on every later replay


def test_a_side_effect_inside_an_edited_async_map_item_does_not_happen_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Async fan-out items were not registered as executing (thread items were): the call
    path of a side effect inside one fell back to the item's step id, which follows its
    code, so an edit of the mapped task made it happen again (a review); and an async
    item's question that changes every time asked for ever instead of raising."""
    from tests.conftest import load_source

    ledger = tmp_path / "ledger.txt"
    source = """
import asyncio, durably
@durably.task(cache=False)
def send(x):
    with open(LEDGER, "a") as f:
        f.write(f"send {x}\\n")
    return x
@durably.task
async def item(x):
    return send(x)
async def both(n):
    mapped = await item.map(range(n))
    return mapped + [await item.submit(100)]
@durably.entrypoint
def job(n):
    out = asyncio.run(both(n))
    if FAIL[0]:
        raise RuntimeError("stop")
    return out
FAIL = [True]
"""
    head = f"LEDGER = {str(ledger)!r}\n"
    v1 = load_source(tmp_path, monkeypatch, "async_items", head + source)
    with pytest.raises(RuntimeError):
        v1.job(2)
    v2 = load_source(tmp_path, monkeypatch, "async_items", head + source.replace(
        "    return send(x)", "    value = send(x)\n    return value").replace(
        "FAIL = [True]", "FAIL = [False]"))
    assert v2.job(2) == [0, 1, 100]
    assert ledger.read_text().splitlines() == ["send 0", "send 1", "send 100"]  # once each


def test_an_async_map_item_whose_question_changes_every_time_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import load_source

    mod = load_source(tmp_path, monkeypatch, "async_askers", """
import asyncio, itertools, durably
_n = itertools.count()
@durably.task
async def ask(x):
    return durably.interrupt(f"approve {x}? #{next(_n)}")
@durably.entrypoint
def job(n):
    return asyncio.run(ask.map(range(n)))
""")
    run = mod.job.run(1)
    assert run.status == "interrupted"
    with pytest.raises(BaseException) as raised:
        mod.job.resume(run.id, "yes")
    errors = (raised.value.exceptions if isinstance(raised.value, BaseExceptionGroup)
              else [raised.value])
    assert any(isinstance(e, durably.NondeterminismError) for e in errors), errors


def test_a_side_effect_asker_given_other_inputs_asks_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache=False task that asks, whose input changed (3 to 5) while the run waited:
    it is another call, and asks again (the answers to the call with 3 were taken over:
    small numbers leave no flow digest, so 3 and 5 looked alike)."""
    from tests.conftest import load_source

    source = """
import durably
@durably.task
def level(ticket):
    return LEVEL
@durably.task(cache=False)
def ask(level):
    refund = durably.interrupt("Refund the customer?")
    return (level, refund, durably.interrupt("Confirm?"))
@durably.entrypoint
def main(ticket):
    return ask(level(ticket))
"""
    v1 = load_source(tmp_path, monkeypatch, "refunds", source.replace("LEVEL", "3"))
    run = v1.main.run("T-1")
    with pytest.raises(durably.RunInterrupted) as paused:
        v1.main.resume(run.id, "yes-refund")
    assert [i.payload for i in paused.value.interrupts] == ["Confirm?"]
    v2 = load_source(tmp_path, monkeypatch, "refunds", source.replace("LEVEL", "5"))
    again = v2.main.run("T-1")
    assert again.status == "interrupted"
    assert [i.payload for i in again.interrupts] == ["Refund the customer?"]  # asked anew


def test_a_retry_gets_the_answer_given_before_its_try_failed(
        disk_store: durably.DiskStore) -> None:
    """A task with ``retry=`` that asked a question, was answered, then failed: its next try
    asks the same question (the same interrupt id) and gets the same answer; it paused the
    run to ask it again under a new id."""
    tries: list[str] = []

    @durably.task(retry=durably.Retry(attempts=3, backoff=0.0))
    def approve_and_post(draft: str) -> str:
        verdict = durably.interrupt({"approve?": draft})
        tries.append(verdict)
        if len(tries) == 1:
            raise ConnectionError("flaky network")  # after the answer
        return f"{draft}: {verdict}"

    @durably.entrypoint
    def publish(draft: str) -> str:
        return approve_and_post(draft)

    run = publish.run("owls")
    assert run.status == "interrupted" and len(run.interrupts) == 1
    assert publish.resume(run.id, "yes") == "owls: yes"
    assert tries == ["yes", "yes"]
    statuses = [s.status for s in durably.get_run(run.id).records()
                if s.task.endswith("approve_and_post")]
    assert statuses[-2:] == ["failed", "ran"]


def test_a_submitted_call_nobody_waits_for_pauses_the_run_without_a_failure_warning(
        disk_store: durably.DiskStore) -> None:
    """``ask.submit(n)`` whose future is never asked, and whose body calls ``interrupt()``:
    the run pauses for it and names the task; it warned that the run finished and that the
    call failed (showing durably's InterruptSignal), and the interrupt named no task."""
    import warnings

    @durably.task
    def ask(x: int) -> Any:
        return durably.interrupt({"q": x})

    @durably.entrypoint
    def job(n: int) -> str:
        ask.submit(n)
        return "done"

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        run = job.run(1)
    assert run.status == "interrupted"
    assert [(i.task.rpartition(".")[2], i.payload) for i in run.interrupts] == [
        ("ask", {"q": 1})]
    assert not [w for w in said if "durably" in str(w.message)]
    assert job.resume(run.id, "yes") == "done"
