"""Round 31 of issue 34, grading (each failed before its fix).

- The grading kernel was fenced by its ``exec_lines``, after ipykernel had started its
  threads; Landlock holds for the thread that asks (and what it starts later), so code a cell
  queued on ipykernel's IOPub thread ran unfenced: it read the solution and, from a process of
  its own, rewrote the gradebook (a wrong loop 3 of 3 with real nbgrader).  And the kernel was
  ``python -m ipykernel_launcher`` in the submission's folder, so a submitted
  ``ipykernel_launcher.py`` ran first, unfenced.  The kernel now starts as ``python -I``, fenced
  while it is one thread, before ipykernel and before the notebook's folder is on sys.path.
- The judge's audit hook named ``/proc/self/mem`` by ``os.path.realpath``, whose helper a cell
  rebound (``posixpath._joinrealpath``) to make the path look harmless: round 30's forgery
  passed again.  A path whose last part is ``mem`` or ``kcore`` is refused by C functions bound
  before the cells."""

from __future__ import annotations

import nbformat
import pytest

from overlap_course.build import judge, landlock

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine
from test_hostile_34_round30_judge import _FORGE

_BLIND = ("import os, posixpath\nposixpath._joinrealpath = "
          "lambda path, rest, strict, seen: (os.getcwd() + '/harmless', True)\n")


def test_a_cell_that_blinds_realpath_still_cannot_read_the_judges_memory():
    needs_the_engine()
    cheat = WRONG_LOOP + _BLIND + "MEMORY = '/proc/self/mem'\n" + _FORGE
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cheat])
    assert passed is False and "forged" not in message, message
    said = ("import posixpath\nKEEP = posixpath._joinrealpath\n" + _BLIND +
            # the loop is defined only if the open was refused, naming the memory; realpath
            # is put back first (the judge's own imports use it)
            "try:\n    open('/proc/self/mem', 'rb')\nexcept PermissionError as refused:\n"
            "    assert \"judge's own memory\" in str(refused), refused\n"
            "else:\n    raise AssertionError('opened')\n"
            "posixpath._joinrealpath = KEEP\n" + RIGHT_LOOP)
    passed, message = judge.judge("check_serial_loop", [IMPORTS, said])
    assert passed is True, message


@pytest.mark.parametrize("path, named", [("/proc/self/mem", True), (b"/proc/1/task/1/mem", True),
                                         ("mem", True), ("/proc/kcore/", True),
                                         ("memory.txt", False), ("/proc/self/maps", False),
                                         (3, False)])
def test_a_memory_file_is_named_by_its_last_part(path, named):
    assert landlock.memory_name()(path) is named


@pytest.mark.skipif(not landlock.abi(), reason="the grading kernel is fenced by Landlock")
def test_the_grading_kernel_is_fenced_on_every_thread_and_runs_no_launcher_it_is_given(tmp_path):
    """The Execute step of the course's autograde: a cell's code run on ipykernel's IOPub
    thread cannot read a file outside the kernel's fence, and an ``ipykernel_launcher.py``
    beside the notebook is not run."""
    outside, folder = tmp_path / "outside", tmp_path / "submission"
    outside.mkdir()
    folder.mkdir()
    (outside / "secret.txt").write_text("the solution")
    (folder / "ipykernel_launcher.py").write_text(
        f"open({str(outside / 'ran')!r}, 'w').close()\n"
        "import os, runpy, sys\nsys.path = [p for p in sys.path if p not in ('', os.getcwd())]\n"
        "del sys.modules['ipykernel_launcher']\n"
        "runpy.run_module('ipykernel_launcher', run_name='__main__', alter_sys=True)\n")
    cell = ("import time\nfrom ipykernel.kernelapp import IPKernelApp\nbox = {}\n"
            "def peek():\n    try:\n"
            f"        box['read'] = open({str(outside / 'secret.txt')!r}).read()\n"
            "    except OSError as e:\n        box['read'] = f'refused {e.errno}'\n"
            "IPKernelApp.instance().iopub_thread.io_loop.add_callback(peek)\n"
            "for _ in range(100):\n    if box:\n        break\n    time.sleep(0.05)\n"
            "print('iopub:', box.get('read'))\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    execute = next(step for step in judge.autograde_preprocessors()  # after ReadFilesBeside
                   if step.__name__ == "FencedExecute")(timeout=120)
    executed, _ = execute.preprocess(nb, {"metadata": {"path": str(folder)}})
    said = "".join(o.get("text", "") for o in executed.cells[0].outputs)
    assert "iopub: refused 13" in said, executed.cells[0].outputs
    assert not (outside / "ran").exists(), "the submitted ipykernel_launcher.py ran"
