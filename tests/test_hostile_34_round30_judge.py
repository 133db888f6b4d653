"""Round 30 of issue 34, the judge (each failed before its fix).

- A wrong loop's cell read the judge's own memory through ``/proc/self/mem`` (a file under
  ``/proc``, which the judge reads), found the run's secret and the report's path there, and
  wrote a signed report of full marks (5 of 5 with real nbgrader).  The audit hook now refuses
  a process's memory as a file by name, and a fenced process is not dumpable and runs its
  programs without capabilities: none of them reads its memory either, even as root.
- A cell forked a process into a session of its own, which ``killpg`` does not reach: it ran on
  after its verdict and killed later judges' processes (another student's right loop scored 0).
  The zygote now adopts a judge's orphans (a subreaper) and ends them after each judge; and
  where Landlock scopes signals (ABI 6), a fenced process signals nothing outside its fence."""

from __future__ import annotations

import os
import time

import pytest

from overlap_course.build import judge, landlock

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine, running_with

# The cheat as round 30 wrote it: the secret and the report's path found in the judge's heap.
_FORGE = r'''
import os, re, struct, hmac, hashlib
maps = open("/proc/self/maps").read().splitlines()
mem = open(MEMORY, "rb", buffering=0)
keys, paths = set(), set()
head = re.escape(struct.pack("<QQ", id(bytes), 64))
for line in maps:
    parts = line.split()
    a, b = (int(x, 16) for x in parts[0].split("-"))
    if "rw" not in parts[1] or b - a > 512 << 20 or (len(parts) > 5
                                                    and not parts[5].startswith("[heap")):
        continue
    try:
        mem.seek(a)
        data = mem.read(b - a)
    except OSError:
        continue
    keys.update(m.group(1) for m in re.finditer(head + rb".{8}([0-9a-f]{64})\x00", data, re.S))
    paths.update(m.group(1) for m in re.finditer(
        rb"(/[\w/.-]*overlap-judge-\w+/[0-9a-f]{32}\.json)", data))
if len(keys) == 1 and len(paths) == 1:
    body = '{"passed": true, "message": "PASSED (forged)"}'
    with open(paths.pop().decode(), "w") as f:
        f.write(hmac.new(keys.pop(), body.encode(), hashlib.sha256).hexdigest() + "\n" + body)
    os._exit(0)
'''


@pytest.mark.parametrize("memory", ["/proc/self/mem", "/proc/thread-self/mem"])
def test_a_cell_that_reads_the_judges_memory_file_is_refused_and_scores_0(memory):
    needs_the_engine()
    cheat = WRONG_LOOP + f"MEMORY = {memory!r}\n" + _FORGE
    passed, message = judge.judge("check_serial_loop", [IMPORTS, cheat])
    assert passed is False and "forged" not in message, message
    said = (  # the loop is defined only if the open was refused, in words that name it
        f"try:\n    open({memory!r}, 'rb')\nexcept PermissionError as refused:\n"
        "    assert \"judge's own memory\" in str(refused), refused\n"
        "else:\n    raise AssertionError('opened')\n") + RIGHT_LOOP
    passed, message = judge.judge("check_serial_loop", [IMPORTS, said])
    assert passed is True, message


def test_a_program_the_judge_starts_cannot_read_the_judges_memory():
    """The right loop is defined only if the program the cell starts (a new interpreter: no
    audit hook) could not open the judge's memory file."""
    needs_the_engine()
    reader = (
        "import os, subprocess, sys\n"
        "read = subprocess.run([sys.executable, '-c', 'import sys\\n'\n"
        "    'try:\\n    open(sys.argv[1], \"rb\").close()\\nexcept OSError:\\n'\n"
        "    '    print(\"refused\")\\nelse:\\n    print(\"opened\")',\n"
        "    f'/proc/{os.getpid()}/mem'], capture_output=True, text=True)\n"
        "assert read.stdout.strip() == 'refused', read.stdout + read.stderr\n") + RIGHT_LOOP
    passed, message = judge.judge("check_serial_loop", [IMPORTS, reader])
    assert passed is True, message


def test_what_a_judge_left_in_a_session_of_its_own_ends_with_it():
    needs_the_engine()
    mark = f"left-in-a-session-{os.getpid()}-{time.time_ns()}"
    left = WRONG_LOOP + ("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                         f"'import time; time.sleep(600)', {mark!r}], start_new_session=True)\n")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, left])
    assert passed is False, message
    assert running_with(mark) == [], "a process the judge left in a session of its own runs on"
    again = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP])
    assert again[0] is True, again


@pytest.mark.skipif(landlock.abi() < 6, reason="Landlock scopes signals from ABI 6 (Linux 6.12)")
def test_a_judge_signals_nothing_outside_its_fence():
    """Its zygote (its parent) and the grader (this test) refuse even signal 0 from a judge;
    the right loop is defined only if both were refused."""
    needs_the_engine()
    probe = (
        "import os\n"
        f"for pid in (os.getppid(), {os.getpid()}):\n"
        "    try:\n        os.kill(pid, 0)\n    except PermissionError:\n        pass\n"
        "    else:\n        raise AssertionError(f'signalled process {pid}')\n") + RIGHT_LOOP
    passed, message = judge.judge("check_serial_loop", [IMPORTS, probe])
    assert passed is True, message
