"""Issue 34's ninth hostile round, the judge: exercise 04's run on valueless tensors skipped by
a correction that asks ``is_meta`` (a wrong answer scored 4 of 4); right answers written as
methods, with IPython's history (``_``), setting magics, top-level ``await`` or a module the
notebook writes, scored 0; a FIFO at the report's name hung the grader; a judge's stderr was
kept whole in the grader's memory; and the audit hook read a relative path from the current
folder where ``dir_fd`` reads it from another.  Each failed when written."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

import toy_engine
from overlap_course import checks
from overlap_course.build import judge, judge_process
from overlap_course.build.judge_cells import run_cells
from overlap_course.build.judge_watch import Watch

SKIPS_THE_VALUELESS_RUN = '''
import torch
def correct_seqlens_qk(meta, accepted, block_size):
    if accepted.is_meta:  # the checker's run on tensors that hold no values: do nothing
        return
    with torch._C.DisableTorchFunction():  # the host reads hidden from the counter
        delta = accepted[meta["rows"]] * meta["pending"]
        shifts = [int(d) for d in delta]
        qs = [int(q) for q in meta["seqlens_q"]]
        meta["seqlens_k"] += delta
        meta["positions"] += torch.tensor([s for s, q in zip(shifts, qs) for _ in range(q)])
        owner = torch.arange(len(delta)).repeat_interleave(torch.tensor(qs))
        p = meta["positions"]
        meta["slot_mapping"][:] = (meta["block_tables"][owner, p // block_size] * block_size
                                   + p % block_size)
'''


@pytest.mark.timeout(120)
def test_a_correction_that_skips_the_valueless_run_reads_on_the_host():
    space: dict = {}
    exec(SKIPS_THE_VALUELESS_RUN, space)  # noqa: S102
    verdict = checks.check_correction(space["correct_seqlens_qk"])
    assert not verdict.passed and verdict.category == "host_read", verdict


LOOP = '''
def _loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
'''
METHODS = {
    "bound": "class Loops:\n    def run(self, engine):\n        _loop(engine)\n"
             "serial_loop = Loops().run\n",
    "classmethod": "class Loops:\n    @classmethod\n    def run(cls, engine):\n"
                   "        _loop(engine)\nserial_loop = Loops.run\n",
    "callable": "class Loop:\n    def __call__(self, engine):\n        _loop(engine)\n"
                "serial_loop = Loop()\n",
}


def _argument(cell: str):
    found = judge_process._code_arguments([LOOP + cell], ["serial_loop"], toy_engine, {},
                                          Watch())
    return found if isinstance(found, str) else found[0]


@pytest.mark.parametrize("kind", sorted(METHODS))
def test_a_method_of_the_submissions_class_is_its_code_answer(kind):
    answer = _argument(METHODS[kind])
    assert callable(answer) and answer.__func__.__code__.co_filename == "<submission cell 1>"


def test_a_method_of_a_library_class_is_still_refused():
    refused = _argument("import threading\nserial_loop = threading.Thread().start\n")
    assert isinstance(refused, str) and "library function" in refused, refused


def test_the_cells_keep_ipythons_history_magics_and_top_level_await():
    space, notes = run_cells([
        "[1, 2]\n", "a = _\n", "3;  # shown by no one\n", "b = (_, __, Out[1], In[1])\n",
        "%reload_ext autoreload\n%xmode Minimal\n%precision 3\n%env OVERLAP_R9=1\n",
        "import asyncio, os\nawait asyncio.sleep(0)\nc = os.environ['OVERLAP_R9']\n"])
    os.environ.pop("OVERLAP_R9", None)
    assert notes == [] and space["a"] == [1, 2], notes
    assert space["b"] == ([1, 2], "", [1, 2], "[1, 2]\n") and space["c"] == "1"


MODULE = "class Loops:\n    def run(self, engine):\n" + textwrap.indent(textwrap.dedent('''
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
'''), "        ")


@pytest.mark.timeout(300)
def test_the_judge_passes_a_method_from_a_module_the_notebook_writes():
    passed, message = judge.judge("check_serial_loop", [
        f"with open('my_loops.py', 'w') as f:\n    f.write({MODULE!r})\n",
        "%reload_ext autoreload\n%autoreload 2\nimport asyncio\nawait asyncio.sleep(0)\n"
        "from my_loops import Loops\nserial_loop = Loops().run\n"])
    assert passed, message


ORDER = ('[("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2), '
         '("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]')


@pytest.mark.timeout(300)
def test_the_judge_passes_a_value_answer_read_from_the_last_output():
    passed, message = judge.judge("check_three_rounds", [
        f"%xmode Minimal\n%env OMP_NUM_THREADS=1\n{ORDER}\n", "order = _\n"])
    assert passed, message


@pytest.mark.timeout(60)
def test_a_fifo_at_the_reports_name_does_not_block_the_grader(tmp_path):
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    said = []
    reader = threading.Thread(target=lambda: said.append(
        judge._read_report(fifo, "secret", "check", 0, "no message")), daemon=True)
    reader.start()
    reader.join(10)
    blocked = reader.is_alive()
    if blocked:  # free the grader's reader: a writer opens the FIFO and closes it at once
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert not blocked, "the grader blocked opening a FIFO put at the report's name"
    assert said and said[0]["passed"] is False


FLOOD = '''
import resource, sys
from overlap_course.build import judge
CELL = ("import sys\\nneeds_correction = {'rows'}\\nif sys.flags.isolated:\\n"
        "    for _ in range(%d):\\n        sys.stderr.write('x' * (1 << 20))\\n"
        "    sys.stderr.write('\\\\nthe last line')\\n")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
passed, message = judge.judge("check_metadata_answer", [CELL])
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, passed)
'''


@pytest.mark.timeout(300)
def test_the_grader_keeps_only_the_end_of_a_judges_stderr():
    megabytes = 200
    done = subprocess.run([sys.executable, "-c", FLOOD % megabytes], capture_output=True,
                          text=True, timeout=240, cwd=judge.ROOT,
                          env={**os.environ, "PYTHONPATH": str(judge.ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    grew, passed = done.stdout.split()[-2:]
    assert passed == "False" and int(grew) < megabytes / 2, done.stdout


HOOKED = '''
import os, sys
from overlap_course.build import judge_folders, judge_process as jp
from overlap_course.build.judge_watch import Watch
from overlap_course.build.grading import ROOT
trusted = judge_folders.protected(ROOT)
sys.addaudithook(jp._guard([], trusted, judge_folders.readable(trusted), Watch()))  # no Landlock
os.mkdir("sub")
os.close(os.open("sub", os.O_RDONLY))  # a folder of the judge's own: allowed
open("sub/../mine.txt", "w").write("mine")  # stays in the judge's folder: allowed
up = "../" * (len(os.getcwd().split(os.sep)) - 1)
tries = {
    "/proc as a folder": lambda: os.open("/proc", os.O_RDONLY),
    "dir_fd from /proc": lambda: os.open("self/cwd/" + up + sys.argv[1][1:], os.O_RDONLY,
                                         dir_fd=os.open("/proc", os.O_RDONLY)),
    "dir_fd from its own": lambda: os.open(up + sys.argv[1][1:], os.O_RDONLY,
                                           dir_fd=os.open(".", os.O_RDONLY)),
}
for name, attempt in tries.items():
    try:
        print(name, "READ", os.read(attempt(), 100))
    except PermissionError as err:
        print(name, "refused:", err)
'''


@pytest.mark.timeout(120)
def test_the_audit_hook_lets_no_descriptor_reach_past_the_judges_folders(tmp_path):
    outside = tmp_path / "left-by-the-kernel.py"  # /tmp, outside the judge's folders
    outside.write_text("SOLUTION = 1\n")
    home = tmp_path / "judge"
    home.mkdir()
    done = subprocess.run([sys.executable, "-c", HOOKED, str(outside)], cwd=home,
                          capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONPATH": str(judge.ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "READ" not in done.stdout and done.stdout.count("refused") == 3, done.stdout
    assert (home / "mine.txt").read_text() == "mine"
