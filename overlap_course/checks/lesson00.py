"""Lesson 00 (notebook 00_start_here): a stream runs its work in order, an event marks a
point in it, and the host may read a kernel's output only after waiting on an event recorded
after that kernel.  The race questions run the learner's order on the real device, race
checker on, and judge what the checker saw.
"""

from __future__ import annotations

import itertools

import torch

from toy_engine.device import DeviceError
from toy_engine.races import RaceError

from . import context
from .answers import MAX_ITEMS, bare_number, int_set, length, name, sequence, show
from .harness import notebook_check
from .verdict import Verdict, fails, passes, unanswered

__all__ = ["check_done_after_wait", "check_race", "check_race_fixed"]

_STEPS = ("launch", "record", "wait", "read")
_ANSWER_IDS = itertools.count(1000)


def _one_of_the_kernels(a: dict) -> str | None:
    if a["waited"] < a["num_kernels"]:
        return None
    last = a["num_kernels"] - 1
    return f"waited={a['waited']} is no event of {a['num_kernels']} kernels (0 to {last})"


@notebook_check
@context.given(waited=context.whole(0, MAX_ITEMS, "the event its cell waits on (1)"),
               num_kernels=context.whole(1, MAX_ITEMS, "the kernels its cell launched (3)"),
               agree=_one_of_the_kernels)
def check_done_after_wait(answer, waited: int = 1, num_kernels: int = 3) -> Verdict:
    """Kernels 0..n-1 were launched on one stream, each followed by an event; the host
    waits on event ``waited``.  Which kernels are certainly finished when it returns?"""
    if answer is None:
        return unanswered("set `finished` to the set of kernel numbers, e.g. {0, 2}")
    if isinstance(answer, (str, bytes)):
        return fails("shape", f"write a set of kernel numbers such as {{0, 2}}, not the string {show(answer)}")
    if bare_number(answer):
        return fails("shape", f"write the set of kernel numbers that are finished, such as {{0, 2}}: one number, "
                              f"{show(answer)}, does not say whether you mean kernel {show(answer)} or how many")
    got = int_set(answer)
    if got is None:
        return fails("shape", f"write a set of whole kernel numbers such as {{0, 2}}, not {show(answer)}")
    want = set(range(waited + 1))
    unknown = sorted(got - set(range(num_kernels)))
    if unknown:
        return fails("no_such_kernel",
                     f"there is no kernel {unknown[0]}: the kernels are numbered 0 to {num_kernels - 1}")
    later = sorted(got - want)
    if later:
        return fails("includes_later_kernel",
                     f"kernel {later[0]} was launched after event {waited} was recorded: that event "
                     f"says nothing about it, it may still be queued or running")
    if want - got:
        return fails("misses_earlier_kernel",
                     f"a kernel is missing: event {waited} covers more than the kernel just before it. A stream "
                     f"runs its work in order, so which kernels must have finished before the event was reached?")
    return passes(f"kernels {sorted(want)}: an event covers everything queued before it on the stream, "
                  f"and nothing after it")


def _write_answer(ctx, value):
    """The kernel of the race questions: writes ``value`` into the output buffer out0."""
    ctx.store("out0", torch.tensor([value], device=ctx.device))


def _parse_order(order, variable: str) -> list[str] | Verdict:
    """The learner's order as a list of step names, or the Verdict on why it is not one."""
    if order is None:
        return unanswered(f"set `{variable}` to a list of steps")
    if isinstance(order, str) or not isinstance(order, (list, tuple)):
        return fails("shape", f"write the order as a list of steps, e.g. [\"launch\", \"read\"], not {show(order)}")
    if length(order) > 4 * len(_STEPS):
        return fails("shape",
                     f"that order has {length(order)} steps: the question needs four or five")
    steps = [name(s) if isinstance(s, str) else s for s in sequence(order)]
    bad = [s for s in steps if s not in _STEPS]
    if bad:
        return fails("shape", f"{show(bad[0])} is not a step: use only {', '.join(repr(s) for s in _STEPS)}")
    if steps.count("launch") != 1:
        return fails("launch_count",
                     f"launch the kernel exactly once (your order launches it {steps.count('launch')} times)")
    if "read" not in steps:
        return fails("no_read", "the host never reads out0: add a \"read\" step")
    first_wait, first_record = (steps.index(s) if s in steps else None for s in ("wait", "record"))
    if first_wait is not None and (first_record is None or first_record > first_wait):
        return fails("wait_without_event", "\"wait\" waits on an event, so \"record\" one before it")
    return steps


