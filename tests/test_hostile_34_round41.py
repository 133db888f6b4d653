"""Issue 34, round forty-one.  A judge's device forkserver, forked from the judge (no new
interpreter), kept what the judge held as root: every capability, ``CAP_SYS_PTRACE`` among them.
A process the cells asked it for read the judge's memory through ``/proc/<judge>/mem``, took
the run's secret and the report's name, and signed "passed" for a wrong loop: real nbgrader gave
it 5 of 5.  A fenced process now holds no capability, so neither it nor anything it forks reads
a process that is not dumpable.  It failed when written (as root, as the grader runs here)."""

from __future__ import annotations

import os

import pytest

from overlap_course.build import judge, landlock

from judged import IMPORTS, WRONG_LOOP, needs_the_engine

# The helper's forger, as it ran: the key sits in memory after a bytes object's header (its
# length, 64, and an unset hash), the report's name is 32 hex digits and ".json".
_READS_THE_JUDGE = r'''
import os, re, hmac, hashlib
pid = JPID
keys, reports = set(), set()
mem = open("/proc/%d/mem" % pid, "rb", 0)
for line in open("/proc/%d/maps" % pid).read().splitlines():
    parts = line.split()
    if "r" not in parts[1][0] or (len(parts) >= 6 and parts[5].startswith("/")):
        continue
    a, b = (int(x, 16) for x in parts[0].split("-"))
    if b - a > 1 << 30:
        continue
    try:
        mem.seek(a)
        data = mem.read(b - a)
    except OSError:
        continue
    for m in re.finditer(rb"\x40\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff([0-9a-f]{64})"
                         rb"(?![0-9a-f])", data):
        keys.add(m.group(1))
    reports.update(m.group().decode() for m in re.finditer(rb"[0-9a-f]{32}\.json", data))
body = '{"passed": true, "message": "forged by a child of the forkserver"}'
for key in keys:
    signed = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    for report in reports:
        with open(report, "w") as f:
            f.write(signed + "\n" + body)
'''
_FORGES = f'''
import multiprocessing, os
child = multiprocessing.get_context("forkserver").Process(
    target=exec, args=({_READS_THE_JUDGE!r}.replace("JPID", str(os.getpid())),))
child.start()
child.join()
os._exit(0)
'''


def test_a_child_of_the_forkserver_cannot_read_the_judge_and_forge_its_verdict():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, _FORGES])
    assert not passed and "forged" not in message, message
    assert "Permission denied" in message or os.geteuid() != 0, message  # the read refused


def test_a_fenced_process_and_its_forks_hold_no_capability():
    if not landlock.abi():
        pytest.skip("no Landlock on this system: nothing is fenced")
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child fenced as a judge is, then a fork of it (as its forkserver is)
        try:
            landlock.restrict(["/proc", "/usr", "/lib"], [])
            if os.fork() == 0:
                os.write(writing, _capabilities().encode())
            os._exit(0)
        finally:
            os._exit(1)
    os.close(writing)
    os.waitpid(pid, 0)
    with os.fdopen(reading) as got:
        assert got.read() == "0000000000000000 0000000000000000"


def _capabilities() -> str:
    with open("/proc/self/status") as status:
        fields = dict(line.split(":\t", 1) for line in status if line.startswith("Cap"))
    return f"{fields['CapEff'].strip()} {fields['CapPrm'].strip()}"


