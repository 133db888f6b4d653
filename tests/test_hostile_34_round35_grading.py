"""Issue 34, round thirty-five, grading.  A right answer written by ``%%writefile helpers.py``
and loaded with ``%run helpers.py`` (IPython's usual way), or one whose cell begins with a line
that only shows something (``%pwd``, ``!echo``), scored 0 under real nbgrader: the judge refused
``%run``, ``%pwd`` and every shell line, though the learner's kernel ran them and the notebook's
own check passed.  Now ``%run FILE`` runs a file in the judge's folder as the kernel runs it,
``%pwd`` answers the folder, and a shell line is not run, and noted."""

from __future__ import annotations

import pytest

from overlap_course.build import judge
from overlap_course.build.judge_cells import run_cells

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

HELPER = '''%%writefile helpers.py
NAMES = ["kept"]
def double(x):
    return 2 * x
if __name__ == "__main__":
    ran_as_main = True
'''


def test_run_runs_a_file_of_the_folder_as_main_and_its_names_join_the_cells(tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    space, notes = run_cells([HELPER, "%run helpers.py", "four = double(2)", "here = %pwd"])
    assert not notes, notes
    assert space["four"] == 4 and space["NAMES"] == ["kept"] and space["ran_as_main"]
    assert space["here"] == str(tmp_path)
    assert space["double"].__code__.co_filename == "<submission %run helpers.py>"  # watched


@pytest.mark.parametrize("line, said", [
    ("%run -i helpers.py", "remove the options and arguments"),
    ("%run helpers.py one two", "remove the options and arguments"),
    ("%run ../helpers.py", "only a path inside the notebook's folder"),
    ("%run /etc/hostname", "only a path inside the notebook's folder"),
    ("%run missing.py", "FileNotFoundError"),
])
def test_run_refuses_what_the_judge_does_not_run_by_name(tmp_path, monkeypatch, line, said):
    monkeypatch.chdir(tmp_path)
    _, notes = run_cells([HELPER, line])
    assert len(notes) == 1 and said in notes[0], notes


def test_a_shell_line_is_not_run_and_noted_and_a_kept_output_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space, notes = run_cells(["!touch made_by_the_shell\nx = 1", "files = !ls"])
    assert space["x"] == 1 and not (tmp_path / "made_by_the_shell").exists()
    assert notes[0] == ("the shell line !touch made_by_the_shell was not run: the judge runs no "
                        "command")
    assert "code cell 2 raised NameError: the judge does not run shell commands" in notes[1], notes


def _in_a_file(loop: str) -> list[str]:
    return [IMPORTS, "%%writefile my_loop.py\n" + loop, "%run my_loop.py"]


def test_the_judge_grades_a_loop_loaded_by_run_as_written_inline():
    """Before: "code cell 2 raised NameError: the judge does not run the magic %run"."""
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", _in_a_file(RIGHT_LOOP))
    assert passed, message
    passed, message = judge.judge("check_serial_loop", ["%pwd\n!echo hi\n" + IMPORTS + RIGHT_LOOP])
    assert passed, message
    passed, message = judge.judge("check_serial_loop", _in_a_file(WRONG_LOOP))
    assert not passed, message
