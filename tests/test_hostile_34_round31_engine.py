"""Round 31 of issue 34, the engine (failed before its fix): a loop that scheduled a round on
its own thread and prepared it on another raised ``EngineStalled`` guessing "was
engine.schedule() called again before it ran?", without the refusal of the other thread's call
as its cause (the stall of a returning loop had it; the stall found by a schedule did not)."""

from __future__ import annotations

import threading

import pytest

import toy_engine as te
from toy_engine import loops
from toy_engine.run import EngineStalled


def test_a_stall_after_a_stage_refused_on_another_thread_names_that_refusal():
    def loop(engine):
        plan = engine.schedule()

        def launch():
            inputs = engine.prepare_inputs(plan)
            engine.launch_forward(inputs)
            engine.process_outputs(engine.launch_sample(inputs))
        helper = threading.Thread(target=launch)
        helper.start()
        helper.join()
        loops.serial_loop(engine)

    quiet = threading.excepthook
    threading.excepthook = lambda args: None  # the helper's refusal, expected
    try:
        with te.Engine(te.EngineConfig(mode="zos", device="cpu")) as engine:
            with pytest.raises(EngineStalled) as stalled:
                engine.generate(["Once upon a time", "The cat"], max_new_tokens=8, loop=loop)
            assert "from another thread" in str(stalled.value.__cause__), stalled.value
            again = engine.generate(["Once upon a time"], max_new_tokens=8)
            assert again[0].finish_reason == "length"
    finally:
        threading.excepthook = quiet
