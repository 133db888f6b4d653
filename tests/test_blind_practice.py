"""The blind practice round (tests/blind_practice.py): wrong and unusual-right answers to the
checks of notebooks 00-06, written by someone who saw only the notebooks.

Every wrong answer must fail with a category, never a traceback, and every right one pass.  The
author's judgement stands, except where it was read against the course's rules and ruled
otherwise (``RULED_RIGHT``), and where a wrong method's *number* lands on the right one in this
run (``right_by_value``): a check judges the value it is given, so such an answer is right on
that run and wrong on the next.  The rules behind the answers ruled right for their value are
run on the notebooks' second questions, which were added to catch them (``SECOND_QUESTIONS``).

Each notebook's arguments are built once, then closed before the next notebook's.
"""

import pytest

from overlap_course import checks
from overlap_course.checks import sandbox
from toy_engine.runinfo import RunStats

from blind_practice import BLIND_PRACTICE, build_namespace, close_engines, evaluate, round_gap, stage_by

# (check, answer name) -> why the answer is right although its author marked it wrong
RULED_RIGHT = {
    ("check_serial_loop", "flush_as_process"):
        "engine.flush(step) is process_outputs(step) recorded under the name `flush`: the run waits, commits and "
        "frees exactly as the serial loop does. Nothing the course measures reads a learner loop's stage names "
        "(notebook 02's tables read the engine's own loop; the engine's stats count flush as host work), so the "
        "name is no mistake; the verdict notes it (as tests/test_blind_corpus.py rules zos_process_instead_of_flush)",
    ("check_slot", "pos_times_block_size"):
        "37 is the slot of position 9; the rule behind it fails notebook 01's second request (SECOND_QUESTIONS)",
    ("check_slot", "last_block_of_table"): "as pos_times_block_size",
    ("check_true_key_length", "plus_k_drafts"):
        "31 is the key length; the rule (add K) fails notebook 04's second request, which accepted 2 of 4 drafts",
    ("check_corrected_slots", "consecutive_from_first"):
        "[20, 21, 22] are the slots; the rule fails notebook 04's second request, whose positions cross a block",
    ("check_processed_under", "process_before_forward"):
        "the question asks which round is processed in that pass, and 1 is it; where in the pass is not asked "
        "here: exercise 03's checker judges the order (category process_before_forward)",
    ("check_idle_sync", "first_sync_in_trace"):
        "the name is the culprit's; one name cannot show how it was found. A wrong sync of this trace fails "
        "(other_sync); on a100_alexnet, whose first sync is not the culprit, the same rule fails (test below)",
    ("check_idle_sync", "only_sync_listed"):
        "as first_sync_in_trace: the export records each wait as cudaEventSynchronize (notebook 06 says so), so "
        "this question checks the tool's use, and its one candidate is the right name",
}

# (check, answer name) -> why the answer is wrong although its author marked it right
RULED_WRONG = {
    ("check_serial_loop", "delegates"):
        "exercise 02 asks for the loop written from the stage methods ('you write both pieces yourself'); "
        "the engine's own loop asked for every round (category engine_loop, since 2026-12-07)",
}

# The notebooks' second questions, each with the rule of an answer ruled right above: (call, value).
SECOND_QUESTIONS = {
    "pos_times_block_size": lambda: checks.check_slot(6 * 4 + 6 % 4, table=[3, 8, 6, 1], pos=6, block_size=4,
                                                      name="second_slot"),
    "last_block_of_table": lambda: checks.check_slot([3, 8, 6, 1][-1] * 4 + 6 % 4, table=[3, 8, 6, 1], pos=6,
                                                     block_size=4, name="second_slot"),
    "plus_k_drafts": lambda: checks.check_true_key_length(19 + 4, host_seqlens_k=19, accepted=2,
                                                          name="second_seqlens_k"),
    "consecutive_from_first": lambda: checks.check_corrected_slots(
        (lambda s: [s, s + 1, s + 2])(9 * 4 + 3), positions=[1, 2, 3], table=[9, 4, 2], accepted=2, block_size=4,
        name="second_slots"),
}


def _gap(ns):
    return round_gap(ns["engine"].timeline, 10)


def _ideal(ns):
    stats = ns["serial_stats"]
    h, d = stats.mean_host_ms_per_round, stats.mean_device_ms_per_round
    return (h + d) / max(h, d)


