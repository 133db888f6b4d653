"""Issue 34, round eleven, grading: right answers the kernel's checker passes scored 0 in the
judge, or the judge ran another call than the kernel: ``order`` pairs written as dataclass
instances (refused for the ``__eq__`` dataclasses wrote), a method under ``functools.cache``
or ``lru_cache`` (refused), a ``functools.partial`` whose arguments reached the function as
other types (an array as a list, a namedtuple as a tuple), and a helper module written by
``%%writefile`` (refused; the judge's message named the import that failed after it, not the
cell).  The kernel's checker and the judge must agree.  Each failed when written."""

from __future__ import annotations

import sys
import threading
import uuid

import pytest

import toy_engine
from overlap_course import checks
from overlap_course.build import judge, judge_process, judge_values
from overlap_course.build.grading import CONTEXT_RUNS
from overlap_course.build.judge_cells import run_cells
from overlap_course.build.judge_watch import Watch
from overlap_course.build.judge_keep import keeper

from judged import judge_began, needs_the_engine


RIGHT_ORDER = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
               ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]


def _cells_space(source: str) -> dict:
    """The namespace the kernel's cell makes (its code named as a submission's cell)."""
    space: dict = {}
    exec(compile(source, "<submission cell 1>", "exec"), space)  # noqa: S102 - the test's text
    return space


def _judged_here(check: str, cells: list[str], names: list[str], runs: dict | None = None):
    """The check process's own steps, in this process (without the audit hook and Landlock,
    which no test process can take back): the fingerprint before the cells, the judge's
    arguments read from them, the check's watched verdict."""
    began, threads, watch = judge_began(), set(threading.enumerate()), Watch()
    restore = keeper()
    args = judge_process._code_arguments(cells, names, toy_engine, runs or {}, watch, restore)
    assert not isinstance(args, str), args
    return judge_process._verdict(getattr(checks, check), args, began, threads,
                                  checks.Verdict, watch, restore)


# ------------------------------------------------------------------ 1: dataclass pairs

RECORDS = {
    "dataclass": "import dataclasses\n@dataclasses.dataclass\nclass Step:\n"
                 "    stage: str\n    round: int\n"
                 "    def __iter__(self):\n        return iter(dataclasses.astuple(self))\n",
    "frozen-dataclass": "import dataclasses\n@dataclasses.dataclass(frozen=True, order=True)\n"
                        "class Step:\n    stage: str\n    round: int\n"
                        "    note: str = dataclasses.field(default='', compare=False)\n"
                        "    def __iter__(self):\n"
                        "        yield self.stage\n        yield self.round\n",
    "namedtuple": "import collections\nStep = collections.namedtuple('Step', 'stage round')\n",
    "NamedTuple": "import typing\nclass Step(typing.NamedTuple):\n    stage: str\n    round: int\n",
}


def _order_cell(kind: str) -> str:
    return RECORDS[kind] + f"order = [Step(s, r) for s, r in {RIGHT_ORDER!r}]\n"


@pytest.mark.parametrize("kind", sorted(RECORDS))
def test_pairs_written_as_records_cross_as_the_checker_unpacks_them(kind):
    order = _cells_space(_order_cell(kind))["order"]
    assert checks.check_three_rounds(order).passed
    sent = judge_values.decode(judge_values.encode(order))
    assert sent == RIGHT_ORDER and all(type(pair) is tuple for pair in sent)
    assert checks.check_three_rounds(sent).passed


def test_a_dataclass_the_checker_cannot_unpack_fails_in_the_judge_too():
    order = _cells_space("import dataclasses\n@dataclasses.dataclass\nclass Step:\n"
                         "    stage: str\n    round: int\n"
                         f"order = [Step(s, r) for s, r in {RIGHT_ORDER!r}]\n")["order"]
    assert not checks.check_three_rounds(order).passed
    with pytest.raises(ValueError, match=r"Step is not a plain .*dataclasses\.astuple"):
        judge_values.encode(order)


