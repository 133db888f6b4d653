"""The exercise checkers judge behaviour: the four false passes of issue 11 now fail with
messages a learner can act on, and each checker answers within the course's 10 s.

The full corpus of wrong answers and correct alternatives is in tests/mistakes.py
(run by tests/test_mistakes.py); these tests pin the wording the notebooks quote.
"""

import re
import time

import pytest

from overlap_course import checks
from overlap_course.checks import pool, sandbox
from toy_engine import kernels, loops

import mistakes
import loops_for_tests


def not_written(*args):
    raise NotImplementedError


def test_not_implemented_is_reported_the_same_way_everywhere():
    for verdict in (checks.check_serial_loop(not_written), checks.check_zos_loop(not_written),
                    checks.check_correction(not_written), checks.check_process_outputs(not_written),
                    checks.check_three_rounds(None), checks.check_metadata_answer(None)):
        assert not verdict and verdict.category == "not_implemented"
        assert repr(verdict).startswith("NOT YET: not implemented yet: fill in ")


# ---- the false passes of issue 11 -----------------------------------------------------

def test_a_zos_loop_without_the_correction_fails_with_drafts():
    v = checks.check_zos_loop(mistakes.make_zos(correct="never"))
    assert not v and v.category == "correction"
    assert "3 drafts per round" in v.message and "engine.correct_on_device(inputs)" in v.message
    assert "round 2 (decode, prompts [0, 1, 2])" in v.message


def test_forward_sample_postprocess_fails_in_03a_as_in_03b():
    v = checks.check_zos_loop(mistakes.make_zos(sample_first=True))
    assert not v and v.category == "sample_before_process"
    assert "launch_forward 2 -> launch_sample 2 -> postprocess 1" in v.message and "title_case" in v.message
    order = [("forward", 1), ("sample", 1), ("forward", 2), ("sample", 2), ("postprocess", 1)]
    assert checks.check_three_rounds(order).category == "sample_before_postprocess"


@pytest.mark.parametrize("answer", [mistakes.process_synchronizes, mistakes.process_waits_on_a_fresh_event])
def test_waiting_on_a_later_event_fails_and_says_what_it_cost(answer):
    v = checks.check_process_outputs(answer)
    assert not v and v.category == "waits_later_event"
    assert "step.sample_done" in v.message
    assert "deferred decode steps waited for the next round's forward" in v.message
    # read from the record (so it holds on a busy machine): every deferred step waited for the next
    # forward
    counted = v.message.split("in this run ")[1]
    lost, total = int(counted.split(" of ")[0]), int(counted.split(" of ")[1].split(" ")[0])
    assert total > 0 and lost == total


def test_a_zos_loop_handed_in_as_the_serial_loop_fails():
    v = checks.check_serial_loop(loops_for_tests.zos_loop())
    assert not v and v.category == "not_serial"
    assert "round 1 (decode, prompts [0, 1, 2]): its results were processed after round 2 was prepared" in v.message


# ---- raw or wrong diagnoses, now lesson-level ------------------------------------------

def test_launch_sample_before_launch_forward_names_the_round_and_prompts():
    v = checks.check_serial_loop(mistakes.serial_sample_first)
    assert v.category == "sample_before_forward"
    assert v.message.startswith("round 0 (prefill, prompts [0, 1, 2]): `launch_sample` was called "
                                "with no `launch_forward` of the round before it")
    assert "DeviceError" not in v.message


def test_a_step_processed_twice_is_named():
    v = checks.check_serial_loop(mistakes.serial_processes_twice)
    assert v.category == "processed_twice" and "processed 2 times" in v.message
    assert "NoneType" not in v.message


@pytest.mark.parametrize("answer, category, words", [
    (mistakes.process_forgets_commit, "never_committed", "never committed"),
    (mistakes.process_commits_twice, "committed_twice", "committed 2 times"),
    (mistakes.process_frees_when_nothing_in_flight, "freed_unfinished", "which is not finished"),
    (mistakes.process_frees_before_commit, "kept_blocks", "free it after committing"),
    (mistakes.process_frees_early, "free_in_use", "the extra step"),
    (mistakes.process_reads_first, "read_before_wait", "before waiting on its completion event"),
])
def test_lifetime_mistakes_get_their_own_diagnosis(answer, category, words):
    v = checks.check_process_outputs(answer)
    assert not v and v.category == category and words in v.message, repr(v)
    assert "prompt" in v.message and "round" in v.message and not re.search(r"requests? \d", v.message)
    assert "prompt(s) []" not in v.message and "requests []" not in v.message


