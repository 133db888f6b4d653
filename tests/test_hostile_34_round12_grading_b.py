"""Issue 34, round twelve, grading, case 6 (the styles left): a right ``idle_fraction`` the
kernel's checker passes scored 0 in the judge ("must be a function your cells define") when
written as ``np.vectorize(share, otypes=[float])``, as a class whose ``__call__`` is a
classmethod, or as a class whose ``__call__`` is a ``functools.partial``.  The judge now calls
them as the kernel does: a new ``np.vectorize`` made as the learner's was, around the learner's
own function, with numpy's vectorize (whose Python code then runs) in the fingerprint.  A
library function inside, options no ``np.vectorize`` stores, or a patched vectorize are still
refused.  Each failed when written."""

from __future__ import annotations

import threading

import pytest

import toy_engine
from overlap_course import checks
from overlap_course.build import judge, judge_fingerprint as jf, judge_process, judge_values
from overlap_course.build.grading import CONTEXT_RUNS
from overlap_course.build.judge_cells import run_cells
from overlap_course.build.judge_watch import Watch
from overlap_course.build.judge_keep import keeper
from judged import judge_began, needs_the_engine


np = pytest.importorskip("numpy")

SHARE = "def share(x, of='idle'):\n    return 2.0 * x if of == 'idle' else -x\n"


def _answer(style: str):
    """(the kernel's ``answer``, what the judge calls for it or why it refuses)."""
    space, notes = run_cells(["import functools\nimport numpy as np\n", SHARE, style])
    assert not notes, notes
    return space["answer"], judge_values.code_answer(
        "answer", space["answer"], lambda code: code.co_filename.startswith("<submission"))


def _options(vectorized) -> dict:
    return {k: getattr(vectorized, k) for k in ("otypes", "excluded", "cache", "signature")}


# ---- np.vectorize, read as numpy stores it and made again --------------------------------------

@pytest.mark.parametrize("style", [
    "answer = np.vectorize(share, otypes=[float])\n",
    "answer = np.vectorize(share, otypes='d', excluded={'of', 1}, cache=True)\n",
    "answer = np.vectorize(share, signature='()->()')\n",
    "@np.vectorize(otypes=(float,))\ndef answer(x):\n    return share(x)\n",
    "answer = np.vectorize(functools.partial(share, of='busy'))\n"])
def test_an_np_vectorize_of_the_cells_function_is_called_as_the_kernel_calls_it(style):
    kernels, judges = _answer(style)
    assert type(judges) is np.vectorize, judges
    assert judges is not kernels and _options(judges) == _options(kernels)
    assert np.array_equal(judges([1.0, 3.0]), kernels([1.0, 3.0]))
    assert judges(3.0).dtype == kernels(3.0).dtype and judges(3.0) == kernels(3.0)


def test_the_judges_vectorize_calls_the_function_not_the_kernels_cached_ufunc():
    kernels, judges = _answer("answer = np.vectorize(share, otypes=[float])\n"
                              "answer._ufunc[1] = np.frompyfunc(lambda x: 0.5, 1, 1)\n")
    assert kernels(3.0) == 0.5 and judges(3.0) == 6.0


@pytest.mark.parametrize("style, found", [
    ("import textwrap\nanswer = np.vectorize(textwrap.dedent)\n", "library function (textwrap"),
    ("answer = np.vectorize(len)\n", "not a builtin_function_or_method"),
    ("class Mine(np.vectorize):\n    pass\nanswer = Mine(share)\n", "library function (numpy")])
def test_an_np_vectorize_of_no_function_of_the_cells_is_still_refused(style, found):
    _, judges = _answer(style)
    assert isinstance(judges, str) and found in judges and "np.vectorize" in judges, judges


@pytest.mark.parametrize("change, field", [
    ("answer.otypes = [float]", "`otypes` (list)"),
    ("answer.excluded = frozenset()", "`excluded` (frozenset)"),
    ("answer.cache = 1", "`cache` (int)"),
    ("class Name(str):\n    pass\nanswer.signature = Name('()->()')", "`signature` (Name)")])
def test_an_np_vectorize_with_an_option_numpy_never_stores_says_pass_the_function(change,
                                                                                    field):
    _, judges = _answer(f"answer = np.vectorize(share)\n{change}\n")
    assert isinstance(judges, str) and field in judges, judges
    assert "is an np.vectorize" in judges and "give the plain function" in judges


# ---- the two class styles the kernel calls ------------------------------------------------------

@pytest.mark.parametrize("style, expected", [
    ("class Measure:\n    @classmethod\n    def __call__(cls, x):\n"
     "        return (cls.__name__, share(x))\nanswer = Measure()\n", ("Measure", 6.0)),
    ("class Measure:\n    __call__ = functools.partial(share, of='busy')\n"
     "answer = Measure()\n", -3.0)])
