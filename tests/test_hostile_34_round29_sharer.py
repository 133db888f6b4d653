"""Round 28b left open: the library's server of file descriptors
(``multiprocessing.resource_sharer``), a thread the judge trusted however it started, because
the engine's device started it to send its shared buffers (and the n-gram table of the
speculative engine's setup launch) after the device process had started.  A wrong loop put
entries of its own in that server's cache (after clearing its listener's ``authkey``): the
trusted thread ran them, C partials that rebound ``pool.compare`` between two compares and put
it back as the check's time limit stopped -- full marks.

Now the device process gets its buffers as it starts (their descriptors passed by the start
itself) and the n-gram table by value, so no engine starts that server, and the judge trusts it
no more than any thread a cell starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from overlap_course.build import judge

from judged import IMPORTS, WRONG_LOOP, needs_the_engine

# round 28b's loop: entries of its own in the server's cache, run by the server's thread
_FEEDS_THE_SERVER = WRONG_LOOP + '''
import functools, io, os, sys, time, threading, operator
from multiprocessing import resource_sharer as rs, connection
from overlap_course.checks import pool
sys.setswitchinterval(1e-5)
S = rs._resource_sharer
ORIG = pool.compare
FAKE = functools.partial(print, file=io.StringIO())  # C: None for any args
NOOP = functools.partial(print, file=io.StringIO())
wrong_loop = serial_loop
KEEP = []
def post(send, close):
    with S._lock:
        S._key += 1
        S._cache[S._key] = (send, close)
        key = S._key
    c = connection.Client(S._address)
    c.send((key, os.getpid()))
    KEEP.append(c)
def serial_loop(engine):
    wrong_loop(engine)
    if len(engine.requests) == 1:
        if S._address is None or S._listener is None:
            raise RuntimeError("probe: no resource sharer running")
        dog = next(t for t in threading.enumerate() if t.name == "check-time-limit")
        f = dog._target
        stopped = f.__closure__[f.__code__.co_freevars.index("stopped")].cell_contents
        S._listener._authkey = None       # no handshake: connections never block the loop
        post(NOOP, functools.partial(time.sleep, 0.01))
        post(NOOP, functools.partial(vars(pool).update, compare=FAKE))
        post(functools.partial(max, functools.partial(stopped.wait, 20),
                               functools.partial(vars(pool).update, compare=ORIG),
                               key=operator.call), NOOP)
'''


@pytest.mark.parametrize("config", ["", "mode='zos', num_draft_tokens=3"])
def test_an_engine_starts_no_descriptor_server(config):
    """In a fresh interpreter: once started, the server's thread lives as long as its process."""
    code = (f"import threading, toy_engine as te\n"
            f"from multiprocessing import resource_sharer as rs\n"
            f"engine = te.Engine(te.EngineConfig({config}))\n"
            f"assert engine.generate(['Once upon a time'], max_new_tokens=4)\n"
            f"engine.close()\n"
            f"serve = rs._ResourceSharer._serve\n"
            f"print([t.name for t in threading.enumerate()\n"
            f"       if getattr(getattr(t, '_target', None), '__func__', None) is serve])\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr[-2000:]


def test_a_loop_feeding_the_descriptor_server_its_cells_started_scores_0():
    needs_the_engine()
    started = ("import os\nfrom multiprocessing import resource_sharer as _rs\n"
               "_rs.DupFd(os.open(os.devnull, os.O_RDONLY))  # the server, started by a cell\n")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, started, _FEEDS_THE_SERVER])
    assert passed is False, message
    assert "_serve" in message, message