def test_cu_seqlens_k_is_accepted_and_explained():
    v = checks.check_metadata_answer({"seqlens_k", "positions", "slot_mapping", "input_ids", "cu_seqlens_k"})
    assert v and "running sum" in v.message


def test_a_hard_coded_block_size_is_named_before_the_engine_runs():
    v = checks.check_correction(mistakes.correction_block_size_4)
    assert v.category == "block_size_hardcoded" and "use the `block_size` argument" in v.message


def test_the_worked_case_is_the_notebooks():
    meta, accepted, expected = checks.worked_case()
    assert meta["slot_mapping"].tolist() == [30, 31, 4, 11, 16, 17, 34, 35, 20]
    kernels.correct_seqlens_qk(meta, accepted, 4)
    assert {n: meta[n].tolist() for n in expected} == expected


def test_three_rounds_expected_order_and_final_step_name():
    assert checks.expected_three_rounds() == mistakes.THREE_ROUNDS  # ends with ("flush", 3), like 03a demands


# ---- answer time ------------------------------------------------------------------------

@pytest.mark.parametrize("check, answer", [
    (checks.check_serial_loop, mistakes.serial),
    (checks.check_zos_loop, mistakes.make_zos()),
    (checks.check_correction, mistakes.correction),
    (checks.check_process_outputs, mistakes.process),
])
def test_each_checker_answers_within_ten_seconds(check, answer):
    check(answer)  # engines started (a notebook's first call pays for that once)
    start = time.perf_counter()
    assert check(answer)
    assert time.perf_counter() - start < 10.0


def test_a_loop_that_replaces_an_engine_method_leaves_later_checks_unharmed():
    assert checks.check_zos_loop(mistakes.zos_replaces_process_outputs).category == "edits_engine"
    assert checks.check_process_outputs(mistakes.process_outputs_replaces_the_method).category == "edits_engine"
    assert checks.check_zos_loop(mistakes.make_zos()).passed
    assert checks.check_serial_loop(mistakes.serial).passed
    assert checks.check_process_outputs(mistakes.process).passed


# ---- issue 20: checks a learner's code cannot poison or hang -----------------------------

def test_an_earlier_cells_patches_are_restored_and_named():
    import toy_engine as te

    original = (te.kernels.correct_seqlens_qk, te.engine.NUM_SLOTS, te.Engine.process_outputs)
    te.kernels.correct_seqlens_qk = lambda meta, accepted, block_size: None
    te.engine.NUM_SLOTS = 1
    te.Engine.process_outputs = lambda self, step, stage="postprocess": None
    te.Engine.helper = lambda self: None
    try:
        v = checks.check_correction(mistakes.correction)
    finally:
        leftover = (te.kernels.correct_seqlens_qk, te.engine.NUM_SLOTS, te.Engine.process_outputs)
        te.kernels.correct_seqlens_qk, te.engine.NUM_SLOTS, te.Engine.process_outputs = original
        te.Engine.__dict__.get("helper") and delattr(te.Engine, "helper")
    assert v, repr(v)
    assert leftover == original  # restored by the check itself
    for name in ("toy_engine.kernels.correct_seqlens_qk", "toy_engine.engine.NUM_SLOTS",
                 "toy_engine.engine.Engine.process_outputs"):
        assert name in v.message
    assert "put the toy's original back, and it stays back for every later cell" in v.message
    assert "`toy_engine.engine.NUM_SLOTS` (it was 1, now 2 again)" in v.message


def test_a_patch_the_learner_put_back_is_not_named():
    """``Engine.flush`` replaced, then put back as ``RoundStages.flush`` (the method it inherits):
    nothing is changed any more, so the note names only what still was."""
    import toy_engine as te

    te.Engine.flush = lambda self, previous: None
    te.Engine.flush = te.stages.RoundStages.flush
    te.Engine.process_outputs = lambda self, step, stage="postprocess": None
    try:
        v = checks.check_three_rounds(mistakes.THREE_ROUNDS)
    finally:
        for name in ("flush", "process_outputs"):
            te.Engine.__dict__.get(name) and delattr(te.Engine, name)
    assert v, repr(v)
    assert "Engine.process_outputs" in v.message and "flush" not in v.message.split("Note:")[1]


