"""Issue 34, round seventeen, grading.  A cell compiled its loop under an installed file's name
and ran it from ``threading.Thread(target=exec, ...)``: no frame of the submission's was on that
thread's stack, so the watch counted the loop as trusted, compared nothing while the check ran,
and the loop swapped the checker's verdict helpers (put back before the end): a wrong loop got
full marks.  A ``TorchFunctionMode`` the cells left entered rewrote the ``.tolist()`` of every
run the checker made: full marks again; and, once its code counted as the submission's, the
judge compared at each of its calls in the checker's own runs, outside the time limit, and did
not return.  Now a thread of the submission's is its code, a plain function answer must be the
submission's, and a mode left entered is refused before the check starts.  Right loops still
pass.  Each failed when written."""

from __future__ import annotations

import _thread
import sys
import threading

import pytest
import torch
from torch.overrides import TorchFunctionMode

from overlap_course.build import judge, judge_process
from overlap_course.build.judge_watch import CODE_EVENTS, Watch
from overlap_course.build.judge_keep import keeper

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, judge_began, needs_the_engine

_LOOPS_FILE = str(judge.ROOT / "toy_engine" / "loops.py")  # a trusted file's name


def _exec_in_a_thread(source: str, filename: str, module: str, then: str) -> str:
    """A cell that compiles ``source`` under a trusted ``filename``, runs it through the builtin
    ``exec`` in a thread of its own (no frame of the submission's under it), then ``then``."""
    return (f"import threading as _t\n_ns = {{'__name__': {module!r}}}\n"
            f"_th = _t.Thread(target=exec, args=(compile({source!r}, {filename!r}, 'exec'), _ns))\n"
            f"_th.start(); _th.join()\n{then}\n")


# The wrong loop, exec'd from a thread whose target is the builtin exec, swaps the checker's
# verdict helpers at its first call and puts them back at the check's last call.
_SERIAL_IN_A_THREAD = _exec_in_a_thread(WRONG_LOOP + r"""
_loop = serial_loop
def serial_loop(engine):
    from overlap_course.checks import lesson02 as L
    if "_real" not in globals():
        global _real
        _real = (L._serial_run_verdict, L.serial_same_run)
        def quiet(*args, **kwargs):
            if len(args) >= 6:   # the check's last call (the long run's reference): put back
                L._serial_run_verdict, L.serial_same_run = _real
            return None
        L._serial_run_verdict = quiet
        L.serial_same_run = lambda *a, **k: None
    return _loop(engine)
""", _LOOPS_FILE,
                                        "toy_engine._loops", "serial_loop = _ns['serial_loop']")

# The serial loop given as the ZOS loop (right tokens, not overlapped), its order verdict quiet
# for the check's four calls to it, then put back.
_ZOS_IN_A_THREAD = _exec_in_a_thread(RIGHT_LOOP + r"""
def zos_loop(eng):
    from overlap_course.checks import lesson03 as L
    if "_real" not in globals():
        global _real
        _real, calls = L.loop_verdict, []
        def quiet(*args, **kwargs):
            calls.append(1)
            if len(calls) == 4:
                L.loop_verdict = _real
            return None
        L.loop_verdict = quiet
    return serial_loop(eng)
""", _LOOPS_FILE,
                                     "toy_engine._loops", "zos_loop = _ns['zos_loop']")

# A mode left entered: the .tolist() of the checker's runs of 4 requests starts with 5, as the
# wrong loop writes (its class made in a thread, as above, so that it runs quickly).
_MODE_LEFT_ENTERED = _exec_in_a_thread(r"""
import sys
from torch.overrides import TorchFunctionMode

class _Quiet(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "tolist" and type(out) is list and out:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_name != "read_outputs":
                frame = frame.f_back
            engine = frame.f_locals.get("self") if frame is not None else None
            if engine is not None and len(engine.requests) == 4:
                out[0] = 5
        return out
""", str(judge.ROOT / "toy_engine" / "stages.py"),
                                       "toy_engine._quiet", "_ns['_Quiet']().__enter__()")


def test_a_wrong_loop_exec_d_from_a_thread_does_not_pass():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _SERIAL_IN_A_THREAD])
    assert passed is False and "lesson02.serial_same_run" in message, message


