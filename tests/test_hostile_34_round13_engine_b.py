"""Issue 34's thirteenth hostile round, area `engine`, fixer `engine13b`: a dead forkserver
taken for a dead device (06), a ring reused (07), a request's completion replaced (08), lazy
iterators from plug-ins (09), stages given a finished run's objects (11), a config change
refused for a false reason (12), and a correction that can never run (14)."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import toy_engine as te
from overlap_course.labs import plugins
from toy_engine import engine as engine_module
from toy_engine import run

PROMPTS = ["Once upon", "The cat", "A dog"]


@pytest.fixture(scope="module")
def engine():
    with te.Engine(te.EngineConfig(mode="zos", max_batch_size=3)) as eng:
        yield eng


def _usable(eng):
    """The engine runs right after the refusal."""
    out = eng.generate(["Once upon"], max_new_tokens=5)
    assert out[0].finish_reason == "length" and len(out[0].token_ids) == 5


# ------------------------------------------------------------------ 06: a dead forkserver

_FORKSERVER_KILLED = textwrap.dedent('''
    import os, signal, time, warnings, multiprocessing.forkserver as fs
    import toy_engine as te

    def run(e):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            text = e.generate("Once upon", max_new_tokens=4)[0].text
        return text, [str(x.message) for x in w]

    e = te.Engine(te.EngineConfig(mode="zos", max_batch_size=2))
    reference, _ = run(e)
    os.kill(fs._forkserver._forkserver_pid, signal.SIGKILL)
    time.sleep(0.3)
    device = e.device.pid
    text, warned = run(e)
    print("kept", e.device.pid == device, text == reference, warned)
    os.kill(device, signal.SIGKILL)   # the device as well, the forkserver still gone
    time.sleep(0.3)
    text, warned = run(e)
    print("replaced", e.device.pid != device, text == reference, warned)
    other = te.Engine(te.EngineConfig(mode="zos", max_batch_size=2))   # a new forkserver
    print("new", run(other)[0] == reference)
''')


@pytest.mark.timeout(300)
def test_06_a_dead_forkserver_keeps_the_live_device_and_no_message_says_code_255():
    """Before: the live device was replaced with the warning "the device process exited with
    code 255" (the forkserver's answer once it is gone), and its death later said code 255."""
    child = subprocess.run([sys.executable, "-c", _FORKSERVER_KILLED], capture_output=True,
                           text=True, timeout=240, env={**os.environ, "PYTHONPATH": os.getcwd()})
    lines = child.stdout.splitlines()
    assert child.returncode == 0 and len(lines) == 3, child.stdout + child.stderr[-2000:]
    assert lines[0] == "kept True True []", lines[0]
    assert lines[1].startswith("replaced True True ['the device process ended after the "
                               "forkserver that started it, which reports how, was gone;"), lines[1]
    assert "255" not in lines[1], lines[1]
    assert lines[2] == "new True", lines[2]


# ------------------------------------------------------------------ 07: a ring kept and reused

def test_07_a_ring_kept_in_a_variable_can_be_entered_again_nested_and_per_thread():
    """Before: the second `with three:` raised AttributeError '_GeneratorContextManager' object
    has no attribute 'args' (a generator context manager is used once)."""
    three = plugins.ring(3)
    assert repr(three) == "ring(3)"
    for _ in range(2):  # the cell run again
        with three:
            assert engine_module.RING_SLOTS.get() == 3
            with plugins.ring(5), three:
                assert engine_module.RING_SLOTS.get() == 3
            assert engine_module.RING_SLOTS.get() == 3
        assert engine_module.RING_SLOTS.get() is None
    seen, inside = [], threading.Barrier(2)

    def cell():
        with three:
            inside.wait(10)
            seen.append(engine_module.RING_SLOTS.get())
            inside.wait(10)
        seen.append(engine_module.RING_SLOTS.get())
    threads = [threading.Thread(target=cell) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [3, 3, None, None]
    with pytest.raises(ValueError, match="slots must be in"):
        plugins.ring(0)