def test_a_patch_made_while_the_check_runs_fails_it_and_is_undone():
    import toy_engine as te

    original = te.kernels.correct_seqlens_qk

    def patching(meta, accepted, block_size):
        te.kernels.correct_seqlens_qk = patching
        mistakes.correction(meta, accepted, block_size)

    v = checks.check_correction(patching)
    assert not v and v.category == "edits_engine" and "toy_engine.kernels.correct_seqlens_qk" in v.message
    assert te.kernels.correct_seqlens_qk is original


def test_a_config_replaced_in_a_plugin_is_refused_and_one_replaced_between_checks_put_back():
    """During a run the engine refuses the replacement (its stages read the config every
    round); one made between runs, as an earlier cell would, is put back by the next check."""
    import dataclasses

    def replaces_config(engine, step):
        engine.config = dataclasses.replace(engine.config, race_check=False)
        mistakes.process(engine, step)

    v = checks.check_process_outputs(replaces_config)
    assert not v and "engine.config cannot be replaced while generate runs" in v.message
    for shared in list(pool._ENGINES.values()):
        shared.config = dataclasses.replace(shared.config, race_check=False)
    v = checks.check_process_outputs(mistakes.process)
    assert v and "engine.config" in v.message


def test_the_time_limit_stops_code_that_catches_base_exception_and_engines_stay_healthy(
        monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 3.0)  # the real 30 s stops it the same way
    start = time.monotonic()
    v = checks.check_zos_loop(mistakes.zos_loops_forever)
    took = time.monotonic() - start
    assert not v and v.category == "time_limit" and v.message.startswith(
        f"your code was still running after {sandbox.TIME_LIMIT_S:.0f} s, at line")
    assert "zos_loops_forever" in v.message
    assert took < sandbox.TIME_LIMIT_S + 30  # the limit plus the engines' recovery, on a busy machine
    assert checks.check_zos_loop(mistakes.make_zos())  # the shared engines work afterwards


def test_a_double_free_leaves_the_shared_pool_whole():
    v = checks.check_process_outputs(mistakes.process_double_free)
    assert not v and v.category == "double_free"
    for engine in pool._ENGINES.values():
        assert sorted(engine.scheduler.blocks.free_ids) == list(range(engine.config.num_kv_blocks))
    assert checks.check_process_outputs(mistakes.process)


def test_a_wait_before_the_forward_is_named_with_its_cost_in_words():
    v = checks.check_zos_loop(mistakes.make_zos_inline(wait="before_forward"))
    assert not v and v.category == "waits_before_forward"
    assert "round 1 (decode, prompts [0, 1, 2])" in v.message and "before it launched round 2's forward" in v.message


def test_inline_processing_in_serial_order_is_not_called_deferred():
    v = checks.check_zos_loop(mistakes.make_zos_inline(serial_order=True))
    assert not v and "no decode step was deferred" in v.message


def test_the_serial_loop_that_synchronizes_gets_no_advice_about_flushing():
    v = checks.check_serial_loop(mistakes.serial_synchronizes_instead)
    assert not v and "flush" not in v.message and "process_outputs(step)" in v.message


_SWALLOWING_LOOPS = """
import sys
from overlap_course.checks import harness, sandbox
sandbox.TIME_LIMIT_S = 0.02
def swallows_everything():
    while True:
        try:
            len("a")
        except BaseException:
            pass
for _ in range(20):
    verdict = harness._time_limited(swallows_everything, (), {})
    assert verdict.category == "time_limit", verdict
print("stopped 20 of 20")
"""


def test_a_time_up_that_fires_inside_the_trace_function_still_stops_the_code():
    """A TimeUp can fire at the trace function's own entry, which turns tracing off for good: before the
    watchdog, 3 of 3 runs of such a loop hung within 5 tries.  In a child process, so a hang fails here."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _SWALLOWING_LOOPS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "stopped 20 of 20" in done.stdout, done.stderr[-2000:]
