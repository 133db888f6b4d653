"""Issue 34, round forty.  A judge that forked its device processes' forkserver from itself (to
spare a second import of torch) gave that forkserver, and every process the cells asked it for,
the judge's memory: the report's writer with the run's secret bound in it, and no audit hook.
A wrong loop whose cells started such a process and signed "passed" scored full marks, and the
same route read the solutions.  Reverted: the forkserver is a new interpreter again, fenced, with
nothing of the judge's memory.  And ``%run helpers`` (IPython adds ``.py``) or ``%run
helpers.ipynb`` scored 0 with an error naming neither, and a package folder beside the
notebook (``helpers/``) with no word that folders are not copied.  Each failed when written."""

from __future__ import annotations

from overlap_course.build import judge

from judged import IMPORTS, WRONG_LOOP, needs_the_engine

_SIGNS = r'''
import gc, types
for o in gc.get_objects():
    if type(o) is types.FunctionType and o.__qualname__ == "_reporter.<locals>.write":
        o({"passed": True, "message": "forged by the forkserver's child"})
'''
_ASKS_THE_FORKSERVER = f'''
import multiprocessing, os
child = multiprocessing.get_context("forkserver").Process(target=exec, args=({_SIGNS!r},))
child.start()
child.join()
os._exit(0)
'''


def test_a_process_the_cells_ask_the_forkserver_for_cannot_sign_the_verdict():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP,
                                                        _ASKS_THE_FORKSERVER])
    assert not passed and "forged" not in message, message
    passed, message = judge.judge("check_serial_loop", [_ASKS_THE_FORKSERVER])
    assert not passed and "forged" not in message, message


def test_run_finds_a_file_as_ipython_does_and_names_a_notebook():
    """Round 40: ``%run helpers`` (IPython adds ``.py``) scored 0 with a FileNotFoundError, and
    ``%run helpers.ipynb`` with a PermissionError on the judge's temporary folder."""
    needs_the_engine()
    from judged import RIGHT_LOOP

    files = {"helpers.py": RIGHT_LOOP.encode()}
    passed, message = judge.judge("check_serial_loop", [IMPORTS, "%run helpers\n"], files=files)
    assert passed, message
    passed, message = judge.judge("check_serial_loop", [IMPORTS, "%run helpers.ipynb\n"],
                                  files=files)
    assert not passed and "the judge runs `%run` on a Python file only" in message, message


def test_a_folder_submitted_beside_the_notebook_is_named_when_the_check_fails(tmp_path):
    """Round 40: ``helpers/__init__.py`` scored 0 with only "No module named 'helpers'"."""
    from overlap_course.build import judge_beside

    for side in ("submitted", "autograded"):
        (tmp_path / side / "helpers").mkdir(parents=True)
        (tmp_path / side / "helpers" / "__init__.py").write_text("X = 1\n")
        (tmp_path / side / "data.txt").write_text("1\n")
    files, why = judge_beside.read(tmp_path / "autograded", tmp_path / "submitted")
    assert files == {"data.txt": b"1\n"}
    assert why.startswith("the folders submitted beside the notebook (helpers/) are not copied")
