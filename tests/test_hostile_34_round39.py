"""Issue 34, round thirty-nine.  A loop that did all its work and returned ``iter(completions)``
was refused as "a lazy iterator that nothing iterates", its finished run lost; a ``wants_more``
object whose ``__getattr__`` raises had that error replace the refusal of its answer; exercise
03's ``order`` written as a generator passed, used up by the check, so the figure below it
drew no "you wrote" row; and a right answer in a helper module submitted beside the notebook
scored 0 under nbgrader (the judge's folder held none of the submission's files).  Each failed
when written."""

from __future__ import annotations

import os

import pytest

import toy_engine as te
from overlap_course import checks
from overlap_course.build import judge, judge_beside
from overlap_course.labs import plugins

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
         ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]


@pytest.fixture(scope="module")
def engine():
    engine = te.Engine(te.EngineConfig(mode="serial", device="cpu"))
    yield engine
    engine.close()


def test_a_loop_that_did_its_work_may_return_an_iterator_over_data(engine):
    want = [c.text for c in engine.generate(["Once", "The cat"], max_new_tokens=6)]

    for answer in (lambda eng: iter(eng.completions), lambda eng: zip(eng.requests, "ab"),
                   lambda eng: enumerate([1, 2])):
        def loop(eng, answer=answer):
            te.loops.serial_loop(eng)
            return answer(eng)
        got = engine.generate(["Once", "The cat"], max_new_tokens=6, loop=loop)
        assert [c.text for c in got] == want


def test_an_iterator_that_holds_calls_is_still_refused(engine):
    for answer in (lambda eng: map(print, [1]), lambda eng: enumerate(map(print, [1])),
                   lambda eng: zip([1], (print(x) for x in [1]))):
        def loop(eng, answer=answer):
            te.loops.serial_loop(eng)
            return answer(eng)
        with pytest.raises(TypeError, match="returned a lazy iterator"):
            engine.generate(["Once"], max_new_tokens=3, loop=loop)
    assert engine.generate(["Once"], max_new_tokens=3)[0].finish_reason == "length"


def test_a_wants_more_objects_own_attribute_error_never_replaces_the_refusal():
    class Forgot:
        def __call__(self, req):
            return None  # forgot its `return True`

        def __getattr__(self, name):
            raise RuntimeError("no attributes here: " + name)
    engine = te.Engine(te.EngineConfig(mode="zos", device="cpu"))
    try:
        with pytest.raises(plugins.NotTrueOrFalse, match=r"per_request\(wants_more=Forgot\) "
                                                         r"returned None for prompt 0"):
            engine.generate(["Once"], max_new_tokens=8,
                            on_round=plugins.per_request(wants_more=Forgot()))
        assert engine.generate(["Once"], max_new_tokens=3)[0].finish_reason == "length"
    finally:
        engine.close()


def test_an_order_written_as_a_generator_is_refused_not_used_up():
    verdict = checks.check_three_rounds(pair for pair in ORDER)
    assert not verdict.passed and verdict.category == "shape"
    assert "an iterator, which its first reader (this check) uses up" in verdict.message
    assert checks.check_three_rounds(list(ORDER)).passed
    assert checks.check_three_rounds(tuple(ORDER)).passed


def test_the_judge_refuses_an_order_written_as_a_generator_as_the_checker_does():
    cells = ["ORDER = " + repr(ORDER) + "\n", "order = (pair for pair in ORDER)\n"]
    passed, message = judge.judge("check_three_rounds", cells)
    assert not passed and "is an iterator, which its first reader (the check) uses up" in message
    cells[1] = "order = list(ORDER)\n"
    assert judge.judge("check_three_rounds", cells) == (True, checks.check_three_rounds(
        ORDER).message)


def test_only_the_plain_files_submitted_beside_the_notebook_are_read(tmp_path):
    submitted, graded = tmp_path / "submitted", tmp_path / "autograded"
    for folder in (submitted, graded):
        folder.mkdir()
        (folder / "helpers.py").write_text("X = 1\n")
        (folder / "answer.txt").write_text("input_ids\n")
        (folder / "ex.ipynb").write_text("{}")
        (folder / "__pycache__").mkdir()
        os.symlink("/etc/hostname", folder / "link.txt")
    (graded / "course_data.txt").write_text("the course's own file, not submitted\n")
    assert judge_beside.read(graded, submitted) == ({"answer.txt": b"input_ids\n",
                                                     "helpers.py": b"X = 1\n"}, "")
    (graded / "big.bin").write_bytes(b"\0" * (judge_beside.MAX_BYTES + 1))
    (submitted / "big.bin").write_bytes(b"\0" * (judge_beside.MAX_BYTES + 1))
    files, why = judge_beside.read(graded, submitted)
    assert files == {} and "were not copied to the judge's folder" in why


def test_a_link_submitted_beside_the_notebook_never_reaches_a_judge(tmp_path):
    """Round 40: nbgrader's copy follows a submitted link, so the autograded folder held the
    instructor's source notebook as a plain file, which the judges were given."""
    import shutil

    from traitlets.config import Config

    source = tmp_path / "source" / "02_serial_loop"
    source.mkdir(parents=True)
    (source / "02_serial_loop.ipynb").write_text("the solution")
    submitted = tmp_path / "submitted" / "cheat" / "02_serial_loop"
    submitted.mkdir(parents=True)
    os.symlink("../../../source/02_serial_loop/02_serial_loop.ipynb", submitted / "sol.json")
    (submitted / "real_helpers.py").write_text("X = 1\n")
    os.symlink("real_helpers.py", submitted / "helpers.py")  # the learner's own file: kept
    graded = tmp_path / "autograded" / "cheat" / "02_serial_loop"
    graded.mkdir(parents=True)
    for name in ("sol.json", "helpers.py"):  # as nbgrader copies them: a link followed
        shutil.copy(submitted / name, graded / name)
    assert (graded / "sol.json").read_text() == "the solution"
    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    step = judge_beside.read_step()(config=config)
    _, resources = step.preprocess(None, {"metadata": {"path": str(graded)}, "nbgrader": {
        "student": "cheat", "assignment": "02_serial_loop"}})
    assert judge_beside.given(resources) == ({"helpers.py": b"X = 1\n"}, "")


def test_the_files_are_read_before_the_learners_kernel_runs():
    steps = judge.autograde_preprocessors()
    names = [step.__name__ for step in steps]
    assert names.index("ReadFilesBeside") < names.index("FencedExecute") < names.index(
        "JudgeInFreshProcess")


def test_a_loop_in_a_submitted_helper_module_is_judged_as_the_kernel_ran_it():
    needs_the_engine()
    cells = [IMPORTS, "from helpers import serial_loop\n"]
    passed, message = judge.judge("check_serial_loop", cells,
                                  files={"helpers.py": RIGHT_LOOP.encode()})
    assert passed, message
    passed, message = judge.judge("check_serial_loop", cells,
                                  files={"helpers.py": WRONG_LOOP.encode()})
    assert not passed, message
    passed, message = judge.judge("check_serial_loop", cells)
    assert not passed and "No module named 'helpers'" in message