@pytest.mark.parametrize("cell", [
    "import dataclasses\n@dataclasses.dataclass\nclass Step:\n    stage: str\n    round: int\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __iter__(self):\n        return iter(dataclasses.astuple(self))\n"
    "value = Step('forward', 1)\n",
    "import dataclasses\n@dataclasses.dataclass(eq=False)\nclass Step:\n    stage: str\n"
    "    def __iter__(self):\n        return iter(dataclasses.astuple(self))\n"
    "Step.__eq__ = lambda self, other: True\nvalue = Step('forward')\n",
    "import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass Name(str):\n"
    "    tag: int = 0\nvalue = {Name('seqlens_k')}\n",
], ids=["own-eq", "eq-set-later", "str-subclass"])
def test_an_eq_the_submission_wrote_is_still_refused_in_a_dataclass(cell):
    with pytest.raises(ValueError, match="__eq__` of its own"):
        judge_values.encode(_cells_space(cell)["value"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["dataclass", "NamedTuple"])
def test_the_judges_reading_of_a_record_order_is_the_kernels(kind):
    """The reading process alone (its audit hook and fence): the check's own process runs the
    engine (see the tests below)."""
    request = {"check": "check_three_rounds", "names": ["order"], "cells": [_order_cell(kind)],
               "private": []}
    read = judge._run_judge("answers", request, judge.compiled_digest())
    assert "values" in read, read
    [sent] = [judge_values.decode(v) for v in read["values"]]
    assert checks.check_three_rounds(sent).passed


# ------------------------------------------- 2 and 3: caches, partials, methods as they are

RECORDER = '''
import functools, types, collections
import numpy as np
def _record(*args, **keywords):
    return [type(a).__name__ for a in args] + sorted(keywords)
P = collections.namedtuple("P", "which")
class Holder:
    pass
'''
WRAPPED = {
    "cache-method": "class Loops:\n    @functools.cache\n    def run(self, *a):\n"
                    "        return _record(self, *a)\nanswer = Loops().run\n",
    "lru-method": "class Loops:\n    @functools.lru_cache(maxsize=4, typed=True)\n"
                  "    def run(self, *a):\n        return _record(self, *a)\n"
                  "answer = Loops().run\n",
    "cache-classmethod": "class Loops:\n    @classmethod\n    @functools.cache\n"
                         "    def run(cls, *a):\n        return _record(cls, *a)\n"
                         "answer = Loops.run\n",
    "cache-call": "class Loop:\n    @functools.cache\n    def __call__(self, *a):\n"
                  "        return _record(self, *a)\nanswer = Loop()\n",
    "partial-array": "answer = functools.partial(_record, np.array([1.0]), np.int64(2),"
                     " pick=P('idle'), lanes=(1, 2))\n",
    "partial-of-cache": "answer = functools.partial(functools.cache(_record), P('idle'))\n",
    "cache-of-partial": "answer = functools.cache(functools.partial(_record, P('idle')))\n",
    "method-of-partial": "answer = types.MethodType(functools.partial(_record, np.float32(1)),"
                         " Holder())\n",
}


@pytest.mark.parametrize("kind", sorted(WRAPPED))
def test_the_judge_calls_a_wrapped_answer_as_the_kernel_does(kind):
    cell = RECORDER + WRAPPED[kind]
    kernel = _cells_space(cell)["answer"]
    judged = judge_process._code_arguments([cell], ["answer"], toy_engine, {}, Watch())
    assert not isinstance(judged, str), judged
    assert judged[0]("x") == kernel("x") == judged[0]("x")  # the second: from its cache


def test_a_cached_answer_keeps_its_cache_an_unhashable_argument_raises_in_both():
    cell = RECORDER + "@functools.lru_cache(maxsize=8)\ndef answer(meta, block_size):\n" \
                      "    return _record(meta, block_size)\n"
    kernel = _cells_space(cell)["answer"]
    [judged] = judge_process._code_arguments([cell], ["answer"], toy_engine, {}, Watch())
    assert judged.cache_parameters() == kernel.cache_parameters()
    assert judged.__wrapped__.__code__.co_filename == "<submission cell 1>"
    for call in (kernel, judged):
        with pytest.raises(TypeError, match="unhashable"):
            call({"seqlens_k": [1]}, 4)


TAMPERED = {
    "parameters": "answer = functools.cache(_record)\n_said = answer.cache_parameters\n"
                  "dict(zip(_said.__code__.co_freevars, _said.__closure__))['maxsize']"
                  ".cell_contents = functools.partial(getattr, print)\n",
    "cache-info": "class _Info:\n    def __new__(cls, *a):\n"
                  "        return functools._CacheInfo(0, 0, functools.partial(getattr, print), 0)"
                  "\nanswer = functools._lru_cache_wrapper(_record, None, False, _Info)\n"
                  "answer.__wrapped__ = _record\n",
}


@pytest.mark.parametrize("kind", sorted(TAMPERED))
def test_a_cache_with_tampered_parameters_is_remade_as_a_plain_cache(kind):
    """``lru_cache(maxsize=f)`` calls ``f`` on the function: a callable put in the place of
    the size would choose what the judge runs."""
    cell = RECORDER + TAMPERED[kind]
    kernel = _cells_space(cell)["answer"]
    [judged] = judge_process._code_arguments([cell], ["answer"], toy_engine, {}, Watch())
    assert type(judged) is type(kernel) and judged("x") == kernel("x") == ["str"]
    assert judged.cache_info().maxsize is None
    assert judged.__wrapped__.__code__.co_filename == "<submission cell 1>"


@pytest.mark.parametrize("cell", [
    "answer = types.MethodType(functools.partial(max, 1), Holder())\n",
    "class Loops:\n    @functools.cache\n    def run(self):\n        pass\n"
    "Loops.run.__wrapped__ = print\nanswer = Loops().run\n",
    "class Loops:\n    @classmethod\n    def run(cls):\n        pass\n"
    "answer = Loops.__dict__['run']\n",
], ids=["library-under-a-method", "cache-of-a-library-function", "classmethod-object"])
def test_what_is_not_the_submissions_function_is_still_refused(cell):
    refused = judge_process._code_arguments([RECORDER + cell], ["answer"], toy_engine, {},
                                            Watch())
    assert isinstance(refused, str) and "must be a function your cells define" in refused


LOOP = '''
import functools
def _loop(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.process_outputs(engine.launch_sample(inputs))
class Loops:
    @functools.cache
    def run(self, engine):
        _loop(engine)
'''


@pytest.mark.timeout(300)
def test_a_cached_method_gets_the_kernels_verdict():
    cell = LOOP + "serial_loop = Loops().run\n"
    kernel = checks.check_serial_loop(_cells_space(cell)["serial_loop"])
    assert kernel.passed, kernel
    assert _judged_here("check_serial_loop", [cell], ["serial_loop"]) == {
        "passed": True, "message": kernel.message}


ENGINE = '''
import toy_engine as te
engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
engine.generate(["Once upon a time", "The bird said", "There was a fox"], max_new_tokens=24)
'''
SHARE = '''
import functools, collections
import numpy as np
def _share(lanes, timeline, pick):
    idle = sum(end - start for start, end in timeline.device_gaps())
    busy = timeline.device_busy_ms()
    return float(np.dot(lanes, [idle, busy])) / (idle + busy) if pick.which == "idle" else 0.0
P = collections.namedtuple("P", "which")
idle_fraction = functools.partial(_share, np.array([1.0, 0.0]), pick=P("idle"))
'''


@pytest.mark.timeout(300)
def test_a_partial_of_an_array_and_a_namedtuple_gets_the_kernels_verdict():
    space = _cells_space(ENGINE + SHARE)
    kernel = checks.check_idle_fraction(space["idle_fraction"], space["engine"])
    assert kernel.passed, kernel
    runs = {"engine": judge_process._judges_run(CONTEXT_RUNS["engine"], toy_engine)}
    assert _judged_here("check_idle_fraction", [ENGINE, SHARE], ["idle_fraction", "engine"],
                        runs) == {"passed": True, "message": kernel.message}


@pytest.mark.timeout(600)
def test_the_judge_passes_a_partial_of_an_array_and_a_namedtuple():
    needs_the_engine()
    passed, message = judge.judge("check_idle_fraction", [ENGINE, SHARE])
    assert passed, message


# ------------------------------------------------------------------ 4: %%writefile


@pytest.fixture
def module_name(tmp_path, monkeypatch):
    """A fresh module name, importable from ``tmp_path`` (the judge's folder here)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"r11_helpers_{uuid.uuid4().hex[:8]}"
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("magic", ["%%writefile {name}.py", "%%file '{name}.py'",
                                   "%%writefile {{name}}.py"])
def test_writefile_writes_the_cells_module_for_a_later_cell(module_name, magic):
    space, notes = run_cells([
        f"name = {module_name!r}\n",
        magic.format(name=module_name) + "\nORDER = [('forward', 1)]\n",
        f"%%writefile -a {module_name}.py\nORDER.append(('sample', 1))\n",
        f"from {module_name} import ORDER\norder = ORDER\n"])
    assert notes == [] and space["order"] == RIGHT_ORDER[:2], notes


def test_writefile_outside_the_judges_folder_names_the_cell_and_the_fix(module_name, tmp_path):
    outside = tmp_path.parent / f"{module_name}.py"
    space, notes = run_cells([f"%%writefile {outside}\nORDER = []\n",
                              f"from {module_name} import ORDER\norder = ORDER\n"])
    assert not outside.exists() and "order" not in space
    said = judge_process._missing("order", notes)
    assert said.index("code cell 1 raised PermissionError: %%writefile") < said.index("cell 2")
    assert "%%writefile my_helpers.py" in said, said


@pytest.mark.timeout(300)
def test_the_judges_reading_of_an_order_from_a_writefile_module_is_the_kernels():
    request = {"check": "check_three_rounds", "names": ["order"], "private": [], "cells": [
        f"%%writefile r11_answers.py\nORDER = {RIGHT_ORDER!r}\n",
        "from r11_answers import ORDER\norder = ORDER\n"]}
    read = judge._run_judge("answers", request, judge.compiled_digest())
    assert "values" in read, read
    [sent] = [judge_values.decode(v) for v in read["values"]]
    assert checks.check_three_rounds(sent).passed


@pytest.mark.timeout(600)
def test_the_judge_passes_a_cached_method_from_a_writefile_module():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [
        f"%%writefile r11_loops.py\n{LOOP}",
        "from r11_loops import Loops\nserial_loop = Loops().run\n"])
    assert passed, message
