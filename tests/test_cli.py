"""The ``durably`` command, run as installed (the console script beside this Python) in real
subprocesses, against stores written by real scripts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import run_script, script_env, write_script

pytestmark = pytest.mark.slow

DURABLY = Path(sys.executable).parent / "durably"

FLOWS = """
import durably


@durably.task
def load(n):
    return list(range(n))


@durably.task
def square(x):
    return x * x


@durably.task
def total(xs):
    return sum(xs)


@durably.task
def summary(xs):
    return {"total": total(xs), "count": len(xs)}  # a step inside a step


@durably.entrypoint
def pipeline(n):
    return summary([square(x) for x in load(n)])


@durably.task
def draft(topic):
    return f"a draft on {topic}"


@durably.task
def review(text):
    return durably.interrupt({"please review": text})


@durably.task
def publish(text, verdict):
    if verdict != "yes":
        raise ValueError(f"not approved: {verdict!r}")
    return text.upper()


@durably.entrypoint
def approve(topic):
    text = draft(topic)
    return publish(text, review(text))


@durably.task
def ask(question):
    return durably.interrupt(question)


@durably.entrypoint
def survey(name):
    return [ask(f"{name}: first?"), ask(f"{name}: second?")]
"""

START = """
import json
import durably
import flows

ids = {"p4": flows.pipeline.run(4).id, "p3": flows.pipeline.run(3).id}
flows.pipeline.run(4)  # a second attempt: every step replayed
ids["approve"] = flows.approve.run("owls").id
ids["survey"] = flows.survey.run("ada").id
durably.DiskStore().cache_put("f" * 32, b"an entry without a key record")
print(json.dumps(ids))
"""


class Sample:
    """A project directory with ``flows.py`` and a store written by running it."""

    def __init__(self, project: Path, store: Path, ids: dict[str, str]) -> None:
        self.project, self.store, self.ids = project, store, ids

    def copy(self, where: Path) -> Sample:
        """The same project with its own copy of the store (for commands that write)."""
        project = where / "project"
        shutil.copytree(self.project, project)
        return Sample(project, project / "store", self.ids)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    project = tmp_path_factory.mktemp("cli")
    store = project / "store"
    write_script(project / "flows.py", FLOWS)
    start = write_script(project / "start.py", START)
    proc = run_script(start, script_env(store))
    return Sample(project, store, json.loads(proc.stdout.strip().splitlines()[-1]))


def durably(*args: str, cwd: Path, store: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed command; ``store`` goes in DURABLY_DIR (else none is set)."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("PYTEST") and k != "DURABLY_DIR"}
    if store is not None:
        environ["DURABLY_DIR"] = str(store)
    environ.update(env or {})
    return subprocess.run([str(DURABLY), *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=60)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def fails(proc: subprocess.CompletedProcess[str], *words: str, code: int = 1) -> str:
    """The error line, checked: one line on stderr, no traceback, the exit status."""
    assert proc.returncode == code, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("durably: error: "), proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(proc))


# -- the command exists -----------------------------------------------------------------------
def test_the_console_script_is_installed_and_documents_its_exit_codes(tmp_path: Path) -> None:
    assert DURABLY.exists(), "pip install -e . installs the durably command"
    text = ok(durably("--help", cwd=tmp_path))
    for word in ("runs", "show", "history", "graph", "resume", "fork", "explain", "cache",
                 "Exit status", "3    the run paused", "DURABLY_DIR"):
        assert word in text
    assert "prune" in ok(durably("cache", "--help", cwd=tmp_path))
    assert ok(durably("--version", cwd=tmp_path)).startswith("durably, version ")


# -- runs, show, history, graph: reading a store ------------------------------------------------
def test_runs_lists_newest_first_and_filters(sample: Sample) -> None:
    text = ok(durably("runs", cwd=sample.project, store=sample.store))
    lines = text.splitlines()
    assert lines[0].split() == ["RUN", "ENTRYPOINT", "STATUS", "ATTEMPT", "UPDATED"]
    ids = [line.split()[0] for line in lines[1:]]
    # p4 ran twice: its second attempt is newer than p3
    ids_in_order = [sample.ids[k] for k in ("survey", "approve", "p4", "p3")]
    assert ids == ids_in_order
    runs = as_json(durably("runs", "--entrypoint", "pipeline", "--json", cwd=sample.project,
                           store=sample.store))
    assert [r["id"] for r in runs] == [sample.ids["p4"], sample.ids["p3"]]
    assert runs[0]["entrypoint"] == "flows:pipeline" and runs[0]["attempt"] == 2
    waiting = ok(durably("runs", "-s", "interrupted", "-e", "flows:approve",
                         cwd=sample.project, store=sample.store))
    assert sample.ids["approve"] in waiting and sample.ids["survey"] not in waiting
    assert "no failed runs" in ok(durably("runs", "--status", "failed", cwd=sample.project,
                                          store=sample.store))


def test_dir_chooses_the_store_before_or_after_the_command(sample: Sample,
                                                           tmp_path: Path) -> None:
    expected = ok(durably("runs", cwd=sample.project, store=sample.store))
    other = tmp_path / "elsewhere"  # DURABLY_DIR points at no store: --dir wins over it
    assert ok(durably("--dir", str(sample.store), "runs", cwd=tmp_path, store=other)) \
        == expected
    assert ok(durably("runs", "--dir", str(sample.store), cwd=tmp_path)) == expected
    fails(durably("runs", cwd=tmp_path, store=other), "no durably store", str(other),
          "DURABLY_DIR")
    fails(durably("runs", cwd=tmp_path), "no durably store", ".durably")
    fails(durably("runs", "--dir", str(sample.project), cwd=tmp_path), "not a durably store")


def test_show_gives_the_steps_with_status_duration_and_cache_hits(sample: Sample) -> None:
    text = ok(durably("show", sample.ids["p3"], cwd=sample.project, store=sample.store))
    assert "flows:pipeline" in text and "finished (attempt 1)" in text
    assert "cache hits 3 of 6 (50%)" in text
    assert "result      {'total': 5, 'count': 3}" in text  # the result (as Python writes it)
    table = text[text.index("#  TASK"):].splitlines()
    assert table[0].split() == ["#", "TASK", "STATUS", "DURATION", "STEP", "OUTPUT"]
    rows = [line.split() for line in table[1:]]
    assert [(r[1], r[2]) for r in rows] == [
        ("load", "ran"), ("square", "cached"), ("square", "cached"), ("square", "cached"),
        ("summary", "ran"), ("total", "ran")]
    assert table[-1].startswith("6    total")  # nested in summary: indented

    # a prefix of the run id is enough; the replayed attempt shows the recorded outputs
    replayed = ok(durably("show", sample.ids["p4"][:-3], cwd=sample.project,
                          store=sample.store))
    assert "finished (attempt 2)" in replayed and "replayed" in replayed
    assert "[0, 1, 2, 3]" in replayed
    every = ok(durably("show", sample.ids["p4"], "--all", cwd=sample.project,
                       store=sample.store))
    assert "ATTEMPT" in every and len(every.splitlines()) > len(replayed.splitlines())


def test_show_writes_a_short_repr_of_a_large_result(tmp_path: Path) -> None:
    """A run whose result is a large bytes value (not JSON): ``show`` and ``show --json``
    write a short repr of it (its size said), never the whole repr (which took several
    times a result of hundreds of MB in memory, and wrote that much with --json)."""
    script = write_script(tmp_path / "big.py", """
        import durably

        @durably.entrypoint
        def big(n):
            return b"\\x01" * n

        print(big.run(3_000_000, run_id="big").status)
    """)
    store = tmp_path / "store"
    assert run_script(script, script_env(store)).stdout.strip() == "finished"
    text = ok(durably("show", "big", cwd=tmp_path, store=store))
    (line,) = [row for row in text.splitlines() if row.startswith("result")]
    assert line.startswith("result      b'\\x01\\x01") and len(line) < 220
    data = as_json(durably("show", "big", "--json", cwd=tmp_path, store=store))
    assert data["result"].endswith("...(3,000,000 bytes)") and len(data["result"]) <= 2000


def test_show_json_is_the_run_and_its_steps(sample: Sample) -> None:
    data = as_json(durably("show", sample.ids["p3"], "--json", cwd=sample.project,
                           store=sample.store))
    assert data["id"] == sample.ids["p3"] and data["status"] == "finished"
    assert data["entrypoint"] == "flows:pipeline" and data["attempt"] == 1
    assert data["result"] == {"total": 5, "count": 3}
    assert data["counts"] == {"ran": 3, "cached": 3, "replayed": 0, "failed": 0}
    step = data["steps"][0]
    for field in ("task", "status", "attempt", "started", "ended", "duration", "inputs",
                  "output", "error", "step_id", "parent_id"):
        assert field in step
    assert step["task"] == "load" and step["inputs"] == "n=3" and step["output"] == "[0, 1, 2]"
    by_task = {s["task"]: s for s in data["steps"]}
    assert by_task["total"]["parent_id"] == by_task["summary"]["step_id"]

    waiting = as_json(durably("show", sample.ids["approve"], "--json", cwd=sample.project,
                              store=sample.store))
    assert waiting["status"] == "interrupted" and waiting["result"] is None
    [pending] = waiting["interrupts"]
    assert pending["payload"] == {"please review": "a draft on owls"}
    assert pending["task"] == "review" and len(pending["id"]) == 16


def test_show_an_interrupted_run_says_how_to_answer(sample: Sample) -> None:
    text = ok(durably("show", sample.ids["approve"], cwd=sample.project, store=sample.store))
    assert "interrupted (attempt 1)" in text and "waiting for 1 answer" in text
    assert "{'please review': 'a draft on owls'}" in text
    assert f"durably resume flows:approve {sample.ids['approve']} --value JSON" in text


def test_history_lists_checkpoints_newest_first(sample: Sample) -> None:
    text = ok(durably("history", sample.ids["p3"], cwd=sample.project, store=sample.store))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["CHECKPOINT", "KIND", "TASK"]
    assert [line.split()[2] for line in lines[1:]] == [
        "summary", "total", "square", "square", "square", "load"]
    assert all(len(line.split()[0]) == 12 for line in lines[1:])
    points = as_json(durably("history", sample.ids["approve"], "--json", cwd=sample.project,
                             store=sample.store))
    assert [(p["kind"], p["task"]) for p in points] == [("interrupt", "review"),
                                                        ("step", "draft")]


def test_graph_in_every_format(sample: Sample, tmp_path: Path) -> None:
    run = sample.ids["p3"]
    mermaid = ok(durably("graph", run, cwd=sample.project, store=sample.store))
    assert "flowchart TD" in mermaid and "summary" in mermaid
    assert ok(durably("graph", run, "-f", "dot", cwd=sample.project,
                      store=sample.store)).startswith("digraph")
    proc = durably("graph", run, "-o", str(tmp_path / "run.mmd"), cwd=sample.project,
                   store=sample.store)
    ok(proc)
    assert "wrote the graph" in proc.stderr
    assert (tmp_path / "run.mmd").read_text(encoding="utf-8") == mermaid
    ok(durably("graph", run, "-f", "html", "-o", str(tmp_path / "report.txt"),
               cwd=sample.project, store=sample.store))
    assert "<html" in (tmp_path / "report.txt").read_text(encoding="utf-8")
    # without Graphviz's dot on PATH: the RenderError, in one line
    fails(durably("graph", run, "-f", "svg", cwd=sample.project, store=sample.store,
                  env={"PATH": str(DURABLY.parent)}), "Graphviz", "to_mermaid")


def test_graph_as_svg(sample: Sample, require_dot: str) -> None:
    svg = ok(durably("graph", sample.ids["p3"], "-f", "svg", cwd=sample.project,
                     store=sample.store))
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "summary" in svg


# -- resume and fork: writing runs ----------------------------------------------------------------
def test_resume_answers_an_interrupt_from_another_process(sample: Sample,
                                                          tmp_path: Path) -> None:
    s = sample.copy(tmp_path)
    run = s.ids["approve"]
    text = ok(durably("resume", "flows:approve", run, "--value", '"yes"', cwd=s.project,
                      store=s.store))
    assert f"run {run!r} finished" in text and "'A DRAFT ON OWLS'" in text
    shown = ok(durably("show", run, cwd=s.project, store=s.store))
    assert "finished (attempt 2)" in shown
    fails(durably("resume", "flows:approve", run, "--value", '"yes"', cwd=s.project,
                  store=s.store), "is finished, not interrupted")


def test_resume_that_pauses_again_prints_the_interrupts_and_exits_3(sample: Sample,
                                                                     tmp_path: Path) -> None:
    s = sample.copy(tmp_path)
    run = s.ids["survey"]
    proc = durably("--dir", str(s.store), "resume", "flows:survey", run, "--value", '"blue"',
                   cwd=s.project)
    assert proc.returncode == 3, proc.stderr
    assert "waiting for 1 answer" in proc.stdout and "'ada: second?'" in proc.stdout
    assert f"durably resume flows:survey {run}" in proc.stdout and "Traceback" not in proc.stderr
    text = ok(durably("resume", "flows:survey", run, "--value", '"green"', cwd=s.project,
                      store=s.store))
    assert "['blue', 'green']" in text


def test_resume_into_a_failing_step_reports_it_in_one_line(sample: Sample,
                                                            tmp_path: Path) -> None:
    s = sample.copy(tmp_path)
    run = s.ids["approve"]
    fails(durably("resume", "flows:approve", run, "--value", '"no"', cwd=s.project,
                  store=s.store), f"run {run!r} failed", "ValueError", "not approved: 'no'")
    assert "failed (attempt 2)" in ok(durably("show", run, cwd=s.project, store=s.store))
    # a failed run is continued (tried again) by resume without an answer: it fails again
    # the same way (its answer is journaled), said in one line
    fails(durably("resume", run, cwd=s.project, store=s.store), f"run {run!r} failed",
          "ValueError", "not approved: 'no'")
    assert "failed (attempt 3)" in ok(durably("show", run, cwd=s.project, store=s.store))


def test_fork_at_a_checkpoint_prefix_with_an_update(sample: Sample, tmp_path: Path) -> None:
    s = sample.copy(tmp_path)
    points = as_json(durably("history", s.ids["p4"], "--json", cwd=s.project, store=s.store))
    first_square = [p for p in points if p["task"] == "square"][-1]
    assert first_square["state"] == "0"
    proc = durably("fork", s.ids["p4"], "--at", first_square["id"][:8], "--update", "100",
                   cwd=s.project, store=s.store)
    text = ok(proc)
    assert f"at checkpoint {first_square['id'][:12]} (step square)" in text
    assert "{'total': 114, 'count': 4}" in text  # 100 + 1 + 4 + 9
    runs = as_json(durably("runs", "--json", cwd=s.project, store=s.store))
    assert runs[0]["id"].startswith(s.ids["p4"] + "-fork-") and runs[0]["status"] == "finished"
    # forking an interrupted run at its interrupt pauses the fork there again
    paused = durably("fork", s.ids["approve"], cwd=s.project, store=s.store)
    assert paused.returncode == 3 and "waiting for 1 answer" in paused.stdout


# -- explain ------------------------------------------------------------------------------------
def test_explain_says_hit_or_why_not(sample: Sample) -> None:
    hit = ok(durably("explain", "flows:square", "2", cwd=sample.project, store=sample.store))
    assert hit.strip() == ("square(...) would be served from the cache: an entry exists for "
                           "this code and these inputs.")
    assert "would be served" in ok(durably("explain", "flows:square", "x=2",
                                           cwd=sample.project, store=sample.store))
    miss = ok(durably("explain", "flows:square", "99", cwd=sample.project, store=sample.store))
    assert "would execute" in miss and "argument 'x' differs" in miss
    data = as_json(durably("explain", "flows:total", "[0, 1, 4]", "--json",
                           cwd=sample.project, store=sample.store))
    assert data["hit"] is True and data["identity"] == "flows:total"
    assert len(data["cache_key"]) == 32
    fails(durably("explain", "flows:square", "1", "2", cwd=sample.project,
                  store=sample.store), "do not fit flows:square(x)", code=2)


# -- the cache ----------------------------------------------------------------------------------
def test_cache_stats(sample: Sample) -> None:
    stats = as_json(durably("cache", "stats", "--json", cwd=sample.project, store=sample.store))
    tasks = {t["task"]: t for t in stats["tasks"]}
    assert tasks["flows:square"]["entries"] == 4
    assert (tasks["flows:square"]["ran"], tasks["flows:square"]["cached"]) == (4, 3)
    assert tasks["(unknown task)"]["entries"] == 1  # the entry without a key record
    assert "flows:review" not in tasks  # asked a person: never cached, not a miss
    assert stats["entries"] == sum(t["entries"] for t in stats["tasks"])
    assert stats["bytes"] >= stats["entry_bytes"] > 0 and stats["runs"] == 4
    assert stats["hit_rate"] == pytest.approx(stats["cached"] / (stats["cached"] + stats["ran"]))
    text = ok(durably("cache", "stats", cwd=sample.project, store=sample.store))
    assert "hit rate" in text and "flows:square" in text and "TASK" in text


def test_cache_clear_and_prune_keep_the_journals(sample: Sample, tmp_path: Path) -> None:
    s = sample.copy(tmp_path)

    def entries() -> dict[str, int]:
        stats = as_json(durably("cache", "stats", "--json", cwd=s.project, store=s.store))
        return {t["task"]: t["entries"] for t in stats["tasks"]}

    before = entries()
    assert "would remove 4 cache entries" in ok(durably(
        "cache", "clear", "--task", "square", "--dry-run", cwd=s.project, store=s.store))
    text = ok(durably("cache", "clear", "--task", "square", cwd=s.project, store=s.store))
    assert "removed 4 cache entries" in text and "flows:square" in text
    assert f"from {Path(s.store) / 'cache'}: " in text  # (the wording of 0.1, kept)
    after = entries()
    assert after["flows:square"] == 0 and after["flows:load"] == before["flows:load"]
    assert "removed 0 cache entries" in ok(durably("cache", "prune", "--older-than", "30d",
                                                   cwd=s.project, store=s.store))
    ok(durably("cache", "prune", "--max-size", "0", cwd=s.project, store=s.store))
    assert sum(entries().values()) == 0
    ok(durably("cache", "clear", cwd=s.project, store=s.store))

    # journals are untouched: the runs still show, and replay without their cache entries
    assert len(as_json(durably("runs", "--json", cwd=s.project, store=s.store))) == 4
    again = write_script(s.project / "again.py", """
        import flows
        run = flows.pipeline.run(4)
        print(run.counts(), run.result)
    """)
    out = run_script(again, script_env(s.store)).stdout
    assert "'replayed': 6" in out and "{'total': 14, 'count': 4}" in out


# -- every error: one line, no traceback, non-zero status ---------------------------------------
ERRORS = [
    (["show", "no-such-run"], ["no run 'no-such-run'", "durably runs"]),
    (["show", "pipeline-"], ["names 2 runs"]),
    (["graph", "{p3}", "-f", "png"], ["--format 'png'", "-f dot"]),
    (["graph", "{p3}", "-o", "run.png"], ["unknown suffix '.png'"]),
    (["runs", "--status", "done"], ["--status 'done'", "finished"]),
    (["resume", "nosuchmodule:flow", "{approve}"], ["cannot import module 'nosuchmodule'"]),
    (["resume", "flows:nope", "{approve}"], ["has no 'nope'", "approve, pipeline, survey"]),
    (["resume", "flows", "{approve}"], ["is not MODULE:ENTRYPOINT", "flows:pipeline"]),
    (["resume", "flows.py:approve", "{approve}"], ["file name"]),
    (["resume", "flows:square", "{approve}"], ["is a @durably.task, not a @durably.entrypoint"]),
    (["resume", "flows:approve", "{approve}", "--value", "yes"],
     ["--value 'yes' is not valid JSON", "'\"yes\"'"]),
    (["resume", "flows:approve", "{p3}"], ["belongs to entrypoint 'flows:pipeline'"]),
    (["resume", "flows:pipeline", "{p3}"], ["is finished, not interrupted"]),
    (["fork", "{p3}", "--at", "abc"], ["--at 'abc'", "6 or more"]),
    (["fork", "{p3}", "--at", "zzzzzzzz"], ["no such checkpoint", "durably history"]),
    (["fork", "{p3}", "--update", "[1,"], ["--update '[1,' is not valid JSON"]),
    (["explain", "flows:pipeline", "3"], ["is a @durably.entrypoint, not a @durably.task"]),
    (["cache", "prune", "--max-size", "5XB"], ["--max-size '5XB' is not a size", "5GB"]),
    (["cache", "prune", "--older-than", "30"], ["--older-than '30' is not a duration", "30d"]),
    (["cache", "prune"], ["--older-than", "--max-size"]),
    (["cache", "clear", "--task", "nope"], ["no task 'nope'", "flows:square"]),
    (["show", ""], ["RUN is empty"]),
    (["explain", "flows:square", "x=1", "x=2"], ["argument 'x' is given twice"]),
    (["explain", "flows:square", "y=1"], ["has no parameter 'y'"]),
]


@pytest.mark.parametrize(("args", "words"), ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_errors_are_one_line(sample: Sample, args: list[str], words: list[str]) -> None:
    """Each error is one line; a value of an option or argument that is not one is a usage
    error (exit status 2, as cli.md says and as click's own are), the others exit 1."""
    usage = any(w.startswith(("--format", "--status", "--value", "--update", "--max-size",
                              "--older-than", "RUN is empty", "argument 'x' is given",
                              "unknown suffix", "is not MODULE:", "file name",
                              "has no parameter"))
                for w in words) or args == ["cache", "prune"]
    args = [a.format(**sample.ids) for a in args]
    fails(durably(*args, cwd=sample.project, store=sample.store), *words,
          code=2 if usage else 1)


def test_usage_errors_exit_2(sample: Sample) -> None:
    proc = durably("show", cwd=sample.project, store=sample.store)
    assert proc.returncode == 2 and "Missing argument 'RUN'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_runs_of_a_script_run_as_main_are_loaded_from_the_script_not_its_module(
        tmp_path: Path) -> None:
    """A run of ``python job.py`` is the script's (``__main__.job``), not the module
    ``job``'s: named as ``job:main`` it is refused with the command that works (the run id
    alone: see test_cli_scripts.py), and fork loads the script."""
    store = tmp_path / "store"
    job = write_script(tmp_path / "job.py", """
        import durably

        @durably.task
        def double(x):
            return 2 * x

        @durably.entrypoint
        def main(x):
            return durably.interrupt(double(x))

        if __name__ == "__main__":
            print(main.run(2).id)
    """)
    run = run_script(job, script_env(store)).stdout.strip()
    fails(durably("resume", "job:main", run, cwd=tmp_path, store=store),
          "'__main__.job:main'", f"Fix: durably resume {run}")
    forked = durably("fork", run, cwd=tmp_path, store=store)
    assert forked.returncode == 3 and "waiting for 1 answer" in forked.stdout, forked.stderr
    why = ok(durably("explain", "job:double", "2", cwd=tmp_path, store=store))
    assert "no earlier entry of task 'job:double'" in why
    assert "entries of '__main__.job:double'" in why


