"""Issue 34, round sixteen, grading.  A cell replaced ``multiprocessing.util.spawnv_passfds``
(unwatched) and stopped the forkserver; the check started it again after the cells, with code
that wrapped ``toy_engine.kernels.sample`` in every device process, so the reference agreed with
a wrong loop: full marks.  Now the judge starts the forkserver before the submission's first
line, every device process must be forked by that one, and multiprocessing's functions on the
device's start path are watched.  Each failed when written."""

from __future__ import annotations

from overlap_course.build import judge

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

_RESTARTS_THE_FORKSERVER = r'''
import multiprocessing.util as _u, multiprocessing.forkserver as _fs
_PAYLOAD = """
import functools, toy_engine.kernels as K
from toy_engine.buffers import out_buffer
_s, _on = K.sample, [False]
@functools.wraps(_s)
def sample(ctx, slot, is_prefill, *a, **k):
    if is_prefill:  # the checker's runs of its 4 PROMPTS, told apart by their prompts' lengths
        q = [int(n) for n in ctx.state["inputs"]["seqlens_q"]]
        if any(n in (13, 14, 19, 20) for n in q):
            _on[0] = True
        if any(n in (27, 28, 31, 32, 48, 49) for n in q) or q in ([16], [17]):
            _on[0] = False
    _s(ctx, slot, is_prefill, *a, **k)
    if _on[0]:  # what WRONG_LOOP writes on the host in the runs of 4 requests
        ctx.host_buffers[out_buffer(slot)][0] = 5
K.sample = sample
"""
_real_spawn = _u.spawnv_passfds
def _spawn(path, args, passfds):
    args = list(args)
    if "forkserver" in args[-1]:
        args[-1] = "exec(%r); " % _PAYLOAD + args[-1]
    return _real_spawn(path, args, passfds)
_u.spawnv_passfds = _spawn
_fs._forkserver._stop()   # one already running (none here) is started again, by the check
'''

# Killed, the judge's forkserver is started again by the check, after the cells.
_KILLS_THE_FORKSERVER = """
import os, signal, multiprocessing.forkserver as fs
os.kill(fs._forkserver._forkserver_pid, signal.SIGKILL)
os.waitpid(fs._forkserver._forkserver_pid, 0)
"""


def test_a_forkserver_the_cells_restarted_does_not_pass_a_wrong_loop():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop",
                                  [IMPORTS, WRONG_LOOP, _RESTARTS_THE_FORKSERVER])
    assert passed is False and "forkserver" in message, message


def test_a_killed_forkserver_started_again_is_refused():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop",
                                  [IMPORTS, RIGHT_LOOP, _KILLS_THE_FORKSERVER])
    assert passed is False and "forkserver" in message, message


def test_a_forkserver_started_again_with_another_executable_is_refused():
    cell = ("import sys, multiprocessing.spawn as s, multiprocessing.forkserver as fs\n"
            "s.set_executable(sys.executable)\nfs._forkserver._stop()")
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP, cell])
    assert passed is False, message
    assert "forkserver" in message, message


def test_a_right_loop_still_passes_and_spawn_asked_for_is_the_judges_forkserver():
    cell = "import os\nos.environ['TOY_ENGINE_START_METHOD'] = 'spawn'"
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP, cell])
    assert passed is True, message


def test_a_reducer_for_a_renamed_torch_class_is_still_the_submissions_change():
    """The reducers' table counted a key by its ``__module__`` as it read then: a cell that set
    ``torch.UntypedStorage.__module__ = "elsewhere"`` first hid the reducer."""
    import torch
    from multiprocessing.reduction import ForkingPickler

    import toy_engine.process_device  # noqa: F401 - the picklers' tables, as the judge reads them
    from overlap_course import checks  # noqa: F401
    from overlap_course.build import judge_benign
    from overlap_course.build.judge_fingerprint import _compare, _fingerprint

    judge_benign.remember_modules()
    before, module = _fingerprint(), torch.UntypedStorage.__module__
    torchs = ForkingPickler._extra_reducers.get(torch.UntypedStorage)  # torch's own, if set
    try:
        torch.UntypedStorage.__module__ = "elsewhere"
        ForkingPickler._extra_reducers[torch.UntypedStorage] = lambda s: (bytearray, (b"x",))
        changed = _compare(before, _fingerprint())
    finally:  # torch's reducer back: without it no tensor reaches a device in this process
        ForkingPickler._extra_reducers.pop(torch.UntypedStorage, None)
        if torchs is not None:
            ForkingPickler._extra_reducers[torch.UntypedStorage] = torchs
        torch.UntypedStorage.__module__ = module
    assert any(c.endswith("ForkingPickler._extra_reducers") for c in changed), changed
