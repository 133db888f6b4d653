"""The loops that tests hand an engine or a checker as right answers, written out: the
checkers of exercises 02 and 03 refuse the engine's own loops as answers (``engine_loop``).
The ZOS loop is the order of ``toy_engine.loops.zos_loop`` (a checker reads a loop's own source
and names its parameter, ``eng``), with two places a test can look in or put a mistake."""

from __future__ import annotations


def _processed(eng, step) -> None:
    eng.process_outputs(step)


def serial_loop(eng):
    """A right serial loop: the order of ``toy_engine.loops.serial_loop``, written out."""
    while eng.scheduler.has_work():
        plan = eng.schedule()
        inputs = eng.prepare_inputs(plan)
        eng.launch_forward(inputs)
        eng.process_outputs(eng.launch_sample(inputs))


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


def processed_by_hand(eng, step) -> None:
    """What ``engine.process_outputs`` does, written out: the body a process_outputs plug-in
    has before a test puts its one change in it."""
    eng.device.wait(step.sample_done)
    for req in eng.commit_outputs(step, eng.read_outputs(step)):
        eng.scheduler.release_if_done(req)


def engine_per_mode(prompts: list[str]):
    """A module's engine, serial then ZOS (one each, shared by its tests), that knows the texts
    its ``prompts`` give at 20 new tokens (``engine.want``)."""
    import pytest
    import toy_engine as te

    @pytest.fixture(scope="module", params=["serial", "zos"])
    def engine(request):
        with te.Engine(te.EngineConfig(mode=request.param, device="cpu")) as eng:
            eng.want = [c.text for c in eng.generate(prompts, 20)]
            yield eng
    return engine