def _run_order(steps: list[str], device) -> tuple[str | None, int | None, int]:
    """Run the steps on the real device with its race checker.  Returns
    (the race report or None, the value of the last read, the value the kernel writes)."""
    value, events, read = next(_ANSWER_IDS), [], None
    try:
        for step in steps:
            if step == "launch":
                device.launch(_write_answer, value, round=0, stage="answer", writes={"out0"})
            elif step == "record":
                events.append(device.record_event())
            elif step == "wait":
                device.wait(events[-1])
            else:
                read = int(device.host("out0", "r")[0])
        return None, read, value
    except RaceError as err:
        return str(err), read, value
    finally:
        device.synchronize()  # leave the stream empty and the checker quiet for the next cell
        device.spans()        # and drop this check's timing records


def _why_racy(steps: list[str]) -> str:
    """In the lesson's words, why the first read after the launch is not ordered after it."""
    launched = covered = False
    waited_on_old = False
    event_after_launch = []  # per recorded event: was it recorded after the launch?
    for step in steps:
        if step == "launch":
            launched = True
        elif step == "record":
            event_after_launch.append(launched)
        elif step == "wait" and launched:
            if event_after_launch[-1]:
                covered = True
            else:
                waited_on_old = True
        elif step == "read" and launched and not covered:
            break
    recorded_after = "record" in steps[steps.index("launch"):]
    if waited_on_old:
        return "the event you waited on was recorded before the launch, so it says nothing about the kernel"
    if recorded_after and "wait" in steps[steps.index("launch"):]:
        return "a read comes before the wait"
    if recorded_after:
        return "you recorded an event after the launch but did not wait on it before reading"
    return "no event is recorded after the launch, and nothing waits for the kernel"


def _race_check_off(device) -> Verdict | None:
    if not all(hasattr(device, attr) for attr in ("launch", "record_event", "wait", "host")):
        return fails("setup", f"pass the engine's device (engine.device), not {type(device).__name__}")
    if not getattr(getattr(device, "races", None), "enabled", False):
        return fails("setup", "this device runs without the race checker (race_check=False): start the "
                              "engine with the default race_check=True to answer this question")
    return None


def _try_order(order, device, variable: str) -> Verdict | tuple[list[str], str | None, int | None, int]:
    """The learner's order run on the device: (steps, race report, last read, kernel's value),
    or the Verdict that stops it first (unanswered, malformed, not a race-checked device)."""
    steps = _parse_order(order, variable)
    if isinstance(steps, Verdict):
        return steps
    off = _race_check_off(device)
    if off is not None:
        return off
    try:
        return (steps, *_run_order(steps, device))
    except DeviceError as err:  # e.g. the device of an engine a cell above closed
        return fails("setup", f"this device cannot run your steps ({err}): run the cell that "
                              f"starts the engine again, then this cell")


@notebook_check
def check_race(order, device) -> Verdict:
    """Your turn (00): order "launch", "record", "wait", "read" so that the read races."""
    tried = _try_order(order, device, "racy_order")
    if isinstance(tried, Verdict):
        return tried
    steps, report, read, value = tried
    if report:
        return passes(f"that read races with the kernel. The race checker: {report}")
    if steps.index("read") < steps.index("launch"):
        return fails("read_before_launch",
                     "no race: your read comes before the launch, so no kernel is writing out0 yet "
                     "(you just read an old value). Read while the launched kernel may still be running")
    return fails("no_race", "no race: every read comes after a wait on an event recorded after the launch, so "
                            "the kernel is finished by then. Move a read before that wait")


@notebook_check
def check_race_fixed(order, device) -> Verdict:
    """Your turn (00): the same four steps, ordered so that the read is safe and sees the result."""
    tried = _try_order(order, device, "safe_order")
    if isinstance(tried, Verdict):
        return tried
    steps, report, read, value = tried
    if report:
        return fails("still_races", f"still a race: {_why_racy(steps)}. The race checker: {report}")
    if read != value:
        return fails("read_before_launch",
                     "no race, but your last read comes before the launch, so it saw the old contents "
                     "of out0, not the kernel's result: read after waiting")
    return passes("launch, record an event after it, wait on that event, then read: the host saw the "
                  "kernel's value and the race checker stayed quiet")
