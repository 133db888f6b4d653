"""The ZOS loop that tests hand an engine or a checker when they must see inside a run: the
order of ``toy_engine.loops.zos_loop``, written out (a checker reads a loop's own source and
names its parameter, ``eng``), with two places a test can look in or put a mistake."""

from __future__ import annotations


def _processed(eng, step) -> None:
    eng.process_outputs(step)


def zos_loop(seen=lambda inputs, step: None, finish=_processed):
    """A right ZOS loop, except where a test says: ``seen(inputs, step)`` is told each round's
    inputs and sampled step as they are launched (a test keeps them for after the run), and
    ``finish(eng, step)`` processes the round held back a round (a test can process it on
    another engine)."""

    def loop(eng):
        previous = None
        while eng.scheduler.has_work():
            plan = eng.schedule()
            if plan is None:
                previous = eng.flush(previous)
                continue
            inputs = eng.prepare_inputs(plan)
            if previous is not None:
                eng.correct_on_device(inputs)
            eng.launch_forward(inputs)
            if previous is not None:
                finish(eng, previous)
            current = eng.launch_sample(inputs)
            seen(inputs, current)
            if plan.is_prefill:
                eng.process_outputs(current)
                previous = None
            else:
                previous = current

    return loop
