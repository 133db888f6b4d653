"""Issue 34, round fifty.  Grading: the engine's loop rebuilt from its code object with a part
changed (an extra constant, renamed locals, another docstring: nothing typed) was no longer "the
same code", and scored 3.0 of 3 in real nbgrader autograde: code that says it comes from a
shipped loop's file, above a ``schedule()`` call, is that loop now.  Engine: in exercise 05 a
stage refused inside the plug-in and caught passed when called through the class
(``te.Engine.schedule(engine)`` skips the check's stand-ins; the run now notes each refusal
itself); a stage called through the class on an object holding the same unbound function, or a
partial bound to itself, met a bare TypeError naming ``self`` or a RecursionError.  Blind:
exercise 04(a) passed a correction that builds its token-to-request map with ``torch.arange(B)``
and no ``device=`` (right on a CPU, tensors on two devices on a GPU).  Each failed when
written."""

from __future__ import annotations

import contextlib
import functools
import types

import pytest

import mistakes
import toy_engine as te
from judged import needs_the_engine
from overlap_course import checks
from overlap_course.build import judge

IMPORTS = "import toy_engine as te\nfrom overlap_course import checks\n"

# The engine's serial loop with one unused constant appended (the docstring and every line
# as shipped)
SERIAL_EXTRA_CONST = (
    "import types\nimport toy_engine as te\n"
    "c = te.loops.serial_loop.__code__\n"
    "serial_loop = types.FunctionType(c.replace(co_consts=c.co_consts + (0,)),\n"
    "                                 te.loops.__dict__)\n")
# The engine's serial loop with its local names renamed by code.replace (nothing typed)
SERIAL_RENAMED_LOCALS = (
    "import types\nimport toy_engine as te\n"
    "c = te.loops.serial_loop.__code__\n"
    "serial_loop = types.FunctionType(\n"
    "    c.replace(co_varnames=tuple(v + '_' for v in c.co_varnames)), te.loops.__dict__)\n")
# The engine's ZOS loop with its docstring swapped by code.replace
ZOS_OTHER_DOCSTRING = (
    "import types\nimport toy_engine as te\n"
    "c = te.loops.zos_loop.__code__\n"
    "zos_loop = types.FunctionType(c.replace(co_consts=('mine',) + c.co_consts[1:]),\n"
    "                              te.loops.__dict__)\n")


@pytest.mark.parametrize("check, cell", [("check_serial_loop", SERIAL_EXTRA_CONST),
                                         ("check_serial_loop", SERIAL_RENAMED_LOCALS),
                                         ("check_zos_loop", ZOS_OTHER_DOCSTRING)],
                         ids=["extra_const", "renamed_locals", "zos_other_docstring"])
def test_the_engines_loop_rebuilt_from_its_code_is_still_the_engines(check, cell):
    needs_the_engine()
    passed, message = judge.judge(check, [IMPORTS, cell])
    assert not passed and "te.loops." in message, message


def _right(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        engine.scheduler.release_if_done(req)


def _schedule_through_the_class(engine, step):
    with contextlib.suppress(Exception):
        te.Engine.schedule(engine)  # StageInPlugin, caught
    _right(engine, step)


def _itself_through_the_class(engine, step):
    with contextlib.suppress(Exception):
        te.Engine.process_outputs(engine, step)  # StageInPlugin (it would call itself), caught
    _right(engine, step)


# serious by the course's rule: `engine.schedule()` here is NOT YET refusal_caught; through the
# class it skips step_watch's stand-ins and passes.
@pytest.mark.parametrize("plugin", [_schedule_through_the_class, _itself_through_the_class],
                         ids=["schedule", "process_outputs"])
def test_exercise_05_a_refusal_through_the_class_caught_is_named(plugin):
    verdict = checks.check_process_outputs(plugin)
    assert not verdict.passed and verdict.category == "refusal_caught", verdict


class _ToTheClass:
    def __getattr__(self, name):
        return getattr(te.Engine, name)


# medium: "RoundStages.schedule() missing 1 required positional argument: 'self'", or the
# next argument's type named ('str').
@pytest.mark.parametrize("obj", [
    types.SimpleNamespace(schedule=te.Engine.schedule, prepare_inputs=te.Engine.prepare_inputs),
    _ToTheClass(), te.Engine], ids=["namespace", "getattr-to-the-class", "the-class"])
def test_a_stage_through_the_class_on_an_object_holding_the_same_function_is_one_clear_error(obj):
    with pytest.raises(TypeError, match=r"Engine.schedule takes an engine first"):
        te.Engine.schedule(obj)
    with pytest.raises(TypeError, match=r"Engine.prepare_inputs takes an engine first, got "
                                        r"(?!'str')"):
        te.Engine.prepare_inputs(obj, "plan")


class _Partial:
    def __getattr__(self, name):
        return functools.partial(getattr(te.Engine, name), self)


# medium: a RecursionError out of the engine's stage wrapper.
def test_a_stage_through_the_class_on_a_proxy_binding_it_to_itself_is_not_a_recursion_error():
    with pytest.raises(TypeError, match=r"Engine.schedule takes an engine first"):
        te.Engine.schedule(_Partial())


def test_a_correction_that_makes_its_index_on_the_host_is_named():
    verdict = checks.check_correction(mistakes.correction_arange_on_the_host)
    assert not verdict.passed and verdict.category == "host_tensor", verdict
    assert "device=" in verdict.message and "repeat_interleave" in verdict.message, verdict
    assert checks.check_correction(mistakes.correction).passed  # made where the metadata lives
