"""The device process starts under ``spawn`` (Windows, macOS) as well as ``forkserver`` (Linux).

CI also runs tests/test_device.py and tests/test_engine.py whole with
``TOY_ENGINE_START_METHOD=spawn``; these tests check the choice itself and what a learner's
script or notebook meets under each method.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from toy_engine import process_device
from toy_engine.model import GPTConfig, TinyGPT
from toy_engine.process_device import ProcessDevice

METHODS = ["forkserver", "spawn"]
TINY = dict(vocab_size=10, context_len=16, n_layer=1, n_head=1, n_embd=8)


def test_automatic_choice_and_override(monkeypatch):
    monkeypatch.delenv(process_device.START_METHOD_ENV, raising=False)
    expected = "spawn" if sys.platform in ("win32", "darwin") else "forkserver"
    assert process_device.start_method() == expected
    monkeypatch.setenv(process_device.START_METHOD_ENV, " Spawn ")
    assert process_device.start_method() == "spawn"


@pytest.mark.parametrize("value", ["fork", "threads", "forkserve"])
def test_a_wrong_start_method_is_refused_with_the_fix(monkeypatch, value):
    monkeypatch.setenv(process_device.START_METHOD_ENV, value)
    with pytest.raises(ValueError, match=rf"TOY_ENGINE_START_METHOD='{value}'.*one of \['forkserver', 'spawn'\]"):
        process_device.start_method()


@pytest.mark.parametrize("method", METHODS)
def test_the_device_process_is_started_by_the_chosen_method(monkeypatch, method):
    """Not just the setting: the running device process's command line shows its origin."""
    import psutil

    monkeypatch.setenv(process_device.START_METHOD_ENV, method)
    dev = ProcessDevice(TinyGPT(GPTConfig(**TINY)), num_kv_blocks=4, block_size=4,
                        buffer_specs={"out": ((4,), torch.long)})
    try:
        cmdline = " ".join(psutil.Process(dev.pid).cmdline())
        marker = "multiprocessing.spawn" if method == "spawn" else "multiprocessing.forkserver"
        assert marker in cmdline, f"device process {dev.pid} under {method}: {cmdline!r}"

        def store_seven(ctx):  # defined at run time: travels by value
            ctx.store("out", torch.full((4,), 7))

        dev.launch(store_seven, round=0, writes={"out"})
        dev.wait(dev.record_event())
        assert dev.host("out").tolist() == [7] * 4
    finally:
        dev.close()


# A learner's script with no `if __name__ == "__main__":` guard.  Each run of its top level
# appends a line to RUNS; a kernel defined in it (in __main__) must reach the device by value.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    with open(os.environ["RUNS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    import torch
    from toy_engine.model import GPTConfig, TinyGPT
    from toy_engine.process_device import ProcessDevice
    from toy_engine.process_device import start_method

    def triple(ctx, x):
        ctx.store("out", torch.tensor([3 * x]))

    dev = ProcessDevice(TinyGPT(GPTConfig(vocab_size=10, context_len=16, n_layer=1, n_head=1, n_embd=8)),
                        num_kv_blocks=4, block_size=4, buffer_specs={"out": ((1,), torch.long)})
    dev.launch(triple, 14, round=0, writes={"out"})
    dev.wait(dev.record_event())
    print(start_method(), int(dev.host("out")[0]), dev.pid, flush=True)
    time.sleep(120)  # until the test kills this process
""")


@pytest.mark.parametrize("method", METHODS)
def test_a_learners_script_runs_once_and_its_device_process_ends_with_it(tmp_path, method):
    """No guard needed, notebook-style kernels reach the device, and killing the script (as
    a hub or the learner kills a kernel) takes its device process with it."""
    script, runs = tmp_path / "learner_script.py", tmp_path / "runs.txt"
    script.write_text(SCRIPT)
    env = dict(os.environ, RUNS=str(runs), TOY_ENGINE_START_METHOD=method)
    parent = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
    finally:
        parent.kill()
        _, err = parent.communicate(timeout=30)
    assert line, f"the script printed nothing; stderr:\n{err[-2000:]}"
    got_method, value, pid = line.split()
    assert (got_method, int(value)) == (method, 42)
    assert len(runs.read_text().split()) == 1, "the script's top level ran again in the device process"
    child_pid, deadline = int(pid), time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"device process {child_pid} ({method}) outlived its parent by 10 s")


def test_a_wait_longer_than_one_poll_interval_polls_again():
    """The host waits with Connection.poll (what Windows has too), POLL_S at a time."""
    dev = ProcessDevice(TinyGPT(GPTConfig(**TINY)), num_kv_blocks=4, block_size=4,
                        buffer_specs={"out": ((4,), torch.long)})
    try:
        def store_five(ctx):
            time.sleep(0.6)  # longer than one POLL_S: the wait polls more than once
            ctx.store("out", torch.full((4,), 5))

        dev.launch(store_five, round=0, writes={"out"})
        dev.wait(dev.record_event())
        assert dev.host("out").tolist() == [5] * 4
    finally:
        dev.close()
