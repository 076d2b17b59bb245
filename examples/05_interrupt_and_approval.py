"""Interrupt and approval across two processes: a run pauses durably for a person's answer,
and another process answers it later, minutes or days after the first one exited.

    python examples/05_interrupt_and_approval.py                       # drafts, then pauses
    python examples/05_interrupt_and_approval.py answer RUN_ID yes     # another process answers

The first process journals the question and exits. The second one calls
``newsletter.resume(run_id, answer)``: the run executes again from the start of the
entrypoint, the draft (a finished step) is replayed from the journal, and ``interrupt()``
returns the answer. As in LangGraph, the task that called ``interrupt()`` runs again from its
start on resume, so side effects belong in tasks that finish before or after the question.
"""

from __future__ import annotations

import sys
import time

import durably


# --8<-- [start:flow]
@durably.task
def write_draft(topic: str) -> str:
    print(f"  drafting the newsletter on {topic!r} (slow) ...")
    time.sleep(0.3)  # an LLM call, say
    return f"This week in {topic}: three things worth knowing."


@durably.task
def ask_editor(draft: str) -> str:
    # interrupt() pauses the whole run here; on resume it returns the editor's answer
    return str(durably.interrupt({"question": "Publish this draft?", "draft": draft}))


@durably.task(cache=False)  # a side effect: journaled, so it happens once per run
def publish(draft: str) -> str:
    print("  publishing ...")
    return f"published: {draft}"


@durably.entrypoint
def newsletter(topic: str) -> str:
    draft = write_draft(topic)
    verdict = ask_editor(draft)
    if verdict.strip().lower() != "yes":
        return f"not published (the editor said {verdict!r})"
    return publish(draft)
# --8<-- [end:flow]


def start(topic: str) -> None:
    run = newsletter.run(topic)
    if run.status == "interrupted":
        question = run.interrupts[0].payload
        print(f"run {run.id} is waiting for an answer: {question['question']}")
        print(f"  draft: {question['draft']}")
        print(f"answer from any process: python {sys.argv[0]} answer {run.id} yes")
    else:
        print(f"run {run.id} {run.status}: {run.result}")


def answer(run_id: str, value: str) -> None:
    try:
        result = newsletter.resume(run_id, value)  # journals the answer, continues the run
    except durably.RunStateError as exc:  # not waiting (already answered), or not this kind
        print(f"cannot answer: {exc}")
        return
    print("result:", result)
    run = durably.get_run(run_id)
    print("steps:", ", ".join(f"{s.task} {s.status}" for s in run.steps))
    print(run.summary())


if __name__ == "__main__":
    if sys.argv[1:2] == ["answer"]:
        if len(sys.argv) != 4:
            print(f"usage: python {sys.argv[0]} answer RUN_ID ANSWER", file=sys.stderr)
            sys.exit(2)
        answer(sys.argv[2], sys.argv[3])
    else:
        start(sys.argv[1] if len(sys.argv) > 1 else "durable Python")
