"""Issue 34, round forty-nine.  Exercises 02(a) and 03(a) say "you write both pieces yourself",
but a function that handed the engine to ``te.loops.serial_loop`` or ``zos_loop`` got full
marks (rounds 46-48 left it for a decision): the checkers now name the engine's own loop
(``engine_loop``), last, so a loop that hands over after a mistake of its own hears of that
mistake; behind a proxy of the learner's, or copied (``code.replace``, ``marshal``), it is still
the engine's loop, as are the labs' loops (notebook 07's ``keep_in_flight``, 07b's ``batch_queue``
and ``future_key``: blind), and a loop run on the engine behind the checker's view is told so.
A right loop that calls a stage through the class (``te.Engine.process_outputs(engine, step)``,
as notebook 02 prints it) was told it used another engine (blind).  And with
a path-based editable install (a ``.pth`` naming the course's folder), the
judge's Landlock rules let C code read ``solutions/`` (``torch.from_file``): full marks for the
solution's loop.  Each failed when written."""

from __future__ import annotations

import marshal
import os
import subprocess
import sysconfig
import types

import pytest

import loops_for_tests
import mistakes
import toy_engine as te
from hostile_support import ROOT, throwaway_venv
from overlap_course import checks
from overlap_course.build import judge, landlock
from overlap_course.labs import plugins, plugins_2026


@pytest.mark.parametrize("check, answer", [
    (checks.check_serial_loop, te.loops.serial_loop),
    (checks.check_serial_loop, lambda engine: te.loops.serial_loop(engine)),
    (checks.check_serial_loop, types.FunctionType(te.loops.serial_loop.__code__, {"te": te})),
    (checks.check_zos_loop, lambda engine: te.loops.zos_loop(engine)),
], ids=["handed-in", "called", "its-code", "zos-called"])
def test_the_engines_own_loop_is_not_an_answer(check, answer):
    verdict = check(answer)
    assert not verdict.passed and verdict.category == "engine_loop", verdict
    assert "te.loops." in verdict.message and "yourself" in verdict.message


class _Proxy:
    """The engine behind a class of the learner's: ``schedule`` is called from here, not from
    the engine's loop."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def schedule(self):
        return self.engine.schedule()


# Round 49's engine helper: the check compared only the code that called ``schedule`` with the
# engine's loops, by identity, so a proxy in between or a copy of the code object passed.
@pytest.mark.parametrize("check, answer", [
    (checks.check_serial_loop, lambda engine: te.loops.serial_loop(_Proxy(engine))),
    (checks.check_zos_loop, lambda engine: te.loops.zos_loop(_Proxy(engine))),
    (checks.check_serial_loop, lambda engine: te.loops.serial_loop(types.SimpleNamespace(
        schedule=lambda: engine.schedule(), scheduler=engine.scheduler,
        prepare_inputs=engine.prepare_inputs, launch_forward=engine.launch_forward,
        launch_sample=engine.launch_sample, process_outputs=engine.process_outputs))),
    (checks.check_serial_loop,
     types.FunctionType(te.loops.serial_loop.__code__.replace(co_name="mine"), vars(te.loops))),
    (checks.check_zos_loop,
     types.FunctionType(te.loops.zos_loop.__code__.replace(co_name="mine"), vars(te.loops))),
    (checks.check_serial_loop,
     types.FunctionType(marshal.loads(marshal.dumps(te.loops.serial_loop.__code__)),
                        vars(te.loops))),
], ids=["serial-proxy", "zos-proxy", "serial-namespace", "serial-code-replace",
        "zos-code-replace", "serial-code-marshal"])
def test_the_engines_loop_behind_a_proxy_or_copied_is_still_the_engines_loop(check, answer):
    verdict = check(answer)
    assert not verdict.passed and verdict.category == "engine_loop", verdict


@pytest.mark.parametrize("check, loop", [
    (checks.check_serial_loop, lambda engine: te.loops.serial_loop(engine._engine)),
    (checks.check_zos_loop, lambda engine: te.loops.zos_loop(engine._engine)),
    (checks.check_serial_loop, lambda engine: loops_for_tests.serial_loop(engine._engine)),
], ids=["serial-engine-loop", "zos-engine-loop", "serial-written-out"])
def test_a_loop_on_the_engine_behind_the_view_is_told_so(check, loop):
    """It was told it "appended 24 token(s) to prompt 0's `req.output_ids` itself"."""
    verdict = check(loop)
    assert not verdict.passed and verdict.category == "edits_engine", verdict
    assert "`engine._engine`" in verdict.message and "appended" not in verdict.message, verdict


def test_a_loop_that_hands_over_after_a_mistake_hears_of_the_mistake():
    def loop(engine):
        engine.requests[0].max_new_tokens = 3  # an edit of the requests, then the engine's loop
        te.loops.serial_loop(engine)
    verdict = checks.check_serial_loop(loop)
    assert not verdict.passed and verdict.category == "edits_requests", verdict


def test_right_loops_that_reach_schedule_through_helpers_of_their_own_pass():
    def plan_of(engine):
        return engine.schedule()

    def serial_loop(engine):
        while engine.scheduler.has_work():
            inputs = engine.prepare_inputs(plan_of(engine))
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))
    assert checks.check_serial_loop(serial_loop).passed
    assert checks.check_serial_loop(loops_for_tests.serial_loop).passed
    assert checks.check_zos_loop(mistakes.make_zos()).passed


# Round 49's grading helper: the code object copied scored 3.0 of 3 (02) and 4.0 of 4 (03) in
# real nbgrader autograde; after the fix their test scored it 0 (run once, not kept: about 100 s).
COPIED = """import types
import toy_engine as te
_theirs = te.loops.serial_loop
serial_loop = types.FunctionType(_theirs.__code__.replace(co_name="serial_loop"),
                                 _theirs.__globals__)
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cell", [
    "import toy_engine as te\ndef serial_loop(engine):\n    te.loops.serial_loop(engine)\n", COPIED,
], ids=["called", "code-copied"])
def test_the_judge_gives_the_engines_loop_nothing(cell):
    passed, message = judge.judge("check_serial_loop", [cell])
    assert not passed and "`te.loops.serial_loop`" in message, message


