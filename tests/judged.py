"""What the tests that run the real grading judge share: whether a judge process here can start
the engine, and the serial loops they hand it (one right, one wrong in a way only the
reference shows)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from overlap_course.build import judge, judge_process


@functools.lru_cache(maxsize=1)
def _judge_runs_the_engine() -> bool:
    """Whether a judge process can start the engine's device process: where the course is
    installed from ROOT (a worktree beside an editable install elsewhere: its device process
    imports the other tree, outside the judge's fence)."""
    found = subprocess.run([sys.executable, "-I", "-c",
                            "import toy_engine as t; print(t.__file__)"],
                           capture_output=True, text=True, timeout=120, cwd=os.sep)
    return found.stdout.strip().startswith(str(judge.ROOT) + os.sep)


def needs_the_engine() -> None:
    if not _judge_runs_the_engine():
        pytest.skip("the judge's engine imports toy_engine from another tree than ROOT")


IMPORTS = "import toy_engine as te\nfrom overlap_course import checks\n"
WRONG_LOOP = '''
from toy_engine import buffers

def serial_loop(engine):   # wrong: the first sampled token of each round is overwritten
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        if len(engine.requests) == 4:
            engine.device.host(buffers.out_buffer(step.slot), "w")[0] = 5
        engine.process_outputs(step)
'''
RIGHT_LOOP = '''
def serial_loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.device.wait(step.sample_done)
        engine.process_outputs(step)
'''


def judge_began() -> tuple:
    """What the judge notes before the cells, for tests that call its verdict in this process:
    the forkserver's pid and identity (started as the judge starts its own, not pinned: later
    tests here use any) and the fingerprint, taken after it as the judge takes it."""
    from toy_engine import judged_forkserver, process_device as device

    pid = judged_forkserver.running(device._FORKSERVER_PRELOAD, device.without_main_module)
    return judge_process._fingerprint(), (pid, judged_forkserver.identity(pid))


def serial_loop_scores(home, students: dict) -> dict:
    """Real nbgrader on exercise 02 in a course made at ``home``: each student's submission is
    the solution with its loop replaced by ``answer`` (None: the solution's own) and a cell
    ``extra`` after it; their ``check_serial_loop`` scores, as the gradebook records them."""
    import nbformat
    from nbgrader.api import Gradebook
    from overlap_course.build import grading
    from test_grading import _nbgrader

    name = "02_serial_loop"
    grading.course(home, assignments=[name])
    _nbgrader(home, "generate_assignment", name, "--force")
    released = nbformat.read(home / "release" / name / f"{name}.ipynb", as_version=4)
    solved = nbformat.read(judge.ROOT / "solutions" / f"{name}.ipynb", as_version=4)
    for student, (answer, extra) in students.items():
        nb, cells = nbformat.from_dict(released), []
        for cell, source in zip(nb.cells, solved.cells):
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution"):
                cell.source = source.source
                if meta["grade_id"] == "answer_serial_loop" and answer is not None:
                    cell.source = answer
                    cells += [cell, nbformat.v4.new_code_cell(extra)]
                    continue
            cells.append(cell)
        nb.cells = cells
        (home / "submitted" / student / name).mkdir(parents=True)
        nbformat.write(nb, home / "submitted" / student / name / f"{name}.ipynb")
    _nbgrader(home, "autograde", name, "--force")
    with Gradebook(f"sqlite:///{home / 'gradebook.db'}") as book:
        return {s: book.find_grade("check_serial_loop", name, name, s).score for s in students}


# A wrong loop (the first sampled token of each 4-prompt round overwritten) and a thread it
# starts that rebinds two of the checker's helpers after the compare at the loop's return; the
# loop's next call puts them back (round 22)
THREAD_CHEAT = WRONG_LOOP + '''
import functools, io, operator, sys, threading
wrong_loop = serial_loop
from overlap_course.checks import lesson02 as L, pool
ORIG = (pool.compare, L.serial_same_run)
QUIET = functools.partial(print, file=io.StringIO())  # C callables: None for any arguments
resume = threading.Event()
state = {"calls": 0, "t": None, "returning": False}
def spy():
    for _ in range(4):
        while not state["returning"]:
            pass
        state["returning"] = False
        seen = False
        while True:  # the compare sets a long switch interval while it runs
            if sys.getswitchinterval() >= 1.0:
                seen = True
            elif seen or not state["real"]._running.locked():
                break
        pool.compare, L.serial_same_run = operator.is_, QUIET
        resume.wait(); resume.clear()
def serial_loop(engine):
    state["calls"] += 1
    state["real"] = object.__getattribute__(engine, "_engine")
    if state["calls"] == 1:
        sys.setswitchinterval(1e-5)
        state["t"] = threading.Thread(target=spy, daemon=True); state["t"].start()
    else:
        pool.compare, L.serial_same_run = ORIG
        resume.set()
        if state["calls"] == 5:
            state["t"].join()
            sys.setswitchinterval(0.005)
    wrong_loop(engine)
    if state["calls"] < 5:
        state["returning"] = True
'''


def running_with(mark: str) -> list[int]:
    """The processes still running (not zombies) whose command line holds ``mark``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if mark.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] != "Z":
                    found.append(int(pid))
        except OSError:
            pass
    return found
