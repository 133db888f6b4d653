"""Issue 34, round forty-four (the judge's device forkserver).  Every check that the device
processes come from the forkserver the judge started before the cells (the socket's listener,
``SO_PEERCRED``; the device's parent; the verdict's last look) compared only its pid.  A cell
killed that forkserver, reaped it (the judge is its parent), and forked until a child of the
judge's got the same pid, which listened at the socket's address: the check's device processes
came from that impostor, a fork made after the judge read its secret, and a right loop's
verdict was trusted.  A process is now known by its pid and its start time
(``judged_forkserver.identity``).  The attack failed when written; the checks below it each
failed too."""

from __future__ import annotations

import copy
import os
import signal
import socket
import time

import pytest

import toy_engine as te
from overlap_course.build import judge, judge_forkserver, judge_process
from toy_engine import judged_forkserver
from toy_engine.device import DeviceError

from judged import IMPORTS, RIGHT_LOOP, needs_the_engine

_TAKES_THE_PID = '''
import os, signal, socket, time, _thread
import multiprocessing.forkserver as fs
S, ADDR = fs._forkserver._forkserver_pid, fs._forkserver._forkserver_address
os.kill(S, signal.SIGKILL)
os.waitpid(S, 0)  # reaped by its parent: pid S is free again

def serve_as_the_forkserver():
    try:
        os.unlink(ADDR)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(ADDR)
    listener.listen()
    r, _ = os.pipe()
    try:
        fs.main(listener.fileno(), r, [])
    finally:
        os._exit(0)

began = time.monotonic()
while time.monotonic() - began < 120:
    pid = os.fork()
    if pid == 0:
        if os.getpid() == S:
            serve_as_the_forkserver()
        os._exit(0)
    if pid == S:
        break
    os.waitpid(pid, 0)
    for _ in range(min(max((S - pid) % 32768 - 200, 0), 2000)):  # threads take pids quickly
        try:
            _thread.start_new_thread(int, ())
        except RuntimeError:
            time.sleep(0.01)
else:
    raise RuntimeError("pid not taken")
while not os.path.exists(ADDR):
    time.sleep(0.05)
time.sleep(0.3)
'''


def _pid_max() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read())


def test_a_child_of_the_judge_with_the_forkservers_pid_serves_no_device_process():
    needs_the_engine()
    if _pid_max() > 65536:
        pytest.skip(f"pid_max is {_pid_max()}: cycling to a given pid takes too long here")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _TAKES_THE_PID, RIGHT_LOOP])
    assert not passed, message
    assert "pid not taken" not in message, message
    assert "the judge started was stopped" in message, message


@pytest.fixture
def listening(tmp_path):
    """A child process listening on a Unix socket (as a forkserver does), and its address."""
    address = str(tmp_path / "s")
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(address)
                listener.listen()
                os.write(ready_w, b"x")
                time.sleep(60)
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    yield pid, address
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_the_connect_refuses_a_listener_with_the_servers_pid_but_another_start(listening):
    pid, address = listening
    real = judged_forkserver.identity(pid)
    assert real is not None and real[0] == pid
    _, alive_w = os.pipe()
    with pytest.raises(ConnectionRefusedError, match=f"served by process {pid}, not by the "):
        judge_forkserver._connecting(address, (pid, real[1] - 1), alive_w)([])
    parent_r, parent_w = judge_forkserver._connecting(address, real, alive_w)([])  # it itself
    os.close(parent_r)
    os.close(parent_w)