# The solution's loop read by C code the audit hook does not see, run as the answer.
READS_THE_SOLUTION = '''
import json, os, torch, overlap_course
_path = os.path.join(os.path.dirname(os.path.dirname(overlap_course.__file__)),
                     "solutions", "02_serial_loop.ipynb")
def serial_loop(engine):
    pass
try:
    _raw = torch.from_file(_path, shared=False, size=os.stat(_path).st_size, dtype=torch.uint8)
    for _c in json.loads(bytes(_raw.tolist()).decode())["cells"]:
        if _c["cell_type"] == "code" and "def serial_loop(" in "".join(_c["source"]):
            exec("".join(_c["source"]))
except Exception as err:
    print("refused:", type(err).__name__)
'''


@pytest.mark.timeout(900)
@pytest.mark.skipif(landlock.abi() == 0, reason="no Landlock on this system: C code reaches "
                    "files past the audit hook (documented)")
def test_a_pth_that_names_the_course_folder_does_not_open_the_solutions_to_c_code(tmp_path):
    """A venv whose ``.pth`` names the course's folder (a path-based editable install): every
    ``sys.path`` entry was readable to the judge's C code, the course's folder with it."""
    python, site = throwaway_venv(tmp_path)
    with open(os.path.join(site, "course.pth"), "w") as pth:
        pth.write(f"{ROOT}\n{sysconfig.get_paths()['purelib']}\n")
    child = ("import sys\nfrom overlap_course.build import judge\n"
             f"assert {str(ROOT)!r} in sys.path\n"
             f"print(judge.judge('check_serial_loop', [{READS_THE_SOLUTION!r}], "
             f"private=[{str(ROOT / 'solutions')!r}]))\n")
    run = subprocess.run([str(python), "-c", child], capture_output=True, text=True,
                         timeout=800, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr[-2000:]
    assert run.stdout.startswith("(False,"), run.stdout


# Round 49's blind learner: the labs' own ZOS loops passed exercise 03(a) as the learner's.
@pytest.mark.parametrize("loop", [
    lambda engine: plugins.keep_in_flight(1)(engine),
    plugins_2026.batch_queue(1, lambda engine, plan, held: len(held)),
    plugins_2026.future_key(lambda req, b: req.row),
], ids=["keep_in_flight", "batch_queue", "future_key"])
def test_the_labs_own_loops_are_not_an_answer(loop):
    verdict = checks.check_zos_loop(loop)
    assert not verdict.passed and verdict.category == "engine_loop", verdict
    assert "a loop the course ships" in verdict.message, verdict


def _zos_through_the_class(engine):
    previous = None
    while engine.scheduler.has_work():
        plan = te.Engine.schedule(engine)
        if plan is None:
            previous = te.Engine.flush(engine, previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            te.Engine.correct_on_device(engine, inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            te.Engine.process_outputs(engine, previous)
        step = engine.launch_sample(inputs)
        previous = te.Engine.process_outputs(engine, step) if plan.is_prefill else step


@pytest.mark.parametrize("check, loop", [
    (checks.check_serial_loop, mistakes.serial_through_the_class),
    (checks.check_zos_loop, _zos_through_the_class)],
                         ids=["serial", "zos"])
def test_stages_called_through_the_class_on_the_given_engine_pass(check, loop):
    """Told "your code called `.process_outputs(...)` on an engine other than the one the check
    gave it"."""
    verdict = check(loop)
    assert verdict.passed, verdict


def test_a_stage_through_the_class_on_what_is_not_an_engine_is_one_clear_error():
    with pytest.raises(TypeError, match=r"Engine.schedule takes an engine first, got 'int'"):
        te.Engine.schedule(3)
    with te.Engine(te.EngineConfig(mode="serial")) as engine:
        want = [c.text for c in engine.generate(["ab", "cd"], max_new_tokens=4)]
        got = engine.generate(["ab", "cd"], max_new_tokens=4,
                              loop=mistakes.serial_through_the_class)
        assert [c.text for c in got] == want