def test_a_classmethod_call_and_a_partial_call_are_called_as_the_kernel_calls(style, expected):
    kernels, judges = _answer(style)
    assert not isinstance(judges, str), judges
    assert judges(3.0) == kernels(3.0) == expected


def test_a_partial_call_around_a_library_function_is_still_refused():
    _, judges = _answer("import textwrap\nclass Measure:\n"
                        "    __call__ = functools.partial(textwrap.dedent)\nanswer = Measure()\n")
    assert isinstance(judges, str) and "library function (textwrap" in judges, judges


# ---- numpy's vectorize is what the checker runs on ----------------------------------------------

@pytest.mark.parametrize("owner, attr", [("vectorize", "_call_as_normal"),
                                         ("module", "asanyarray")])
def test_a_patched_vectorize_changes_the_fingerprint(owner, attr):
    module = np.lib._function_base_impl
    target = np.vectorize if owner == "vectorize" else module
    before, snapshot, old = jf._fingerprint(), jf.Snapshot(), getattr(target, attr)
    setattr(target, attr, lambda *args, **kwargs: 0.25)
    try:
        seen, same = jf._compare(before, jf._fingerprint()), snapshot.same()
    finally:
        setattr(target, attr, old)
    assert seen and not same, seen
    assert not jf._compare(before, jf._fingerprint())


# ---- the check process's own steps, and the real judge ------------------------------------------

ENGINE = ("import functools\nimport numpy as np\nimport toy_engine as te\n"
          "engine = te.Engine(te.EngineConfig(mode='serial', max_batch_size=4))\n")
IDLE = ("def share(timeline, of='idle'):\n"
        "    idle = sum(end - start for start, end in timeline.device_gaps())\n"
        "    busy = timeline.device_busy_ms()\n"
        "    return (idle if of == 'idle' else busy) / (idle + busy)\n")
RIGHT = {"np.vectorize": "idle_fraction = np.vectorize(share, otypes=[float])\n",
         "classmethod": "class Measure:\n    @classmethod\n    def __call__(cls, timeline):\n"
                        "        return share(timeline)\nidle_fraction = Measure()\n",
         "partial": "class Measure:\n    __call__ = functools.partial(share, of='idle')\n"
                    "idle_fraction = Measure()\n"}
WRONG = "idle_fraction = np.vectorize(functools.partial(share, of='busy'), otypes=[float])\n"
PATCHED = ("_own = np.vectorize._call_as_normal\n"
           "np.vectorize._call_as_normal = lambda self, *a, **k: _own(self, *a, **k)\n")


@pytest.fixture(scope="module")
def runs():
    return {"engine": judge_process._judges_run(CONTEXT_RUNS["engine"], toy_engine)}


def _judged_here(style: str, runs: dict) -> dict:
    """The check process's steps in this process (without its audit hook and Landlock)."""
    began, threads, watch = judge_began(), set(threading.enumerate()), Watch()
    restore = keeper()
    args = judge_process._code_arguments([ENGINE, IDLE, style], ["idle_fraction", "engine"],
                                         toy_engine, runs, watch, restore)
    if isinstance(args, str):
        return {"passed": False, "message": args}
    return judge_process._verdict(checks.check_idle_fraction, args, began, threads,
                                  checks.Verdict, watch, restore)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("style", sorted(RIGHT))
def test_a_right_answer_in_these_styles_gets_the_kernels_verdict(style, runs):
    space, _ = run_cells([ENGINE, IDLE, RIGHT[style]])
    kernel = checks.check_idle_fraction(space["idle_fraction"], runs["engine"])
    assert kernel.passed, kernel
    assert _judged_here(RIGHT[style], runs) == {"passed": True, "message": kernel.message}


@pytest.mark.timeout(300)
def test_a_wrong_np_vectorize_and_a_patched_vectorize_score_zero(runs):
    wrong = _judged_here(WRONG, runs)
    assert wrong["passed"] is False and "busy fraction" in wrong["message"], wrong
    patched = _judged_here(PATCHED + RIGHT["np.vectorize"], runs)
    assert patched["passed"] is False, patched
    assert "numpy.lib._function_base_impl.vectorize.__dict__" in patched["message"], patched


@pytest.mark.timeout(600)
def test_the_real_judge_passes_these_styles_and_fails_the_wrong_one():
    needs_the_engine()
    for style in sorted(RIGHT):
        passed, message = judge.judge("check_idle_fraction", [ENGINE, IDLE, RIGHT[style]])
        assert passed, (style, message)
    passed, message = judge.judge("check_idle_fraction", [ENGINE, IDLE, WRONG])
    assert not passed and "busy fraction" in message, message
