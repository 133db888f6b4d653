"""Round 32 of issue 34, grading (failed before its fix): the grading kernel may write its own
folder, where nbgrader has put the notebook it grades; a cell replaced that notebook by a link,
and nbgrader, unfenced, wrote the graded notebook through it -- over another student's
submission (whose right loop then scored 0), the gradebook (every grade lost) or
``nbgrader_config.py`` (the next run graded without the judge: a wrong loop full marks).  A
fenced process now makes no link and no FIFO, not even in its own folders."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest

from overlap_course.build import judge, landlock

pytestmark = pytest.mark.skipif(not landlock.abi(), reason="the fence is Landlock's")


def test_a_fenced_process_makes_no_link_and_no_fifo_in_its_own_folder(tmp_path):
    probe = ("import os, sys\nfrom overlap_course.build import landlock\n"
             "assert landlock.restrict([], [sys.argv[1]]) is None\n"
             "os.chdir(sys.argv[1])\nopen('file', 'w').write('fine')\n"
             "for make in (lambda: os.symlink('/etc/hostname', 'link'),\n"
             "             lambda: os.mkfifo('fifo')):\n"
             "    try:\n        make()\n    except PermissionError:\n        print('refused')\n")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["refused", "refused"], done.stdout + done.stderr
    assert (tmp_path / "file").read_text() == "fine"


def test_the_grading_kernel_cannot_replace_its_notebook_by_a_link(tmp_path):
    folder, other = tmp_path / "autograded", tmp_path / "submitted.ipynb"
    folder.mkdir()
    other.write_text("another student's notebook")
    cell = ("import os\nos.remove('graded.ipynb')\ntry:\n"
            f"    os.symlink({str(other)!r}, 'graded.ipynb')\n"
            "except PermissionError as e:\n    print('refused', e.errno)\n")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, folder / "graded.ipynb")
    execute = next(step for step in judge.autograde_preprocessors()  # after ReadFilesBeside
                   if step.__name__ == "FencedExecute")(timeout=120)
    executed, _ = execute.preprocess(nb, {"metadata": {"path": str(folder)}})
    said = "".join(o.get("text", "") for o in executed.cells[0].outputs)
    assert "refused 13" in said, executed.cells[0].outputs
    assert not (folder / "graded.ipynb").is_symlink()
    assert other.read_text() == "another student's notebook"
