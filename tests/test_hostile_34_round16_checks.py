"""Round sixteen, checks16 (blind round): messages that said something false. Exercise 05's
extra wait after its own is described from the run's record, not as a wait "instead of" the
step's event; exercise 04(b)'s dict of None is refused as a dict, not read as "also stale";
exercise 02(b)'s rounded answer that fits two values no longer promises the check tells which;
notebook 07's ring_slots change names its call as the learner's own log counts it."""

import re

from overlap_course import checks
from overlap_course.checks import lesson07
from overlap_course.checks.readings import slip_reading

FIELDS = ["positions", "slot_mapping", "seqlens_k", "input_ids"]


def _commit_and_free(engine, step):
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def _waits_commits_then_synchronizes(engine, step):
    engine.device.wait(step.sample_done)
    _commit_and_free(engine, step)
    engine.device.synchronize()


def _waits_on_both_before_the_commit(engine, step):
    engine.device.synchronize()
    engine.device.wait(step.sample_done)
    _commit_and_free(engine, step)


def test_an_extra_synchronize_after_the_commit_is_not_called_a_wait_instead_of_the_event():
    v = checks.check_process_outputs(_waits_commits_then_synchronizes)
    assert not v and v.category == "waits_later_event", v.message
    assert "instead of `step.sample_done`" not in v.message
    assert "before it commits" not in v.message
    assert "waited on `step.sample_done`, committed the step, then waited again" in v.message
    assert "deferred decode steps waited for the next round's forward" in v.message
    assert "Drop the extra wait" in v.message


def test_a_wait_on_both_before_the_commit_says_both():
    v = checks.check_process_outputs(_waits_on_both_before_the_commit)
    assert not v and v.category == "waits_later_event", v.message
    assert "instead of `step.sample_done`" not in v.message
    assert "waited on `step.sample_done` and also, before it committed" in v.message
    assert "before it commits" in v.message


def test_a_dict_of_none_is_refused_as_a_dict_not_read_as_missing_fields():
    v = checks.check_metadata_answer(dict.fromkeys(FIELDS))
    assert not v and v.category == "shape", v.message
    assert "also stale" not in v.message
    assert "not a dict" in v.message and "to None, not a bool" in v.message
    marks = checks.check_metadata_answer(dict.fromkeys(FIELDS, True))
    assert marks.passed, marks.message
    assert checks.check_metadata_answer(dict.fromkeys(FIELDS).keys()).passed


def test_a_rounded_value_that_fits_two_slips_promises_nothing_the_check_never_says():
    slips = [("wall_denominator", 0.4412, "idle over the wall time", "use idle + busy", None)]
    v = slip_reading(0.44, 0.44048293, "the idle fraction", slips)
    assert not v and v.category == "wrong_value", v.message
    assert "the check tells which" not in v.message
    assert "both give 0.44" in v.message and "unrounded" in v.message


def _logged(answer):
    """A ring_slots that logs its depths and answers ``answer(depth, times asked so far)``."""
    log = []

    def ring_slots(depth):
        log.append(depth)
        return answer(depth, log.count(depth))
    return ring_slots, log


def _named_call(message: str, log: list) -> None:
    """The call the message names is the call the learner's log shows changing."""
    got = re.search(r"ring_slots\((\d)\) returned \d+ .*when asked again \(the (\d+)\w\w time "
                    r"this check asked for depth (\d); call (\d+) of its calls to ring_slots\)",
                    message)
    assert got, message
    depth, nth, again, call = map(int, got.groups())
    assert depth == again and log[-1] == depth and len(log) == call
    assert log.count(depth) == nth


def test_a_change_in_the_first_asking_names_the_call_the_log_shows():
    # the changed answer stays in range (d + 2 for depth 7 is a bad size, which is named first)
    ring_slots, log = _logged(lambda d, n: d + 1 if n <= 2 else d)
    v = checks.check_ring_slots(ring_slots)
    assert v.category == "keeps_state", v.message
    _named_call(v.message, log)


def test_a_change_after_the_runs_counts_the_calls_of_both_askings(monkeypatch):
    ran = []
    real = lesson07._ring_verdict

    def ring_verdict(*args):
        ran.append(args)
        return real(*args)
    monkeypatch.setattr(lesson07, "_ring_verdict", ring_verdict)
    ring_slots, log = _logged(lambda d, n: d + 1 if not ran else d)  # in range, as above
    v = checks.check_ring_slots(ring_slots)
    assert v.category == "keeps_state", v.message
    assert v.message.startswith("asked again after the runs"), v.message
    _named_call(v.message, log)
    assert log.count(log[-1]) >= 4  # 3 to 8 times before the runs, once after


def test_a_bad_size_when_asked_again_names_its_call_too():
    ring_slots, log = _logged(lambda d, n: d + 1 if n <= 2 else 0)
    v = checks.check_ring_slots(ring_slots)
    assert v.category == "shape", v.message
    got = re.search(r"asked again \(the 3rd time this check asked for depth (\d); call (\d+) of "
                    r"its calls to ring_slots\), ring_slots\((\d)\) returned 0", v.message)
    assert got, v.message
    depth, call, again = map(int, got.groups())
    assert depth == again == log[-1] and call == len(log) and log.count(depth) == 3
