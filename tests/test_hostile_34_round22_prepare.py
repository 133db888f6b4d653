"""Round twenty-two's prepare_inputs cases: two requests' KV blocks or rows swapped just before
prepare_inputs and put back just after are refused by name (they gave silently wrong texts);
lab 7b's keys reach the metadata through prepare_inputs' rows= and still show the lab's leak;
max_new_tokens lowered to a request's length ends it "length" in every mode (serial stalled);
lowered after the round was planned, the refusal names the loop and the field, not a plug-in."""
import pytest

import toy_engine as te
from loops_for_tests import engine_per_mode

PROMPTS = ["Once upon", "The king said", "She ", "A"]
LEAK = ["Once upon a time", "The king said", "She liked", "A little cat", "Hello there"]

engine = engine_per_mode(PROMPTS)


def swapping(field: str, at: int = 3):
    """The ZOS loop (serial: each step processed at once), swapping ``field`` of round ``at``'s
    first two requests just before prepare_inputs and putting it back just after."""
    def loop(eng):
        previous = None
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                previous = eng.flush(previous)
                continue
            a, b = plan.requests[:2]
            swap = plan.round == at

            def exchange():
                if swap:
                    x, y = getattr(a, field), getattr(b, field)
                    setattr(a, field, y)
                    setattr(b, field, x)
            exchange()
            inputs = eng.prepare_inputs(plan)
            exchange()
            if previous is not None:
                eng.correct_on_device(inputs)
            eng.launch_forward(inputs)
            if previous is not None:
                eng.process_outputs(previous)
                previous = None
            step = eng.launch_sample(inputs)
            if eng.config.mode == "zos" and not plan.is_prefill:
                previous = step
            else:
                eng.process_outputs(step)
    return loop


def test_blocks_swapped_around_prepare_inputs_and_put_back_are_refused_by_name(engine):
    with pytest.raises(ValueError, match=r"prompt 0's req\.blocks was changed from \[[\d, ]+\] "
                                         r"to \[[\d, ]+\] since engine\.schedule\(\) planned"):
        engine.generate(PROMPTS, 20, loop=swapping("blocks"))
    assert [c.text for c in engine.generate(PROMPTS, 20)] == engine.want


@pytest.mark.parametrize("drafts", [0, 3])
def test_rows_swapped_around_prepare_inputs_and_put_back_are_refused_by_name(drafts):
    with te.Engine(te.EngineConfig(mode="zos", device="cpu", num_draft_tokens=drafts)) as eng:
        want = [c.text for c in eng.generate(PROMPTS, 16)]
        with pytest.raises(ValueError, match=r"prompt 0's req\.row was changed from 0 to 1 "
                                             r"since engine\.schedule\(\) planned it"):
            eng.generate(PROMPTS, 16, loop=swapping("row"))
        assert [c.text for c in eng.generate(PROMPTS, 16)] == want


def keyed(key):
    """Lab 7b's future_key loop in short: each request's key as its row in the metadata."""
    def loop(eng):
        previous = None
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                previous = eng.flush(previous)
                continue
            inputs = eng.prepare_inputs(plan, rows=[key(r, b) for b, r in
                                                    enumerate(plan.requests)])
            eng.launch_forward(inputs)
            if previous is not None:
                eng.process_outputs(previous)
            previous = eng.launch_sample(inputs)
            if plan.is_prefill:
                previous = eng.process_outputs(previous)
    return loop


def test_keys_passed_as_rows_keep_the_labs_leak_and_its_fix():
    with te.Engine(te.EngineConfig(mode="zos", device="cpu", max_batch_size=3)) as eng:
        want = [c.text for c in eng.generate(LEAK, 16, stop=[" the"])]
        right = eng.generate(LEAK, 16, stop=[" the"], loop=keyed(lambda req, b: req.row))
        assert [c.text for c in right] == want
        shipped = eng.generate(LEAK, 16, stop=[" the"], loop=keyed(lambda req, b: b))
        assert [c.text for c in shipped] != want  # the lab's bug still shows
        for rows, error, words in (
                ((0, 1), ValueError, r"rows must be a list of 3 rows, one per planned request"),
                ("012", TypeError, r"rows must be a list of 3 rows"),
                ([0, 1, 3], ValueError, r"prepare_inputs' rows\[2\] must be in \[0, 2\], got 3 "
                                        r"\(the device keeps 3 rows\)"),
                ([0, 1.0, 2], TypeError, r"prepare_inputs' rows\[1\] must be an integer")):
            with pytest.raises(error, match=words):
                eng.generate(LEAK[:4], 16, loop=_given_rows(rows))
        assert [c.text for c in eng.generate(LEAK, 16, stop=[" the"])] == want


def _given_rows(rows):
    """A loop whose first prepare_inputs is given ``rows`` as they are."""
    def loop(eng):
        eng.prepare_inputs(eng.schedule(), rows=rows)
    return loop


def stop_now(eng, round):
    if round == 6:
        for r in eng.requests:
            r.max_new_tokens = min(r.max_new_tokens, len(r.output_ids))


def test_max_new_tokens_lowered_to_the_length_in_on_round_ends_length_in_every_mode():
    got = {}
    for mode in ("serial", "zos"):
        with te.Engine(te.EngineConfig(mode=mode, device="cpu")) as eng:
            got[mode] = [(c.text, c.finish_reason)
                         for c in eng.generate(PROMPTS, 12, on_round=stop_now)]
    assert got["serial"] == got["zos"]
    assert {reason for _, reason in got["serial"]} == {"length"}
    assert all(0 < len(text) < 12 for text, _ in got["serial"])


def test_a_loop_lowering_max_new_tokens_before_schedule_ends_the_request_length(engine):
    def loop(eng):  # each step processed at once, as the serial loop does
        while eng.scheduler.has_work():
            inputs = eng.prepare_inputs(eng.schedule())
            eng.launch_forward(inputs)
            eng.process_outputs(eng.launch_sample(inputs))
            r = eng.requests[0]
            if len(r.output_ids) == 3:
                r.max_new_tokens = 3
    outs = engine.generate(PROMPTS, 20, loop=loop)
    assert (len(outs[0].token_ids), outs[0].finish_reason) == (3, "length")
    assert [c.text for c in outs[1:]] == engine.want[1:]


def lowering(eng):
    while eng.scheduler.has_work():
        plan = eng.schedule()
        if plan.round == 3:
            r = plan.requests[0]
            r.max_new_tokens = len(r.output_ids)
        inputs = eng.prepare_inputs(plan)
        eng.launch_forward(inputs)
        eng.process_outputs(eng.launch_sample(inputs))


def test_max_new_tokens_lowered_after_schedule_names_the_loop_not_a_plugin():
    with te.Engine(te.EngineConfig(mode="serial", device="cpu")) as eng:
        want = [c.text for c in eng.generate(PROMPTS, 12)]
        with pytest.raises(ValueError) as err:
            eng.generate(PROMPTS, 12, loop=lowering)
        msg = str(err.value)
        assert type(err.value).__name__ == "PlannedPastLimit"
        assert "plug-in" not in msg
        assert ("loop=lowering lowered its req.max_new_tokens from 12 to 3 after "
                "engine.schedule() planned this round for it" in msg)
        assert [c.text for c in eng.generate(PROMPTS, 12)] == want