# check -> (this run's right value, the check's tolerance): a measured number from a wrong method
# that lands within it is right on this run (the median gap is round 10's, the measured speed-up
# reaches the ideal, (h + d) / d where the device is the longer lane, one decimal that is two ...).
MEASURED = {
    "check_round_gap": (_gap, lambda want: checks.lesson02.GAP_PRECISION_MS),
    "check_ideal_ratio": (_ideal, lambda want: max(0.006, 0.005 * abs(want))),
}


def right_by_value(entry, ns, value) -> bool:
    """Is this wrong answer's value the right one on this run?"""
    if entry.check in MEASURED:
        truth, tolerance = MEASURED[entry.check]
        want = truth(ns)
        try:
            return abs(float(value) - want) <= tolerance(want)
        except (TypeError, ValueError):
            return False
    if entry.name == "argmax_wall_time":  # wall and CPU time rank the stages alike on a quiet machine
        return value == stage_by(ns["engine"].timeline, "cpu_ms")
    return False


_BUILT: dict = {}


@pytest.fixture(scope="module")
def namespaces():
    """The namespace of one notebook's arguments at a time: the previous one's engines close first."""
    def get(args_from):
        if args_from not in _BUILT:
            for ns in _BUILT.values():
                close_engines(ns)
            _BUILT.clear()
            _BUILT[args_from] = build_namespace(args_from)
        return _BUILT[args_from]

    yield get
    for ns in _BUILT.values():
        close_engines(ns)
    _BUILT.clear()


@pytest.mark.parametrize("entry", BLIND_PRACTICE, ids=[f"{a.check}-{a.name}" for a in BLIND_PRACTICE])
def test_blind_practice_answer(entry, namespaces, monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 10.0)
    ns = namespaces(entry.args_from)
    verdict = evaluate(entry, ns)
    wrong = entry.wrong and (entry.check, entry.name) not in RULED_RIGHT and not right_by_value(
        entry, ns, ns["answer"]) or (entry.check, entry.name) in RULED_WRONG
    assert "Traceback" not in verdict.message, verdict
    if wrong:
        assert not verdict.passed and verdict.category != "passed", f"FALSE PASS ({entry.why}): {verdict!r}"
        assert ((entry.check, entry.name) in RULED_WRONG) == (verdict.category == "engine_loop"), verdict
    else:
        assert verdict.passed, f"WRONG FAILURE ({entry.why}): {verdict!r}"


@pytest.mark.parametrize("name", sorted(SECOND_QUESTIONS))
def test_the_second_question_catches_the_rule(name):
    verdict = SECOND_QUESTIONS[name]()
    assert not verdict.passed and verdict.category not in ("passed", "shape"), verdict


def test_first_sync_fails_where_it_is_not_the_culprit():
    from overlap_course.traces import kineto
    first = kineto.host_syncs("a100_alexnet")[0]
    assert checks.check_idle_sync(first, "a100_alexnet").category == "other_sync"


def test_the_device_bound_formula_fails_where_the_host_is_longer():
    """(h + d) / d equals the ideal whenever the device is the longer lane (the CPU stand-in);
    with the host longer (a GPU, or host_overhead_ms) the check names it."""
    stats = RunStats(rounds=21, wall_ms=100.0, device_busy_ms=90.0, device_idle_fraction=0.5,
                     mean_host_ms_per_round=4.0, mean_device_ms_per_round=2.0, tokens=100, tokens_per_s=1000.0,
                     prefill_rounds=1, decode_rounds=20, decode_device_idle_fraction=0.5, draft_tokens_proposed=0,
                     draft_tokens_accepted=0, mean_accepted_per_round=0.0, tokens_per_forward=7.0, discarded_outputs=0)
    assert checks.check_ideal_ratio((4.0 + 2.0) / 2.0, stats).category == "divides_by_smaller"


def test_the_rulings_name_real_answers():
    keys = [(a.check, a.name) for a in BLIND_PRACTICE]
    assert set(RULED_RIGHT) <= set(keys) and set(SECOND_QUESTIONS) <= {n for _, n in RULED_RIGHT}
    assert all(keys.count(k) == 1 for k in RULED_RIGHT), "a ruling must name one answer"
    wrong = sum(a.wrong for a in BLIND_PRACTICE)
    assert wrong >= 140 and len(BLIND_PRACTICE) - wrong >= 69