def test_a_device_process_whose_parent_has_the_pid_but_another_start_is_refused(monkeypatch):
    me = judged_forkserver.identity(os.getpid())
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        monkeypatch.setattr(judged_forkserver.PINNED, "pid", os.getpid())
        monkeypatch.setattr(judged_forkserver.PINNED, "identity", me)
        judged_forkserver.check_parent(child)  # forked by the pinned process itself
        monkeypatch.setattr(judged_forkserver.PINNED, "identity", (os.getpid(), me[1] - 1))
        with pytest.raises(DeviceError, match="stopped, restarted or replaced the forkserver"):
            judged_forkserver.check_parent(child)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_the_verdicts_last_look_knows_a_forkserver_by_its_start_too():
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        server = judged_forkserver.identity(child)
        import multiprocessing.forkserver as fs
        was = fs._forkserver._forkserver_pid
        fs._forkserver._forkserver_pid = child
        try:
            assert judge_process._forkserver_moved((child, server)) == []
            assert judge_process._forkserver_moved((child, (child, server[1] - 1))) == [
                f"the forkserver {child} the judge started was stopped"]
        finally:
            fs._forkserver._forkserver_pid = was
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


# --- the engine: a queue no round can be planned from -------------------------------------
# A loop that queued a request of an earlier run (or a copy) met a bare KeyError deep in
# commit_outputs; one queued twice, or re-queued once freed, was admitted twice and the error
# blamed a second free the learner never made.  Refused at the next schedule, naming it.

def _loop_that_first(edit):
    def loop(engine):
        edit(engine)
        te.loops.serial_loop(engine)
    return loop


def _requeued_once_freed(engine):
    plan = engine.schedule()
    inputs = engine.prepare_inputs(plan)
    engine.launch_forward(inputs)
    engine.process_outputs(engine.launch_sample(inputs))
    req = engine.scheduler.running[0]
    engine.scheduler.free(req)
    engine.scheduler.add(req)


@pytest.mark.parametrize("edit, said", [
    (lambda e: e.scheduler.add(_EARLIER[0]), "request 0 is not one of this run's"),
    (lambda e: e.scheduler.waiting.append("junk"), "'junk' is not one of this run's requests"),
    (lambda e: e.scheduler.add(copy.copy(e.scheduler.waiting[0])), "is not one of this run's"),
    (lambda e: e.scheduler.add(e.scheduler.waiting[0]), "is queued twice"),
    (_requeued_once_freed, "was admitted and freed already"),
])
def test_a_request_queued_by_the_loop_is_refused_by_name(edit, said):
    with te.Engine(te.EngineConfig(mode="serial")) as engine:
        first = engine.generate(["ab", "cd"], max_new_tokens=4)
        _EARLIER[:] = list(engine.requests)
        with pytest.raises(RuntimeError, match=said):
            engine.generate(["ab", "cd"], max_new_tokens=4, loop=_loop_that_first(edit))
        again = engine.generate(["ab", "cd"], max_new_tokens=4)
        assert [c.token_ids for c in again] == [c.token_ids for c in first]


_EARLIER: list = []


# --- grading: exercise 05's read before the wait, hidden from the race checker -------------
# Real nbgrader gave 4/4 to a process_outputs that read the step's tokens before its wait after
# telling the race checker it had waited (`races.on_wait`) or emptying its list: the verdict read
# the order from the checker's refusals, which the answer had turned off.  The order is now read
# from the run's record of accesses and waits.

_READS_THEN_WAITS = '''
def process_outputs(engine, step):
{hide}
    out = engine.read_outputs(step)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)
'''
_HIDES = {
    "told_it_waited": "    engine.device.races.on_wait(step.sample_done.seq)",
    "emptied_the_books": ("    engine.device.races.pending.clear()\n"
                          "    engine.device.run_record._pending.clear()\n"
                          "    engine.device.run_record._waited_upto = step.sample_done.seq"),
}


@pytest.mark.parametrize("hide", sorted(_HIDES))
def test_a_read_before_the_wait_hidden_from_the_race_checker_scores_nothing(hide):
    needs_the_engine()
    cell = _READS_THEN_WAITS.format(hide=_HIDES[hide])
    passed, message = judge.judge("check_process_outputs", [IMPORTS, cell])
    assert not passed, message
    assert "you read the step's sampled tokens (`out0`) before any wait" in message, message
