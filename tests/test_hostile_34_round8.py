"""Issue 34's eighth hostile round, and the cases the seventh round's closing note left open: a
hub prefix holding a character a pattern reads (``(``, ``.``), and ``--db newdir/``, which
SQLite made a file ``newdir``.  Each failed when written."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from hostile_support import ROOT, one_clear_line, run_module, run_python
from overlap_course import progress_store

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("prefix", ["/services/room(2)/", "/services/a.b/"])
def test_a_hub_prefix_is_text_not_a_pattern(tmp_path, prefix):
    """``(`` in ``JUPYTERHUB_SERVICE_PREFIX`` was a ``re.error`` traceback at start; ``.``
    matched any character, so ``/services/aXb/`` reached the room too."""
    code = textwrap.dedent(f"""
        import asyncio
        from overlap_course import progress_service as ps
        class HubOAuth:
            @classmethod
            def instance(cls, **kw):
                return cls()
        ps.HubOAuth = HubOAuth
        from tornado.httpclient import AsyncHTTPClient
        from tornado.httpserver import HTTPServer
        from tornado.testing import bind_unused_port
        ps.RoomHandler.get_current_user = lambda self: {{"name": "teacher"}}
        service = ps.ProgressService(ps.open_store("room.sqlite"), "instructors", None, None)
        async def yes(name): return True
        async def nobody(): return []
        service.is_instructor, service.learners = yes, nobody
        async def main():
            sock, port = bind_unused_port()
            HTTPServer(service.make_app()).add_sockets([sock])
            client = AsyncHTTPClient()
            for path in ({prefix!r}, {prefix.replace(".", "X")!r}):
                r = await client.fetch(f"http://127.0.0.1:{{port}}{{path}}api/room",
                                       raise_error=False, request_timeout=60)
                print(r.code)
        asyncio.run(main())
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path,
                         env={**ENV, "JUPYTERHUB_SERVICE_PREFIX": prefix})
    codes = run.stdout.split()
    assert codes[:1] == ["200"], run.stderr[-800:]
    if "." in prefix:
        assert codes[1] == "404", codes


@pytest.mark.parametrize("name", ["newdir/", "existing"])
def test_a_db_that_names_a_folder_is_refused_and_nothing_is_made(tmp_path, name):
    """``--db newdir/`` made a file ``newdir`` (SQLite drops the slash), where the instructor
    meant a folder."""
    (tmp_path / "existing").mkdir()
    db = f"{tmp_path}{os.sep}{name}"  # a Path would drop the slash
    with pytest.raises(ValueError, match="names a folder"):
        progress_store.open_store(db)
    assert not (tmp_path / "newdir").exists()
    one_clear_line(run_module("overlap_course.progress_service", "--db", db),
                   "names a folder")
    assert not (tmp_path / "newdir").exists()


def test_an_exercise_checks_message_never_grows_with_the_answer():
    """A loop raising an exception class named with 5,000 characters, from a function named
    with 5,000 more: the notebook checks cut their messages at 800 characters, the exercise
    checks did not (5,020)."""
    from overlap_course import checks
    from overlap_course.checks import answers

    raised = type("E" * 5000, (Exception,), {})

    def loop(engine):
        raise raised("x")

    loop.__code__ = loop.__code__.replace(co_name="n" * 5000)
    verdict = checks.check_serial_loop(loop)
    assert not verdict.passed and verdict.category == "raised", verdict
    assert len(verdict.message) <= answers.MAX_MESSAGE, len(verdict.message)


LEARNERS_LAB_ENGINES = """
import sys
sys.path.insert(0, "tests")
from overlap_course import checks
from overlap_course.labs import plugins, plugins_2026
import labs07b_corpus as lab5
ring = plugins.ring_engine()  # notebook 07's cell: the learner's own to experiment on
ring.device.races.enabled = False
ring.flush = lambda previous: None
print("after edits", bool(checks.check_ring_slots(lambda depth: depth + 1)))
ring.close()
print("after close", bool(checks.check_ring_slots(lambda depth: depth + 1)))
plugins_2026.title_ring_engine().close()
print("title closed", bool(checks.check_before_sample(lab5.before_sample)))
"""


def test_the_labs_checks_do_not_run_on_the_engines_a_notebook_hands_the_learner():
    """Notebooks 07 and 07b hand out ``plugins.ring_engine()`` and ``title_ring_engine()`` to
    experiment on; the checks ran on those very engines, never healed: with its race checker
    off the right ``depth + 1`` was refused, closed it raised ``RuntimeError``."""
    run = run_python(LEARNERS_LAB_ENGINES, timeout=600)
    assert run.stdout.split("\n")[:3] == ["after edits True", "after close True",
                                         "title closed True"], (run.stdout, run.stderr[-1500:])


def correction_reading_the_host_unseen(meta, accepted, block_size):
    """Right values, read on the host with ``int()``, with torch's function modes switched off
    so that the checker's counter sees none of it (round eight: full marks with real
    nbgrader)."""
    import torch

    with torch._C.DisableTorchFunction():
        delta = accepted[meta["rows"]] * meta["pending"]
        shifts = [int(d) for d in delta]  # a host read per request
        qs = [int(q) for q in meta["seqlens_q"]]
        meta["seqlens_k"] += delta
        meta["positions"] += torch.tensor([s for s, q in zip(shifts, qs) for _ in range(q)])
        owner = torch.arange(len(delta)).repeat_interleave(torch.tensor(qs))
        p = meta["positions"]
        meta["slot_mapping"][:] = (meta["block_tables"][owner, p // block_size] * block_size
                                   + p % block_size)


def test_a_host_read_hidden_from_the_counter_is_still_a_host_read():
    from overlap_course import checks

    verdict = checks.check_correction(correction_reading_the_host_unseen)
    assert not verdict.passed and verdict.category == "host_read", verdict
    assert "hold no values" in verdict.message


def zos_loop_prefill_after_the_next_schedule(engine):
    """A blind learner's loop (round eight): the prefill step kept aside and processed only
    after the next round's ``schedule()``, though before its ``prepare_inputs``.  With a stop
    string hit at the first token the scheduler plans rounds for finished requests (6 rounds
    and 4 discarded outputs where the engine's loop takes 4 and 2); the checker passed it."""
    previous = prefill = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if prefill is not None:
            engine.process_outputs(prefill)
            prefill = None
        if plan is None:
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
            previous = None
        step = engine.launch_sample(inputs)
        if plan.is_prefill:
            prefill = step
        else:
            previous = step
    if prefill is not None:
        engine.process_outputs(prefill)
    engine.flush(previous)


def test_a_prefill_processed_after_the_next_schedule_is_deferred():
    from overlap_course import checks

    verdict = checks.check_zos_loop(zos_loop_prefill_after_the_next_schedule)
    assert not verdict.passed and verdict.category == "prefill_deferred", verdict
    assert "schedule()" in verdict.message