def test_resume_and_history_of_a_stategraph_run(tmp_path: Path) -> None:
    project = tmp_path / "graphs"
    project.mkdir()
    shutil.copy(Path(__file__).resolve().parent.parent / "examples" / "graph_approval.py",
                project / "approval.py")
    store = project / "store"
    started = subprocess.run([sys.executable, "-m", "approval", "start", "owls"], cwd=project,
                             env=script_env(store), capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    run = started.stdout.split("run=")[1].split()[0]
    # the graph is named "approval" and bound to `app`: its identity is approval:approval
    text = ok(durably("resume", "approval:approval", run, "--value", '"approve"',
                      cwd=project, store=store))
    assert f"run {run!r} finished" in text and "A POST ABOUT OWLS" in text
    # by the name of the variable that holds the compiled graph, too
    again = subprocess.run([sys.executable, "-m", "approval", "start", "bats"], cwd=project,
                           env=script_env(store), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    second = again.stdout.split("run=")[1].split()[0]
    text = ok(durably("resume", "approval:app", second, "--value", '"approve"',
                      cwd=project, store=store))
    assert f"run {second!r} finished" in text and "A POST ABOUT BATS" in text
    history = ok(durably("history", run, cwd=project, store=store))
    assert "approval::superstep" in history and "→ next" in history


def test_cache_stats_counts_entries_written_while_it_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job writing meanwhile writes a batch's cache entries, then their key records: an
    entry newer than the key records cache_stats read first still counts under its task
    (it read as "(unknown task)": a running job's whole latest batch)."""
    from durably import DiskStore
    from durably._store.disk import maintenance as _maintenance
    from durably._store.records import KeyRecord

    store = DiskStore(tmp_path / "s")
    record = KeyRecord("m:t", "a" * 32, "c", {}, {}, 1.0)
    store.cache_put_many([("a" * 32, b"1", record)])
    real = _maintenance._key_tasks

    def then_a_batch(disk: DiskStore) -> dict[str, str]:
        found = real(disk)  # the key records as they were before the batch
        disk.cache_put_many([(k * 32, b"22", KeyRecord("m:t", k * 32, "c", {}, {}, 2.0))
                             for k in "bcd"])
        return found

    monkeypatch.setattr(_maintenance, "_key_tasks", then_a_batch)
    stats = _maintenance.cache_stats(store)
    assert stats["entries"] == 4 and stats["entry_bytes"] > 0
    assert [(t["task"], t["entries"], t["bytes"]) for t in stats["tasks"]] == [
        ("m:t", 4, stats["entry_bytes"])]


def test_cache_stats_cuts_a_long_task_name_so_its_table_stays_aligned(tmp_path: Path) -> None:
    """A task named with 5,000 characters: its row shows the first 59 characters of its
    identity and an ellipsis, and the table's rows are aligned; --json gives it whole."""
    from click.testing import CliRunner

    import durably as package
    from durably.cli import cli

    store = package.DiskStore(tmp_path / "store")
    long_name = "n" * 5000

    @package.task(name=long_name)
    def first(x: int) -> int:
        return x + 1

    @package.task
    def second(x: int) -> int:
        return x * 2

    package.configure(store=store)
    assert first(1) == 2 and second(2) == 4
    package.configure()
    store.close()
    text = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "cache", "stats"])
    assert text.exit_code == 0, text.output
    table = text.output[text.output.index("TASK"):].splitlines()
    # (its identity, module:name, cut to 60 characters)
    assert len(table) == 3 and "tests.test_cli:" + "n" * 44 + "…" in text.output
    assert "n" * 45 not in text.output
    assert len({len(line.rstrip()) for line in table}) <= 2  # (right-aligned numbers)
    assert max(len(line) for line in table) < 120
    whole = CliRunner().invoke(cli, ["--store", str(tmp_path / "store"), "cache", "stats",
                                     "--json"])
    assert any(t["task"].endswith(long_name) for t in json.loads(whole.output)["tasks"])
