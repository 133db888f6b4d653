"""A judge's device forkserver is forked from the judge before it reads its request and secret
(``judge_forkserver``): it holds none of them, keeps no descriptor but its own and stderr, and
its device processes run the check as a new interpreter's did.  Round 40 forged a verdict
through a forkserver forked after the secret was read; the test with the request's words below
fails against that one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from overlap_course.build import judge

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine

# Words that appear in the request only (a comment of a cell: compiled, it is not a constant),
# looked for in a forkserver child's memory (in every list, tuple and dict: a str is not one
# the collector lists) by a search that builds them as it runs.
_MARKED = "# overlap-marker-5f2e9c in the request only\n"
_SEARCHES = r'''
import gc, os
def found():  # the words a local: in no dict the search reads
    words = "-".join(("overlap", "marker", "5f2e9c"))  # not folded into one constant
    def holds(o):
        items = o.values() if type(o) is dict else o if type(o) in (list, tuple) else ()
        return any(type(s) in (str, bytes) and words in str(s) for s in items)
    return any(holds(o) for o in gc.get_objects())
os._exit(3 if found() else 0)
'''
_ASKS = f'''
import multiprocessing
child = multiprocessing.get_context("forkserver").Process(target=exec, args=({_SEARCHES!r}, {{}}))
child.start()
child.join()
raise RuntimeError(f"the forkserver's child ended with {{child.exitcode}}")
'''


def test_a_process_the_cells_ask_the_forkserver_for_holds_nothing_of_the_request():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _MARKED + _ASKS])
    assert not passed and "ended with 0" in message, message


def test_the_forked_forkserver_keeps_only_its_socket_its_pipe_and_stderr():
    """In a process of one thread with stdin a pipe holding a secret (as a judge's is): the
    forkserver's stdin and stdout are /dev/null, nothing of it reaches that pipe (which still
    holds the secret for its reader), and its other descriptors are its socket, its pipes and
    its selector."""
    program = textwrap.dedent('''
        import json, os, time
        import toy_engine, toy_engine.process_device as device
        from overlap_course.build.judge_forkserver import fork_before_the_secret
        if os.fork():  # a child of one thread, as a judge forked from its zygote is
            os._exit(os.wait()[1] >> 8)
        r, w = os.pipe()
        os.write(w, b"secret")
        os.dup2(r, 0)
        pid = fork_before_the_secret(device._FORKSERVER_PRELOAD)
        time.sleep(0.5)
        fds = {int(n): os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
        print(json.dumps({"fds": fds, "secret_pipe": os.readlink("/proc/self/fd/0"),
                          "read": os.read(0, 6).decode()}), flush=True)
        os._exit(0)
    ''')
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    fds, read = {int(n): what for n, what in seen["fds"].items()}, seen["read"]
    assert (fds[0], fds[1], read) == ("/dev/null", "/dev/null", "secret"), seen
    assert seen["secret_pipe"] not in fds.values(), seen
    others = [what for n, what in fds.items() if n > 2]
    assert others and all(w.startswith(("socket:", "pipe:", "anon_inode:", "/dev/null"))
                          for w in others), seen


def test_a_judge_with_the_forked_forkserver_passes_the_right_loop_and_fails_the_wrong():
    needs_the_engine()
    assert judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP])[0] is True
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP])
    assert passed is False and "reference" in message, message
