"""Issue 34, round thirty-eight, grading.  A right answer that moved into a folder of its own
(``os.chdir("work")``) and read ``../ans.txt``, a file beside the notebook, scored 0: the judge
refused any relative path with ``..`` as written, not by where it leads.  Now one that stays in
the judge's folder is read; one that leaves it is still refused."""

from __future__ import annotations

from overlap_course.build import judge

from judged import IMPORTS, RIGHT_LOOP, needs_the_engine

_MOVED = '''
import os
with open("made.txt", "w") as f:
    f.write("kept")
os.makedirs("work", exist_ok=True)
os.chdir("work")
'''


def test_a_path_up_that_stays_in_the_folder_is_read_and_one_that_leaves_is_refused():
    needs_the_engine()
    reads = 'assert open("../made.txt").read() == "kept"\n'
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _MOVED, reads + RIGHT_LOOP])
    assert passed, message
    leaves = 'open("../../made.txt")\n'
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _MOVED, leaves + RIGHT_LOOP])
    assert not passed and "a relative path that leaves its folder (../../made.txt)" in message