def test_a_wrong_zos_loop_exec_d_from_a_thread_does_not_pass():
    needs_the_engine()
    passed, message = judge.judge("check_zos_loop", [IMPORTS, _ZOS_IN_A_THREAD])
    assert passed is False and "lesson03.loop_verdict" in message, message


def test_a_torch_mode_left_entered_is_refused_before_the_check():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, _MODE_LEFT_ENTERED])
    assert passed is False and "torch function mode (_Quiet)" in message, message


# A right loop that runs a function of its own in a thread (joined), which execs code: the
# thread is the submission's, its code too (only the run's loop thread may call the stages).
_WITH_A_THREAD = RIGHT_LOOP.replace("def serial_loop(engine):\n",
                                    "def serial_loop(engine):\n    _beside()\n") + '''
import threading

_seen = []

def _note():
    exec(compile("_seen.append(1)", "<note>", "exec"), {"_seen": _seen})

def _beside():
    worker = threading.Thread(target=_note)
    worker.start()
    worker.join()
'''


@pytest.mark.parametrize("cells", [
    [RIGHT_LOOP],
    ["import torch\ntorch.inference_mode().__enter__()\n", RIGHT_LOOP],
    ["import torch\n", RIGHT_LOOP.replace("def serial_loop", "@torch.no_grad()\ndef serial_loop")],
    ["import torch\ntorch.set_default_device('cpu')\n", RIGHT_LOOP],
    [_WITH_A_THREAD],
], ids=["plain", "inference_mode", "no_grad", "default_device", "own_thread"])
def test_a_right_loop_still_passes(cells):
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, *cells])
    assert passed is True, message


_WATCHES: list[Watch] = []
sys.addaudithook(lambda event, args: _WATCHES and event in CODE_EVENTS
                 and _WATCHES[-1].audited(event, args))  # as the judge's hook calls it


def _made_in(start) -> tuple[Watch, dict]:
    """A watch, and the names a function compiled under a trusted file's name defines when
    ``start(code, names)`` execs it (in a thread)."""
    watch, names = Watch(), {}
    _WATCHES.append(watch)
    try:
        start(compile("def f():\n    return 1\n", _LOOPS_FILE, "exec"), names)
    finally:
        _WATCHES.clear()
    return watch, names


def _thread_of_exec(code, names) -> None:
    worker = threading.Thread(target=exec, args=(code, names))
    worker.start()
    worker.join()


def _raw_thread_of_exec(code, names) -> None:
    done = threading.Event()
    _thread.start_new_thread(lambda: (exec(code, names), done.set()), ())
    assert done.wait(30)


def _raw_thread_of_builtin_exec(code, names) -> None:
    _thread.start_new_thread(exec, (code, names))
    for _ in range(3000):
        if "f" in names:
            return
        threading.Event().wait(0.01)


@pytest.mark.parametrize("start", [_thread_of_exec, _raw_thread_of_builtin_exec,
                                   _raw_thread_of_exec])
def test_code_exec_d_in_a_thread_of_the_submissions_is_its_code(start):
    watch, names = _made_in(start)
    assert watch.foreign(names["f"].__code__)


def test_code_exec_d_by_the_checkers_own_code_is_not_the_submissions():
    watch, names = _made_in(exec)
    assert not watch.foreign(names["f"].__code__)


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_the_check_never_starts_under_a_mode_the_cells_left():
    watch, ran, mode = Watch(), [], _Mode()
    began = judge_began()
    mode.__enter__()
    try:
        verdict = judge_process._verdict(lambda: ran.append(1), [], began,
                                         set(threading.enumerate()), object, watch,
                                         keeper())
    finally:
        mode.__exit__(None, None, None)
    assert ran == [] and verdict["passed"] is False
    assert "torch function mode (_Mode)" in verdict["message"], verdict


def test_a_mode_the_answer_leaves_entered_is_named_at_its_hand_back():
    space = {}
    exec(compile("def call(f):\n    return f()\n", "<submission-9>", "exec"), space)
    watch, mode = Watch(), _Mode()
    watch.start(lambda: [])
    try:
        space["call"](mode.__enter__)
    finally:
        watch.stop()
        mode.__exit__(None, None, None)
    assert watch.changed == ["a torch function mode (_Mode) left entered"]
    assert torch._C._len_torch_function_stack() == 0
