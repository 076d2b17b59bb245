"""Fork a run and replay it with changed code: time travel to a checkpoint of a finished run,
change a step's result (or the code after it), and execute the rest as a new run. The source
run is never modified.

    python examples/09_fork_and_replay.py           # run: outline → write → sign
    # edit SIGNATURE below (code after the checkpoint), then:
    python examples/09_fork_and_replay.py fork      # fork at the outline with a new outline

The fork's journal holds the source run's finished steps up to the checkpoint, so those are
replayed; every step after it executes with today's code (``cache=True`` would let them be
served from the cross-run cache instead).
"""

from __future__ import annotations

import sys

import durably

SIGNATURE = "-- the durably team"  # edit me between the two commands


@durably.task
def outline(topic: str) -> list[str]:
    print("  outlining ...")
    return [f"What {topic} is", f"Why {topic} matters"]


@durably.task
def write(points: list[str]) -> str:
    print("  writing ...")
    return " ".join(f"{p}." for p in points)


@durably.task
def sign(text: str) -> str:
    return f"{text}\n{SIGNATURE}"


@durably.entrypoint
def post(topic: str) -> str:
    return sign(write(outline(topic)))


def first() -> None:
    run = post.run("durable execution")
    print(run.result)
    print(run.summary())
    print("checkpoints (newest first):")
    for cp in run.history():
        print(f"  {cp.id[:12]}  {cp.kind:<9} {cp.task:<8} {cp.state}")


def fork() -> None:
    source = next(r for r in durably.list_runs(post) if r.status == "finished"
                  and "-fork-" not in r.id)
    at = next(cp for cp in source.history() if cp.task == "outline")  # the checkpoint
    new_outline = ["What durable execution is", "How a journal replays it", "When to fork"]
    forked = durably.fork(source.id, at=at.id, update=new_outline)
    print(f"forked {source.id} at {at.id[:12]} ({at.task}) into {forked.id}")
    print(forked.result)
    print("steps:", ", ".join(f"{s.task} {s.status}" for s in forked.steps))
    print(forked.summary())
    print("the source run is unchanged:", durably.get_run(source.id).result.splitlines()[0])


if __name__ == "__main__":
    fork() if sys.argv[1:] == ["fork"] else first()
