"""The lesson: two loops over the same stages, in two orders.

``serial_loop`` finishes each round (schedule, prepare, launch forward and sample, process)
before it prepares the next, so the device idles while the host does that control work.
``zos_loop`` launches round N's forward *before* it processes round N-1, so the host works
while the device computes; round N-1 waits in a ``StepState`` until then (or ``flush``).

Both are plain functions of an engine: ``engine.generate(..., loop=my_loop)`` runs yours.
"""

from __future__ import annotations

from .run import StepState


def serial_loop(engine) -> None:
    """Prepare, launch, wait, process: one round at a time."""
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:  # on_round aborted what was left
            continue
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        step = engine.launch_sample(inputs)
        engine.process_outputs(step)


def zos_loop(engine) -> None:
    """Current forward, previous postprocess, current sampling."""
    previous: StepState | None = None
    while engine.scheduler.has_work():
        plan = engine.schedule()
        if plan is None:  # nothing left to launch: no next round to hide it under
            previous = engine.flush(previous)
            continue
        inputs = engine.prepare_inputs(plan)
        if previous is not None:
            engine.correct_on_device(inputs)
        engine.launch_forward(inputs)
        if previous is not None:
            engine.process_outputs(previous)
        current = engine.launch_sample(inputs)
        if plan.is_prefill:  # at once (real engines defer it too): its first token a round sooner
            engine.process_outputs(current)
            previous = None
        else:
            previous = current
