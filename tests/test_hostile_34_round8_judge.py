"""Issue 34's eighth hostile round, the judge: its bookkeeping at each hand-back of the
submission's code (a full fingerprint, ~0.1 s) ate the learner's 30 s, so right answers scored 0;
the profile hook a TimeUp turned off was blamed on the learner; and right answers the notebook's
check accepts (namedtuples, numpy strings, a dict's keys, a functools.partial, a function under
@functools.cache) were refused.  Each failed when written."""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import pytest

import toy_engine
from overlap_course import checks
from overlap_course.build import judge, judge_process
from overlap_course.build.judge_watch import Watch
from overlap_course.checks import sandbox

from judged import judge_began


def _watcher():
    from overlap_course.build.judge_fingerprint import watcher
    return watcher


def test_the_watchs_comparison_costs_a_fraction_of_a_fingerprint():
    before = judge_process._fingerprint()
    changes = _watcher()(before)
    assert changes() == []  # the first: a full comparison, and the snapshot
    start = time.perf_counter()
    full = judge_process._compare(before, judge_process._fingerprint())
    full_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(5):
        assert changes() == []
    assert full == [] and (time.perf_counter() - start) / 5 < full_s / 3


def test_the_quick_comparison_misses_no_change_the_fingerprint_sees():
    changes = _watcher()(judge_process._fingerprint())
    assert changes() == []
    engine_class, kernels = toy_engine.Engine, toy_engine.kernels
    method = engine_class.__dict__["generate"]
    function = kernels.correct_seqlens_qk
    with_closure = next(f for f in vars(checks).values()
                        if callable(f) and getattr(f, "__closure__", None))
    cell = with_closure.__closure__[0]
    held, code = cell.cell_contents, function.__code__
    swaps = [
        ("toy_engine.Engine.__dict__", lambda: setattr(engine_class, "generate", print),
         lambda: setattr(engine_class, "generate", method)),
        ("toy_engine.kernels.correct_seqlens_qk", lambda: setattr(kernels, "correct_seqlens_qk",
                                                                  print),
         lambda: setattr(kernels, "correct_seqlens_qk", function)),
        ("correct_seqlens_qk", lambda: setattr(function, "__code__", (lambda *a: 0).__code__),
         lambda: setattr(function, "__code__", code)),
        (with_closure.__name__, lambda: setattr(cell, "cell_contents", print),
         lambda: setattr(cell, "cell_contents", held)),
    ]
    for name, change, undo in swaps:
        change()
        try:
            found = changes()
        finally:
            undo()
        assert any(name in key for key in found), (name, found)
        assert changes() == []


class _TimeUpInTheHook(Watch):
    """A watch whose first comparison is interrupted by the time limit's TimeUp, as the one
    scheduled at the learner's last line past the deadline fires at the hook's entry."""

    def start(self, changes) -> None:
        fired = []

        def interrupted():
            if not fired:
                fired.append(1)
                raise type("TimeUp", (sandbox.TimeUp,), {"seconds": 30.0})
            return changes()
        super().start(interrupted)


SUBMISSION = compile("def answer():\n    return 1\n", "<submission cell 1>", "exec")


@pytest.mark.parametrize("passed", [False, True])
def test_a_hook_lost_to_the_time_limit_is_not_blamed_on_the_learner(passed):
    space: dict = {}
    exec(SUBMISSION, space)  # noqa: S102

    def check(answer):
        kind = "passed" if passed else "time_limit"
        try:
            answer()
        except sandbox.TimeUp:
            return checks.Verdict(passed, "your code was still running after 30 s", kind)
        return checks.Verdict(passed, "no time up", kind)

    verdict = judge_process._verdict(check, [space["answer"]], judge_began(),
                                     set(threading.enumerate()), checks.Verdict,
                                     _TimeUpInTheHook())
    if passed:  # a hook gone and a pass: never trusted
        assert not verdict["passed"] and "sys.setprofile" in verdict["message"], verdict
    else:
        assert verdict == {"passed": False, "message": "your code was still running after 30 s"}


Step = collections.namedtuple("Step", "stage round")


@pytest.mark.parametrize("value, plain", [
    ([Step("forward", 1), Step("sample", 1)], [("forward", 1), ("sample", 1)]),
    (set(np.array(["input_ids", "positions"])), {"input_ids", "positions"}),
    (dict(input_ids=1, positions=1).keys(), ["input_ids", "positions"]),
    (np.int64(3), 3), (np.float32(0.5), 0.5), (range(5000), list(range(4097))),
])
def test_value_answers_cross_as_the_checker_reads_them(value, plain):
    sent = judge_process._decode(judge_process._encode(value))
    assert sent == plain and type(sent) is type(plain)
    assert all(type(x) in (str, int, tuple) for x in getattr(sent, "__iter__", list)())


def test_a_value_no_checker_reads_is_still_refused():
    with pytest.raises(ValueError, match="not a plain Python value"):
        judge_process._encode([object()])


ENGINE = '''
import toy_engine as te
engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
'''
SHARE = '''
import functools
def _share(timeline, which):
    idle = sum(end - start for start, end in timeline.device_gaps())
    busy = timeline.device_busy_ms()
    return (idle if which == "idle" else busy) / (idle + busy)
'''
CACHED = '''
import functools
@functools.lru_cache(maxsize=None)
def idle_fraction(timeline):
    return _share(timeline, "idle")
'''


def _arguments(cells):
    return judge_process._code_arguments(cells, ["idle_fraction"], toy_engine, {}, Watch())


def test_code_answers_are_unwrapped_to_the_submissions_function():
    partial = _arguments([SHARE + "idle_fraction = functools.partial(_share, which='idle')"])[0]
    cached = _arguments([SHARE + CACHED])[0]
    assert partial.func.__name__ == "_share" and partial.keywords == {"which": "idle"}
    function = cached.__wrapped__  # under a cache of the judge's, as in the kernel (round 11)
    assert function.__name__ == "idle_fraction"
    assert function.__code__.co_filename.startswith("<sub")
    for cell, word in [("idle_fraction = functools.partial(max, 0.5)", "builtin_function"),
                       ("idle_fraction = functools.partial(functools.reduce)", "builtin")]:
        refused = _arguments([SHARE + cell])
        assert isinstance(refused, str) and word in refused, refused


@pytest.mark.timeout(600)
def test_the_judge_passes_a_partial_and_a_namedtuple_order():
    passed, message = judge.judge("check_idle_fraction", [
        ENGINE, SHARE + "idle_fraction = functools.partial(_share, which='idle')"])
    assert passed, message
    order = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
             ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]
    passed, message = judge.judge("check_three_rounds", [
        f"import collections\nS = collections.namedtuple('S', 'stage round')\n"
        f"order = [S(*x) for x in {order!r}]"])
    assert passed, message


def test_an_iterator_is_refused_as_the_checker_refuses_it():
    """Round 39: the checker refuses a generator (its first reader uses it up); the judge read
    one as a list and passed what the kernel failed."""
    with pytest.raises(ValueError, match="a generator is an iterator"):
        judge_process._encode(i for i in range(5))
