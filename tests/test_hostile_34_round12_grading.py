"""Issue 34, round twelve, grading: the judge's fingerprint missed a swapped ``__code__`` held by
an lru_cache, a property, a classmethod or a staticmethod (a wrong answer passed); it read a dict
subclass's storage where the checker calls its methods (wrong answers passed); a right answer
scored 0 after an ordinary import above it (pyexpat's C-registered submodules, torch._dynamo's
own rebinding of ``torch.manual_seed``), after a dataclass ``ClassVar`` (the cells inherited the
judge's ``from __future__ import annotations``), after ``obj?``, ``%timeit -n1``, ``x = %time``
or ``%%capture NAME``, or in a class / partial style the kernel calls.  Each failed when
written."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from overlap_course.build import judge_fingerprint as jf
from overlap_course.build import judge_folders, judge_process, judge_values
from overlap_course.build.judge_cells import run_cells

# ---- (1) the fingerprint reads a held function down to its code ----------------------------


def _holders():
    from overlap_course.checks import pool
    from toy_engine import model, sequence, timeline
    finished = next(v for v in vars(sequence).values()
                    if isinstance(v, type) and isinstance(v.__dict__.get("finished"), property))
    init = next(c for c in vars(model).values() if isinstance(c, type) and "_init" in c.__dict__)
    return {"lru_cache": pool.reference.__wrapped__,
            "property": finished.__dict__["finished"].fget,
            "classmethod": timeline.Timeline.__dict__["from_json"].__func__,
            "staticmethod": init.__dict__["_init"].__func__}


@pytest.mark.parametrize("holder", ["lru_cache", "property", "classmethod", "staticmethod"])
def test_a_swapped_code_inside_a_holder_changes_the_fingerprint(holder):
    function = _holders()[holder]
    before, snapshot = jf._fingerprint(), jf.Snapshot()

    def other(*args, **kwargs):
        return True
    old = function.__code__
    function.__code__ = other.__code__
    try:
        seen, same = jf._compare(before, jf._fingerprint()), snapshot.same()
    finally:
        function.__code__ = old
    assert seen, f"the {holder}'s function had its __code__ swapped unseen"
    assert not same
    assert not jf._compare(before, jf._fingerprint())


# ---- (2) a dict subclass whose reading methods are the learner's is refused ------------------

def _space(source: str) -> dict:
    space: dict = {}
    exec(compile(textwrap.dedent(source), "<submission cell 1>", "exec"), space)  # noqa: S102
    return space


@pytest.mark.parametrize("methods", [
    "def __iter__(self):\n        return iter([('sample', 1)])",
    "def keys(self):\n        return ['seqlens_k']",
    "def __getitem__(self, key):\n        return True",
    "items = dict.values"])
def test_a_dict_subclass_with_its_own_reading_is_refused_naming_a_plain_dict(methods):
    space = _space(f"class Marks(dict):\n    {methods}\nmarks = Marks(seqlens_k=True)\n")
    with pytest.raises(ValueError, match="write a plain dict"):
        judge_values.encode(space["marks"])


@pytest.mark.parametrize("value", [collections.Counter("ab"), collections.OrderedDict(a=1),
                                   collections.defaultdict(int, a=1)])
def test_the_librarys_dict_subclasses_are_still_read(value):
    assert judge_values.decode(judge_values.encode(value)) == dict(value)


def test_a_dict_subclass_with_no_method_of_its_own_is_still_read():
    space = _space("class Marks(dict):\n    note = 'mine'\nmarks = Marks(seqlens_k=True)\n")
    assert judge_values.decode(judge_values.encode(space["marks"])) == {"seqlens_k": True}


# ---- (3) ordinary imports above the answer ----------------------------------------------------

def test_pyexpats_registered_submodules_are_not_strangers():
    trusted = judge_folders.protected(judge_process.Path(judge_process.__file__)
                                      .resolve().parents[2])
    modules = set(sys.modules) - {"pyexpat", "pyexpat.errors", "pyexpat.model"}
    import xml.etree.ElementTree as ET
    ET.fromstring("<a/>")
    assert "pyexpat.errors" in sys.modules
    strangers = judge_process._strange_modules(modules, trusted)
    assert not [s for s in strangers if s.startswith("pyexpat")], strangers


def test_a_module_planted_under_a_package_is_still_a_stranger():
    import types
    trusted = judge_folders.protected(judge_process.Path(judge_process.__file__)
                                      .resolve().parents[2])
    import json
    fake = types.ModuleType("json.planted")
    modules = set(sys.modules)
    sys.modules["json.planted"], json.planted = fake, fake
    try:
        assert "json.planted" in judge_process._strange_modules(modules, trusted)
    finally:
        del sys.modules["json.planted"], json.planted


def _run_python(source: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_torch_dynamos_own_rebinding_of_manual_seed_is_not_the_submissions():
    out = _run_python("""
        from overlap_course.build import judge_fingerprint as jf
        import torch
        before = jf._fingerprint()
        import torch._dynamo
        own = jf._compare(before, jf._fingerprint())
        torch.manual_seed = torch._disable_dynamo(lambda seed: seed)
        print(own, jf._compare(before, jf._fingerprint()))
        """)
    assert out == "[] ['torch.manual_seed']"


# ---- (4) the cells' own futures and __main__ ---------------------------------------------------

@pytest.mark.parametrize("field", ["STAGES: ClassVar[tuple] = ('forward',)",
                                   "_: dataclasses.KW_ONLY", "label: InitVar[str] = ''"])
def test_a_dataclass_with_a_classvar_kw_only_or_initvar_runs_as_in_the_kernel(field):
    cell = ("import dataclasses\nfrom typing import ClassVar\nfrom dataclasses import InitVar\n"
            f"@dataclasses.dataclass\nclass Step:\n    {field}\n    stage: str = 'forward'\n"
            "    round: int = 1\n"
            "fields = [f.name for f in dataclasses.fields(Step)]\n")
    space, notes = run_cells([cell])
    assert not notes and space["fields"] == ["stage", "round"], notes


def test_the_cells_do_not_inherit_the_judges_futures_but_keep_their_own():
    space, notes = run_cells(["def f(x: Undefined):\n    return x\n"])
    assert notes and "NameError" in notes[0]
    space, notes = run_cells(["from __future__ import annotations\n",
                              "def f(x: Undefined):\n    return x\nA = f.__annotations__\n"])
    assert not notes and space["A"] == {"x": "Undefined"}


def test_the_judges_main_module_is_put_back_after_the_cells():
    main = sys.modules["__main__"]
    space, _ = run_cells(["import sys\nseen = sys.modules['__main__'].__dict__ is globals()\n"])
    assert space["seen"] is True and sys.modules["__main__"] is main


# ---- (5) magics that only show or time ---------------------------------------------------------

LOOP = "def answer(x):\n    return x + 1\n"


@pytest.mark.parametrize("cell, name, kind", [
    ("len?\n" + LOOP, "answer", "function"),
    ("len??\n" + LOOP, "answer", "function"),
    ("%timeit -n1 -r1 sum(range(3))\n" + LOOP, "answer", "function"),
    ("order = %time list((1, 2))\n", "order", "list"),
    ("%%capture shown\nprint('hello')\n", "shown", "CapturedIO")])
def test_a_magic_that_only_shows_or_times_behaves_as_ipythons(cell, name, kind):
    space, notes = run_cells([cell])
    assert not notes and type(space.get(name)).__name__ == kind, notes


def test_timeit_runs_its_statement_in_a_scope_of_its_own_as_ipython():
    space, notes = run_cells(["%timeit -n1 -r1 leaked = 1\n"])
    assert not notes and "leaked" not in space


def test_timeit_o_is_refused_by_name():
    _, notes = run_cells(["t = %timeit -o -n1 -r1 1\n"])
    assert notes and "%timeit -o" in notes[0]


# ---- (6) callable styles the kernel calls -------------------------------------------------------

SHARE = "def share(x, of='idle'):\n    return (x, of)\n"


def _answer(style: str):
    space, notes = run_cells(["import functools\nimport numpy as np\n", SHARE, style])
    assert not notes, notes
    return space["answer"], judge_values.code_answer(
        "answer", space["answer"], lambda code: code.co_filename.startswith("<submission"))


@pytest.mark.parametrize("style", [
    "class Measure:\n    def _share(self, x, of):\n        return share(x, of)\n"
    "    __call__ = functools.partialmethod(_share, of='idle')\nanswer = Measure()\n",
    "class named(functools.partial):\n    pass\nanswer = named(share, of='idle')\n"])
def test_a_partialmethod_call_and_a_partial_subclass_are_called_as_the_kernel_calls(style):
    kernels, judges = _answer(style)
    assert not isinstance(judges, str), judges
    assert judges(3) == kernels(3) == (3, "idle")


def test_a_partial_subclass_whose_fields_lie_is_read_by_partials_own():
    kernels, judges = _answer("class named(functools.partial):\n    @property\n"
                              "    def keywords(self):\n        return {'of': 'busy'}\n"
                              "answer = named(share, of='idle')\n")
    assert judges(3) == kernels(3) == (3, "idle")


def test_a_class_used_as_the_function_gets_a_message_that_says_write_a_def():
    _, judges = _answer("class answer(float):\n    def __new__(cls, x):\n"
                        "        return super().__new__(cls, x)\n")
    assert isinstance(judges, str) and "is a class" in judges and "def answer(" in judges
