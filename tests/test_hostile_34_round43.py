"""Issue 34, round forty-three (the judge's device processes).  A check's device processes could
run a submission's code, and what they sent back ran in the judge: the host read each device
message with pickle, so a correction (which check_correction runs on the device by design) that
replaced ``Connection.send`` there sent a pickle that called the judge's report writer and signed
"passed" for a correction that corrected nothing.  And a cell that rebound
``multiprocessing.spawn.get_preparation_data``, or gave ``multiprocessing.popen_forkserver`` a
copy of ``multiprocessing.spawn`` (importing it first, before the fingerprint knew it), had its
code run in the check's device processes.  Each failed when written."""

from __future__ import annotations

import pickle

import pytest

from overlap_course.build import judge
from toy_engine.sending import received

from judged import IMPORTS, RIGHT_LOOP, needs_the_engine

_FORGES_FROM_THE_DEVICE = '''
import os
from toy_engine.model import token_layout
JUDGE = os.getpid()
C = """
import os, sys
f = sys._getframe()
while f is not None:
    if 'write' in f.f_locals and 'verdict_type' in f.f_locals:
        f.f_locals['write']({'passed': True, 'message': 'FORGED from the device'})
        os._exit(0)
    f = f.f_back
"""

def correct_seqlens_qk(meta, accepted, block_size):
    if os.getpid() != JUDGE:  # on the device: corrects nothing, and answers with code
        import pickle, multiprocessing.connection as mc
        class Hack:
            def __init__(s, b): s.b = b
            def __reduce__(s):
                return (eval, ("exec(C, {}) or __import__('pickle').loads(B)",
                               {"C": C, "B": s.b}))
        def send(self, obj):
            self._send_bytes(pickle.dumps(Hack(pickle.dumps(obj))))
        mc.Connection.send = send
        return None
    delta = accepted[meta["rows"]] * meta["pending"]
    owner, _ = token_layout(meta["seqlens_q"], len(meta["positions"]))
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)
'''
_REBINDS_SPAWN = r'''
import os, multiprocessing.spawn as sp
HERE = os.getcwd()
with open(HERE + "/evil.py", "w") as f:
    f.write("open(%r, 'a').write('ran')\n" % (HERE + "/ran.txt"))
_orig = sp.get_preparation_data
def get_preparation_data(name):
    d = _orig(name)
    d["init_main_from_path"] = HERE + "/evil.py"
    return d
sp.get_preparation_data = get_preparation_data
'''
_READS_THE_MARK = r'''
import os
def serial_loop(engine):
    raise RuntimeError("device code: " + ("ran" if os.path.exists("ran.txt") else "none"))
'''
_COPIES_SPAWN = _REBINDS_SPAWN.replace("sp.get_preparation_data = get_preparation_data", """
import types, multiprocessing.popen_forkserver as pf
fake = types.ModuleType("multiprocessing.spawn")
fake.__dict__.update(sp.__dict__)
fake.get_preparation_data = get_preparation_data
pf.spawn = fake
""")


def test_a_device_message_is_read_with_no_global_looked_up():
    assert received(pickle.dumps(("event", 3, [(1, 2, 3, 4, None)], None))) == (
        "event", 3, [(1, 2, 3, 4, None)], None)
    with pytest.raises(pickle.UnpicklingError, match="builtins.eval"):
        received(pickle.dumps(type("Hack", (), {"__reduce__": lambda s: (eval, ("1",))})()))


def test_a_correction_cannot_answer_from_the_device_with_code_that_signs_a_pass():
    needs_the_engine()
    passed, message = judge.judge("check_correction", [IMPORTS, _FORGES_FROM_THE_DEVICE])
    assert not passed and "FORGED" not in message, message


def test_a_cell_rebinding_spawns_preparation_data_runs_nothing_in_the_devices():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _REBINDS_SPAWN,
                                                        _READS_THE_MARK])
    assert "device code: none" in message, message
    assert judge.judge("check_serial_loop", [IMPORTS, _REBINDS_SPAWN, RIGHT_LOOP])[0]


def test_a_copy_of_spawn_given_to_popen_forkserver_is_a_change():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, _COPIES_SPAWN, RIGHT_LOOP])
    assert not passed and "multiprocessing.popen_forkserver.spawn" in message, message


# Round 43's grading helper: exercise 03's messages.  A loop that ran its rounds in a pool and
# raised the engine's refusal again (``.result()``) was told the error "never reached" it; and
# check_three_rounds counted its steps from 0 where the question counts rounds from 1.
def test_a_refusal_raised_again_in_the_loop_is_not_said_to_be_lost():
    from concurrent.futures import ThreadPoolExecutor

    import mistakes
    from overlap_course import checks

    rounds = mistakes.make_zos()  # the solution's loop, run in a pool's thread

    def zos_loop(engine):
        with ThreadPoolExecutor(1) as pool:
            pool.submit(rounds, engine).result()

    v = checks.check_zos_loop(zos_loop)
    assert not v.passed and v.category == "other_thread", v
    assert "Your loop stopped with that error" in v.message and "never reached" not in v.message


def test_three_rounds_counts_its_steps_from_one():
    from overlap_course import checks

    v = checks.check_three_rounds([("sample", 1), ("forward", 1)])
    assert v.message.startswith("step 1: you wrote ('sample', 1)"), v.message
