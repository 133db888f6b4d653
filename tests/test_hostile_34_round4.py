"""Issue 34's fourth hostile round, the judge's cases (the command lines' are in
tests/test_hostile_34_round4_files.py): each passed a wrong answer before its fix.  Round
three's guards (the fingerprint compared whenever the submission's code hands control back,
the threads left running) were passed by code that runs as trusted code: a finalizer calling a
builtin, the fingerprint's own ``getattr``, a renamed code object, a thread pool's worker, and
the judge's own run made after the submission's cells."""

from __future__ import annotations

import pytest

from hostile_support import SELF_RESTORING, SERIAL_LOOP

# ------------------------------------------------------------------ grading: the judge

# A wrong serial loop (the overlapped ZOS order), judged alone: not passed.
ZOS = '''
import toy_engine as te
def serial_loop(engine):
    te.loops.zos_loop(engine)
'''

# The same loop; the checker's per-run verdict is swapped for the standard library's
# Logger.debug (None: no fault) by weakref.finalize + setattr when the loop's view dies (after
# the loop returned, before the verdict), and the original put back by the loop itself and,
# after the last run, by a finalizer on an object the check's HostLog keeps (its plans).
FINALIZED = ZOS + '''
import weakref, logging
import overlap_course.checks.lesson02 as _L
_orig, _calls = _L._serial_run_verdict, [0]
_lenient = logging.getLogger("quiet.hostile4").debug

class _Keep(list):
    pass

_loop = serial_loop

def serial_loop(engine):
    _calls[0] += 1
    _L._serial_run_verdict = _orig
    _loop(engine)
    weakref.finalize(engine, setattr, _L, "_serial_run_verdict", _lenient)
    if _calls[0] == 4:
        keep = _Keep()
        engine.plans[10**6] = keep
        weakref.finalize(keep, setattr, _L, "_serial_run_verdict", _orig)
'''

# A loop that runs nothing; the verdict is lenient all along, and whoever reads __code__ of
# the two objects added to builtins (marked before lesson02) and to lesson02 (marked after the
# verdict's name) -- the judge's fingerprint -- sees the original in between.
HIDDEN_FROM_THE_FINGERPRINT = '''
import builtins
import overlap_course.checks.lesson02 as _L
_orig = _L._serial_run_verdict

def _lenient(*args, **kwargs):
    return None

class _Hide:
    def __init__(self, value):
        self.value = value
    def __call__(self):
        pass
    def __getattr__(self, name):
        _L._serial_run_verdict = self.value
        raise AttributeError(name)

builtins._h4_hide = _Hide(_orig)
_L._zz_h4_show = _Hide(_lenient)
_L._serial_run_verdict = _lenient

def serial_loop(engine):
    pass
'''

# Round three's self-restoring patch, its code objects renamed by assigning __code__.
RENAMED = SELF_RESTORING + '''
for _f in (_lenient, serial_loop):
    _f.__code__ = _f.__code__.replace(co_filename="lesson02_helpers.py")
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell", [FINALIZED, HIDDEN_FROM_THE_FINGERPRINT, RENAMED],
                         ids=["finalizer-patches", "fingerprint-runs-getattr", "code-renamed"])
def test_a_patch_made_outside_the_submissions_returns_does_not_pass_the_judge(cell):
    """Each: ``(True, 'the serial loop reproduces the reference: 4 prompts, 48 rounds / 0
    rounds, ...')`` for a wrong loop (ZOS) or one that runs nothing."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [cell])
    assert not passed, message


# A thread pool's worker (target concurrent.futures.thread._worker, imported by the course
# before the fingerprint) still running the submission's function when the check ends.
DELEGATES = "import concurrent.futures, time\n" + SERIAL_LOOP
POOL_WORKER = DELEGATES + '''
_pool = concurrent.futures.ThreadPoolExecutor(1)
_pool.submit(lambda: time.sleep(100))
'''


@pytest.mark.timeout(120)
def test_the_judge_sees_a_thread_pools_worker_running_the_submissions_code():
    """``(True, 'the serial loop reproduces the reference ...')`` with the lambda still running."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [POOL_WORKER])
    assert not passed and "thread" in message, message


@pytest.mark.timeout(120)
def test_control_the_judge_fails_the_zos_loop_as_a_serial_loop():
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [ZOS])
    assert not passed and "ZOS" in message, message


@pytest.mark.timeout(120)
def test_control_the_judge_passes_a_serial_loop_that_runs_the_toys():
    from overlap_course.build import judge
    passed, message = judge.judge("check_serial_loop", [DELEGATES])
    assert passed, message


# A wrong idle_fraction (0.0 whatever the timeline); the cells replace Engine.generate so that
# the judge's own run (made after them, for the `engine` argument) comes out with its device
# spans end to end and an idle fraction of 0; the answer puts generate back at its first call.
FORGED_JUDGES_RUN = '''
import dataclasses
import toy_engine as te

engine = te.Engine(te.EngineConfig(mode="serial", max_batch_size=4))
engine.generate(["Once upon a time", "The bird said"], max_new_tokens=8)
_generate = te.Engine.generate

def _forging_generate(self, *args, **kwargs):
    outs = _generate(self, *args, **kwargs)
    _t, _spans = 0.0, []
    for _s in self.timeline.spans:
        if _s.lane == "device":
            _d = _s.end_ms - _s.start_ms
            _s = dataclasses.replace(_s, start_ms=_t, end_ms=_t + _d)
            _t += _d
        _spans.append(_s)
    self.timeline.spans[:] = _spans
    self.stats = dataclasses.replace(self.stats, device_idle_fraction=0.0)
    return outs

te.Engine.generate = _forging_generate

def idle_fraction(timeline):
    te.Engine.generate = _generate
    return 0.0
'''


@pytest.mark.timeout(120)
def test_the_judges_own_run_is_not_made_with_the_submissions_patches():
    """``(True, 'your idle fraction equals engine.stats.device_idle_fraction, and it follows
    the timeline it is given ... (Note: an earlier cell had replaced ...Engine.generate ...')``."""
    from overlap_course.build import judge
    passed, message = judge.judge("check_idle_fraction", [FORGED_JUDGES_RUN])
    assert not passed, message
