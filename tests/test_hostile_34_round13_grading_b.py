"""Issue 34, round thirteen, grading (b): the checks' shared engines were kept from the
submission's cells to the check.  A cell that built them with ``pool.Engine`` swapped for a
subclass of its own (its ``generate`` runs the engine's serial loop whatever loop it is given),
then put the name back, left engines that ``heal`` took as "as built": a wrong loop passed.  A
ring of host slots a cell left set (``te.engine.RING_SLOTS``) reached the engines the check
built.  Each failed when written."""

from __future__ import annotations

import inspect


from overlap_course.build import judge
from overlap_course.checks import pool

from judged import IMPORTS, RIGHT_LOOP, WRONG_LOOP, needs_the_engine


_POISON = '''
from toy_engine import loops as _loops
from overlap_course.checks import pool as _pool
_Real, _own = _pool.Engine, _loops.serial_loop

class _Poisoned(_Real):
    def generate(self, prompts, loop=None, **kw):   # whatever loop it is given: the engine's
        return super().generate(prompts, loop=_own, **kw)

_pool.Engine = _Poisoned                  # for the engines built in this cell only
try:
    _pool.engine(); _pool.engine(num_draft_tokens=_pool.DRAFTS)
finally:
    _pool.Engine = _Real                  # every name as the judge marked it
'''


def test_engines_a_cell_built_with_a_swapped_engine_class_do_not_pass_a_wrong_loop():
    needs_the_engine()
    passed, message = judge.judge("check_serial_loop", [IMPORTS, WRONG_LOOP, _POISON])
    assert passed is False, message
    assert "differs from the reference" in message


def test_a_right_loop_after_a_cell_that_runs_the_pools_engines_still_passes():
    needs_the_engine()
    runs = ("from overlap_course.checks import pool\n"
            "pool.start({}, {'num_draft_tokens': pool.DRAFTS})\n"
            "pool.engine().generate(['Once'], max_new_tokens=3)\n")
    passed, message = judge.judge("check_serial_loop", [IMPORTS, RIGHT_LOOP, runs])
    assert passed is True, message


def test_a_ring_of_slots_a_cell_left_set_does_not_reach_the_checks_engines():
    needs_the_engine()
    from toy_engine import loops
    # the engine's loop, with a docstring of the learner's: typed, not the engine's own code
    # (pasted whole, docstring and all, it is: engine_loop, round 49)
    zos = "from toy_engine.run import StepState\n" + inspect.getsource(loops.zos_loop).replace(
        loops.zos_loop.__doc__, "Mine: this round's forward, the last one's processing.")
    passed, message = judge.judge("check_zos_loop",
                                  [IMPORTS, zos, "te.engine.RING_SLOTS.set(1)\n"])
    assert passed is True, message


def test_close_engines_forgets_every_engine_with_its_books_and_one_built_as_it_closes():
    first = pool.engine()
    late = []

    class Closing(type(first)):
        def close(self):  # a learner's close() that builds another shared engine
            late.append(pool.engine(num_draft_tokens=pool.DRAFTS))
            super().close()

    first.__class__ = Closing
    try:
        pool.close_engines()
    finally:
        first.__class__ = Closing.__mro__[1]
    assert first.closed and late
    assert not (pool._ENGINES or pool._CONFIGS or pool._BUILT or pool._PRINTS
                or pool._DEVICES)
    late[0].close()
    assert pool.engine() is not first and not pool.engine().closed
    pool.close_engines()