# Round 42 (real nbgrader, 0 of 2 for a right answer): a pool worker that ran the answer's own
# lambda, then a timeline method, was "a thread still running" at the compare made in that
# worker as it entered the checker's code.
_POOL_IDLE = '''
from concurrent.futures import ThreadPoolExecutor

def idle_fraction(timeline):
    with ThreadPoolExecutor(1) as ex:
        idle = ex.submit(lambda: sum(e - s for s, e in timeline.device_gaps())).result()
        busy = ex.submit(timeline.device_busy_ms).result()
    return idle / (idle + busy)
'''
_POOL_LEFT = '''
import threading
from concurrent.futures import ThreadPoolExecutor
_pool, _stop = ThreadPoolExecutor(1), threading.Event()

def idle_fraction(timeline):   # wrong: leaves a worker of its own running
    idle = _pool.submit(lambda: sum(e - s for s, e in timeline.device_gaps())).result()
    busy = _pool.submit(timeline.device_busy_ms).result()
    _pool.submit(_stop.wait, 3)  # alive as the check compares; the judge then ends in 3 s
    return idle / (idle + busy)
'''


_ENGINE = ("engine = te.Engine(te.EngineConfig(mode='serial', max_batch_size=4))\n"
           "engine.generate(['Once upon a time'], max_new_tokens=8)\n")  # the judge runs its own


def test_a_pool_worker_that_calls_the_timeline_after_the_answers_code_passes():
    needs_the_engine()
    passed, message = judge.judge("check_idle_fraction", [IMPORTS, _ENGINE, _POOL_IDLE])
    assert passed, message
    passed, message = judge.judge("check_idle_fraction", [IMPORTS, _ENGINE, _POOL_LEFT])
    assert not passed and "still running" in message, message


def test_a_signal_handler_left_set_is_named_with_its_fix():
    needs_the_engine()
    from judged import RIGHT_LOOP

    cell = ("import signal\ndef on_alarm(signum, frame):\n    raise TimeoutError('too long')\n"
            "signal.signal(signal.SIGALRM, on_alarm)\nsignal.alarm(0)\n")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cell, RIGHT_LOOP])
    assert not passed and "signal.signal(signum, previous)" in message, message


# Round 42: a cell renamed the forkserver's socket file (in the judge's own folder) and bound a
# relay at its path, which handed each device process of the check a pickle of its own before
# passing the request on to the real forkserver: the submission's code ran in the checker's
# device processes, and a right loop's verdict was still trusted.
_RELAY = r'''
import os, socket, pickle, multiprocessing.forkserver as f
from multiprocessing import reduction
address = f._forkserver._forkserver_address
os.rename(address, address + ".real")
relay = socket.socket(socket.AF_UNIX)
relay.bind(address)
relay.listen()
RAN = "open(%r, 'a').write('ran')" % (os.getcwd() + "/ran.txt")

class Rewritten:
    def __init__(self, data):
        self.data = data
    def __reduce__(self):
        return (eval, ("exec(C) or __import__('pickle').loads(B)", {"C": RAN, "B": self.data}))

if os.fork() == 0:
    while True:
        conn, _ = relay.accept()
        fds = reduction.recvfds(conn, 256)
        mine_r, mine_w = os.pipe()
        real = socket.socket(socket.AF_UNIX)
        real.connect(address + ".real")
        reduction.sendfds(real, [mine_r] + fds[1:])
        os.close(mine_r)
        real.close()
        conn.close()
        for fd in fds[1:]:
            os.close(fd)
        if os.fork() == 0:
            relay.close()
            theirs, read = open(fds[0], "rb"), []
            class Recorded:
                def read(self, n):
                    read.append(theirs.read(n))
                    return read[-1]
                def readline(self):
                    read.append(theirs.readline())
                    return read[-1]
            pickle.load(Recorded())
            os.write(mine_w, pickle.dumps(Rewritten(b"".join(read))))
            while chunk := theirs.read1(65536):
                os.write(mine_w, chunk)
            os._exit(0)
        os.close(fds[0])
        os.close(mine_w)
relay.close()
'''


def test_a_relay_bound_in_place_of_the_forkserver_reaches_no_device_process():
    needs_the_engine()
    from judged import RIGHT_LOOP

    passed, message = judge.judge("check_serial_loop", [IMPORTS, _RELAY, RIGHT_LOOP])
    assert not passed, message
