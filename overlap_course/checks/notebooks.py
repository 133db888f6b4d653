"""In-notebook checks: "predict, then run" questions and short "your turn" cells.

The course notebooks 00-04 ask the learner to predict or write something every few
minutes and check it at once.  Each ``check_*`` here follows the exercise checkers'
rules (``checkers.py``): it returns a ``Verdict``; a wrong answer gets a message that
names the mistake in the lesson's terms (not "assertion failed"); a learner's mistake --
a wrong value, a wrong type, an unanswered stub -- never raises, so a notebook runs top
to bottom unattended and its stored output stays the same.

The messages recognise the wrong answers learners actually give (tests/test_practice.py
holds that corpus); anything else gets the general rule and the numbers to compare.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import numbers
import reprlib
from collections import defaultdict

import torch

from overlap_course.checks.exercises import Verdict
from toy_engine.stats import ideal_ratio

__all__ = [
    "check_done_after_wait", "check_race", "check_race_fixed",
    "check_slot", "check_decode_lengths",
    "check_round_gap", "check_largest_host_stage", "check_overhead_gap",
    "check_processed_under", "check_tokens_lost", "check_swapped_order", "check_future_inputs", "check_ideal_ratio",
    "check_true_key_length", "check_corrected_slots",
    "check_uncommitted_rounds", "check_discarded", "check_race_report",
]


def _unanswered(what: str) -> Verdict:
    return Verdict(False, f"not answered yet: {what}, then run this cell again")


# ---------------------------------------------------------------- reading an answer
# One way of reading answers for every check below.  Where a number is asked, a number
# may come as a plain int or float, a numpy scalar, a 0-d or one-element tensor or array,
# or a list/tuple holding one number: `[37]`, `tensor([37])`, `torch.tensor(37)` and
# `np.int64(37)` all mean 37.  Where a list is asked (one value per request), a list is a
# list.  Junk -- a number no question here can have (10**400, 1e300), nan, inf, a list far
# longer than any answer -- gets a sentence (``_Junk``), never a traceback; and no message
# echoes more than a short excerpt of what the learner wrote.

MAX_MESSAGE = 800     # characters: a check's message never grows with the answer
_LIMIT = 1e12         # no answer in this course comes near it (slots, ms, rounds, ratios)
_MAX_ITEMS = 4096     # the longest list any check asks for has a few dozen values
_SHOW = 60            # characters of the learner's answer quoted in a message


class _Junk(Exception):
    """An answer no question here can have: its message is the check's verdict."""


def _show(x) -> str:
    """A short, safe repr of a learner's answer for a message (never raises, never long)."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool) and abs(int(x)) >= 10**30:
        bits = int(x).bit_length()
        return f"a {len(str(abs(int(x))))}-digit number" if bits < 14000 else "a number with thousands of digits"
    short = reprlib.Repr()
    short.maxstring = short.maxother = 40
    short.maxlist = short.maxtuple = short.maxset = short.maxfrozenset = short.maxdict = 6
    try:
        text = short.repr(x)
    except Exception:  # noqa: BLE001 -- a learner's object whose repr fails still gets a message
        text = f"a {type(x).__name__}"
    return text if len(text) <= _SHOW else text[:_SHOW - 4] + " ..."


def _far(x) -> _Junk:
    return _Junk(f"{_show(x)} is far outside anything this question's answer can be (every answer here is "
                 f"smaller than 10**12): write the value itself")


def _scalar(x):
    """A 0-d or one-element tensor or numpy array, or a numpy scalar, as a Python number;
    anything else unchanged."""
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    if type(x).__module__ == "numpy" and getattr(x, "size", None) == 1 and hasattr(x, "item"):
        return x.item()
    return x


def _one(x):
    """One number however it is wrapped: [x], (x,), tensor(x), tensor([x]), np.array([x])."""
    for _ in range(4):
        x = _scalar(x)
        if isinstance(x, (list, tuple)) and len(x) == 1:
            x = x[0]
        else:
            break
    return x


def _number(x, whole: bool = False) -> int | float | None:
    """The answer as one number (an int if ``whole``), or None if it is not one.  Raises
    ``_Junk`` for nan, inf and numbers no question here can have."""
    x = _one(x)
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    if isinstance(x, numbers.Integral):
        if abs(int(x)) > _LIMIT:
            raise _far(x)
        return int(x)
    try:
        value = float(x)
    except (OverflowError, ValueError):
        raise _far(x) from None
    if not math.isfinite(value):
        raise _Junk(f"write a finite number, not {_show(x)}")
    if abs(value) > _LIMIT:
        raise _far(x)
    return None if whole else value


def _whole(x) -> int | None:
    return _number(x, whole=True)


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _as_list(x):
    """A 1-d torch tensor or numpy array as a plain list (``np.full(3, -1)`` is a natural
    answer); anything else unchanged, and an array of any other shape as None."""
    if isinstance(x, torch.Tensor) or type(x).__module__ == "numpy" and hasattr(x, "ndim"):
        if x.ndim != 1:
            return None
        if len(x) > _MAX_ITEMS:
            raise _Junk(f"that is {len(x)} values: this question's answer has a few")
        return x.tolist()
    return x


def _int_list(x) -> list[int] | None:
    """``x`` as a list of ints (a list, tuple or 1-d tensor/numpy array of integers), else None."""
    x = _as_list(x)
    if not isinstance(x, (list, tuple)):
        return None
    if len(x) > _MAX_ITEMS:
        raise _Junk(f"that is a list of {len(x)} values: this question's answer has a few")
    values = []
    for v in x:
        v = _scalar(v)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            return None
        if abs(int(v)) > _LIMIT:
            raise _far(v)
        values.append(int(v))
    return values


def _int_set(x) -> set[int] | None:
    """``x`` as a set of ints (one number however wrapped, or a set/list/tuple/range/1-d
    tensor of them), else None."""
    if isinstance(x, (str, bytes)):
        return None
    one = _whole(x) if not isinstance(x, (set, frozenset, range)) else None
    if one is not None:
        return {one}
    if isinstance(x, range):
        if max(abs(x.start), abs(x.stop)) > _LIMIT:
            raise _far(x.stop if abs(x.stop) > _LIMIT else x.start)
        x = list(x)
    if isinstance(x, (set, frozenset)):
        if len(x) > _MAX_ITEMS:
            raise _Junk(f"that is a set of {len(x)} values: this question's answer has a few")
        x = list(x)
    values = _int_list(x)
    return None if values is None else set(values)


def _bounded(check):
    """Every check answers with a Verdict: junk gets its sentence, and no message is long."""
    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        try:
            verdict = check(*args, **kwargs)
        except _Junk as junk:
            verdict = Verdict(False, str(junk))
        if len(verdict.message) > MAX_MESSAGE:
            verdict = dataclasses.replace(verdict, message=verdict.message[:MAX_MESSAGE - 4] + " ...")
        return verdict
    return wrapper


# ================================================================ 00: stream, launch, event

@_bounded
def check_done_after_wait(answer, waited: int = 1, num_kernels: int = 3) -> Verdict:
    """Kernels 0..n-1 were launched on one stream, each followed by an event; the host
    waits on event ``waited``.  Which kernels are certainly finished when it returns?"""
    if answer is None:
        return _unanswered("set `finished` to the set of kernel numbers, e.g. {0, 2}")
    if isinstance(answer, (str, bytes)):
        return Verdict(False, f"write a set of kernel numbers such as {{0, 2}}, not the string {_show(answer)}")
    got = _int_set(answer)
    if got is None:
        return Verdict(False, f"write a set of whole kernel numbers such as {{0, 2}}, not {_show(answer)}")
    want = set(range(waited + 1))
    unknown = sorted(got - set(range(num_kernels)))
    if unknown:
        return Verdict(False, f"there is no kernel {unknown[0]}: the kernels are numbered 0 to {num_kernels - 1}")
    later = sorted(got - want)
    if later:
        return Verdict(False, f"kernel {later[0]} was launched after event {waited} was recorded: that event "
                              f"says nothing about it, it may still be queued or running")
    earlier = sorted(want - got)
    if earlier:
        return Verdict(False, f"kernel {earlier[0]} is finished too: it was queued before event {waited}, "
                              f"and a stream runs its work in order, so the event covers everything before it")
    return Verdict(True, f"kernels {sorted(want)}: an event covers everything queued before it on the stream, "
                         f"and nothing after it")


_STEPS = ("launch", "record", "wait", "read")
_ANSWER_IDS = itertools.count(1000)


def _write_answer(ctx, value):
    """The kernel of the race questions: writes ``value`` into the output buffer out0."""
    ctx.store("out0", torch.tensor([value], device=ctx.device))


def _parse_order(order) -> tuple[list[str] | None, str | None]:
    if order is None:
        return None, None
    if isinstance(order, str) or not isinstance(order, (list, tuple)):
        return None, f"write the order as a list of steps, e.g. [\"launch\", \"read\"], not {_show(order)}"
    if len(order) > 4 * len(_STEPS):
        return None, f"that order has {len(order)} steps: the question needs four or five"
    steps = [s.strip().lower() if isinstance(s, str) else s for s in order]
    bad = [s for s in steps if s not in _STEPS]
    if bad:
        return None, f"{_show(bad[0])} is not a step: use only {', '.join(repr(s) for s in _STEPS)}"
    if steps.count("launch") != 1:
        return None, f"launch the kernel exactly once (your order launches it {steps.count('launch')} times)"
    if "read" not in steps:
        return None, "the host never reads out0: add a \"read\" step"
    first_wait, first_record = (steps.index(s) if s in steps else None for s in ("wait", "record"))
    if first_wait is not None and (first_record is None or first_record > first_wait):
        return None, "\"wait\" waits on an event, so \"record\" one before it"
    return steps, None


def _run_order(steps: list[str], device) -> tuple[str | None, int | None, int]:
    """Run the steps on the real device with its race checker.  Returns
    (the race report or None, the value of the last read, the value the kernel writes)."""
    from toy_engine.races import RaceError

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
    if not all(hasattr(device, name) for name in ("launch", "record_event", "wait", "host")):
        return Verdict(False, f"pass the engine's device (engine.device), not {type(device).__name__}")
    if not getattr(getattr(device, "races", None), "enabled", False):
        return Verdict(False, "this device runs without the race checker (race_check=False): start the "
                              "engine with the default race_check=True to answer this question")
    return None


def _try_order(order, device, name: str) -> Verdict | tuple[list[str], str | None, int | None, int]:
    """The learner's order run on the device: (steps, race report, last read, kernel's value),
    or the Verdict that stops it first (unanswered, malformed, not a race-checked device)."""
    steps, problem = _parse_order(order)
    if steps is None:
        return Verdict(False, problem) if problem else _unanswered(f"set `{name}` to a list of steps")
    off = _race_check_off(device)
    if off is not None:
        return off
    return (steps, *_run_order(steps, device))


@_bounded
def check_race(order, device) -> Verdict:
    """Your turn (00): order "launch", "record", "wait", "read" so that the read races."""
    tried = _try_order(order, device, "racy_order")
    if isinstance(tried, Verdict):
        return tried
    steps, report, read, value = tried
    if report:
        return Verdict(True, f"that read races with the kernel. The race checker: {report}")
    if steps.index("read") < steps.index("launch"):
        return Verdict(False, "no race: your read comes before the launch, so no kernel is writing out0 yet "
                              "(you just read an old value). Read while the launched kernel may still be running")
    return Verdict(False, "no race: every read comes after a wait on an event recorded after the launch, so "
                          "the kernel is finished by then. Move a read before that wait")


@_bounded
def check_race_fixed(order, device) -> Verdict:
    """Your turn (00): the same four steps, ordered so that the read is safe and sees the result."""
    tried = _try_order(order, device, "safe_order")
    if isinstance(tried, Verdict):
        return tried
    steps, report, read, value = tried
    if report:
        return Verdict(False, f"still a race: {_why_racy(steps)}. The race checker: {report}")
    if read != value:
        return Verdict(False, "no race, but your last read comes before the launch, so it saw the old contents "
                              "of out0, not the kernel's result: read after waiting")
    return Verdict(True, "launch, record an event after it, wait on that event, then read: the host saw the "
                         "kernel's value and the race checker stayed quiet")


# ================================================================ 01: packed batch, paged KV cache

@_bounded
def check_slot(answer, table, pos: int, block_size: int) -> Verdict:
    """Your turn (01): the KV-cache slot of position ``pos`` of a request with block table ``table``."""
    if answer is None:
        return _unanswered("set `slot` to a number")
    number = _whole(answer)
    if number is None:
        return Verdict(False, f"a slot is one whole number, not {_show(answer)}")
    answer = number
    table = [int(b) for b in table]
    index, offset = divmod(pos, block_size)
    want = table[index] * block_size + offset
    if answer == want:
        return Verdict(True, f"position {pos} is in the request's block index {index} (= {pos} // {block_size}), "
                             f"which is block {table[index]}, at offset {offset}: slot {table[index]} x "
                             f"{block_size} + {offset} = {want}")
    mistakes = {
        pos: "that is the position itself, as if the request owned blocks 0, 1, 2, ... in order: go through the "
             "blocks it really owns, its block table",
        table[index]: "that is the block's number, not the slot: multiply it by the block size and add the offset",
        table[index] * block_size: f"that is the block's first slot: add the offset {pos} % {block_size}",
        table[index] + offset: "you added the offset to the block number: multiply the block number by the block "
                               "size first",
    }
    if offset < len(table):
        mistakes.setdefault(table[offset] * block_size + index,
                            "you swapped // and %: the block index is pos // block_size, the offset pos % block_size")
    for wrong_index in (index - 1, index + 1):
        if 0 <= wrong_index < len(table):
            mistakes.setdefault(table[wrong_index] * block_size + offset,
                                f"right offset, wrong block: position {pos} is in block index {pos} // "
                                f"{block_size} = {index} of the table")
    if answer in mistakes:
        return Verdict(False, f"slot {answer}: {mistakes[answer]}")
    return Verdict(False, f"slot {answer} is not it: slot = table[pos // block_size] * block_size + "
                          f"pos % block_size, with table {table}, pos {pos}, block_size {block_size}")


@_bounded
def check_decode_lengths(seqlens_q, seqlens_k, prompt_lengths) -> Verdict:
    """Predict (01): seqlens_q and seqlens_k of the first decode round after a prefill of
    prompts with ``prompt_lengths`` tokens."""
    if seqlens_q is None or seqlens_k is None:
        return _unanswered("set both `seqlens_q` and `seqlens_k` to lists, one number per request")
    q, k = _int_list(seqlens_q), _int_list(seqlens_k)
    if q is None or k is None:
        return Verdict(False, "write each as a list of whole numbers, one per request, e.g. [1, 2, 3]")
    n = len(prompt_lengths)
    prompts = [int(p) for p in prompt_lengths]
    if len(q) != n or len(k) != n:
        return Verdict(False, f"one number per request: there are {n} requests (you gave {len(q)} and {len(k)})")
    want_q, want_k = [1] * n, [p + 1 for p in prompts]
    if q != want_q:
        if q == prompts:
            return Verdict(False, "seqlens_q: those are the prefill's query lengths. In a decode round each "
                                  "request feeds only its newest token")
        return Verdict(False, f"seqlens_q is {q}: in a decode round every request feeds exactly one token, "
                              f"its newest, so its query length is 1")
    if k != want_k:
        if k == prompts:
            return Verdict(False, "seqlens_k: the key length counts this round's token too (the past from the "
                                  "cache plus the new token)")
        if k == want_q:
            return Verdict(False, "seqlens_k: the new token attends to the request's whole past, read from the "
                                  "KV cache, not only to itself")
        if k == [p + 2 for p in prompts]:
            return Verdict(False, "seqlens_k: one too many. The prefill fed the prompt and produced one token; "
                                  "this round feeds that token: prompt + 1 tokens in all")
        return Verdict(False, f"seqlens_k is {k}: it is the cached past plus this round's token, "
                              f"prompt length + 1 for each request")
    return Verdict(True, f"seqlens_q {want_q}, seqlens_k {want_k}: one new token per request, attending to its "
                         f"prompt in the cache plus itself")


# ================================================================ 02: the serial engine

def _round_extent(timeline) -> tuple[dict, dict]:
    first_start, last_end = {}, {}
    for span in timeline.lane("device"):
        first_start[span.round] = min(first_start.get(span.round, span.start_ms), span.start_ms)
        last_end[span.round] = max(last_end.get(span.round, span.end_ms), span.end_ms)
    return first_start, last_end


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-3, 1e-3 * abs(b))


def _decimals(x: float) -> int:
    """How many decimals a number was written with (1.37 -> 2; a float32's noise ignored)."""
    text = repr(round(float(x), 6))
    return len(text.split(".")[1].rstrip("0")) if "." in text and "e" not in text else 0


@_bounded
def check_round_gap(gap_ms, timeline, round: int) -> Verdict:
    """Your turn (02): the device gap (ms) between the end of round ``round - 1``'s last
    device span and the start of round ``round``'s first one."""
    if gap_ms is None:
        return _unanswered("set `gap_ms` to the gap in milliseconds")
    number = _number(gap_ms)
    if number is None:
        return Verdict(False, f"write the gap as a number of milliseconds, not {_show(gap_ms)}")
    gap_ms = number
    first_start, last_end = _round_extent(timeline)
    if round not in first_start or round - 1 not in last_end:
        return Verdict(False, f"this timeline has no rounds {round - 1} and {round} on its device lane")
    want = first_start[round] - last_end[round - 1]
    if _close(gap_ms, want):
        return Verdict(True, f"{want:.3f} ms between the end of round {round - 1}'s sample and the start of round "
                             f"{round}'s upload: the device had nothing queued")
    dev = {(s.stage, s.round): s for s in timeline.lane("device")}
    host = {(s.stage, s.round): s for s in timeline.lane("host")}
    mistakes = [
        (-want, "the sign is flipped: subtract the end of the earlier round from the start of the later one"),
        (want / 1e3, "that is in seconds: the timeline's times are already in milliseconds"),
    ]
    if round + 1 in first_start:
        mistakes.append((first_start[round + 1] - last_end[round],
                         f"that is the gap after round {round}; the question asks for the gap before it, after "
                         f"round {round - 1}"))
    if round - 2 in last_end:
        mistakes.append((first_start[round - 1] - last_end[round - 2],
                         f"that is the gap before round {round - 1}; the question asks for the gap before round "
                         f"{round}"))
    if round - 1 in first_start:
        mistakes.append((first_start[round] - first_start[round - 1],
                         f"that is from the start of round {round - 1} to the start of round {round}: it includes "
                         f"round {round - 1}'s device work; start from the end of its last span"))
    if ("upload", round) in dev and ("forward", round) in dev:
        mistakes.append((dev[("forward", round)].start_ms - dev[("upload", round)].end_ms,
                         f"that is the small gap inside round {round}, between its upload and its forward"))
    if ("sample", round - 1) in dev and ("forward", round) in dev:
        mistakes.append((dev[("forward", round)].start_ms - dev[("sample", round - 1)].end_ms,
                         f"you measured up to round {round}'s forward, but its upload is already device work"))
    if ("wait", round - 1) in host:
        mistakes.append((first_start[round] - host[("wait", round - 1)].end_ms,
                         f"you started at the end of the host's wait; the gap starts on the device lane, when "
                         f"round {round - 1}'s sample ends"))
    if ("sample", round - 1) in dev:
        mistakes.append((first_start[round] - dev[("sample", round - 1)].start_ms,
                         f"you started at the start of round {round - 1}'s sample; the device was busy until "
                         f"its end"))
    for value, why in mistakes:
        if _close(gap_ms, value):
            return Verdict(False, f"{gap_ms:.3f} ms: {why}")
    digits = _decimals(gap_ms)
    if 2 <= digits <= 3 and abs(gap_ms - want) <= 10 ** -digits + 1e-9:
        return Verdict(False, f"close: {gap_ms:.{digits}f} ms is the gap rounded to {digits} decimal"
                              f"{'s' * (digits != 1)}, but the check compares to a thousandth of a millisecond. Read "
                              f"it to more digits: the hover shows start and end to three decimals, or subtract the "
                              f"two spans' times in code (timeline.lane(\"device\"))")
    return Verdict(False, f"{gap_ms:.3f} ms is not the gap: take the start of round {round}'s first device span "
                          f"minus the end of round {round - 1}'s last device span (timeline.lane(\"device\"))")


HOST_WORK_STAGES = ("schedule", "prepare", "launch_forward", "launch_sample", "postprocess")
_DEVICE_STAGE_NAMES = ("upload", "correct", "forward", "sample")


def _per_round(timeline, cpu: bool) -> dict[str, float]:
    total, rounds = defaultdict(float), defaultdict(set)
    for span in timeline.lane("host"):
        if span.stage in HOST_WORK_STAGES:
            total[span.stage] += span.cpu_ms if cpu and span.cpu_ms is not None else span.duration_ms
            rounds[span.stage].add(span.round)
    return {stage: total[stage] / len(rounds[stage]) for stage in HOST_WORK_STAGES if rounds[stage]}


def host_ms_per_round(timeline) -> dict[str, float]:
    """Mean host wall-clock ms per round for each stage that is host work (waiting is not
    work).  Wall time includes any moment the host thread was ready but had no core."""
    return _per_round(timeline, cpu=False)


def host_cpu_ms_per_round(timeline) -> dict[str, float]:
    """Mean host CPU ms per round for each host-work stage: the CPU time the host thread
    itself used in the stage (``span.cpu_ms``), which a busy machine cannot inflate.  A span
    recorded without CPU time (the engine times ``schedule`` by the clock only) counts its
    wall time, an upper bound of its CPU time."""
    return _per_round(timeline, cpu=True)


def _table(per_round: dict[str, float]) -> str:
    return ", ".join(f"{s} {ms:.3f} ms" for s, ms in sorted(per_round.items(), key=lambda kv: -kv[1]))


@_bounded
def check_largest_host_stage(answer, timeline) -> Verdict:
    """Predict (02): which host stage uses the most host CPU time per round (waiting
    excluded)?  CPU time, not wall time: on a busy machine the host thread can lose its core
    inside any stage, and that lost time lands in whichever stage it hit."""
    if answer is None:
        return _unanswered(f"set `largest` to one of {', '.join(repr(s) for s in HOST_WORK_STAGES)}")
    if not isinstance(answer, str):
        return Verdict(False, f"write the stage's name as a string, e.g. \"schedule\", not {_show(answer)}")
    answer = answer.strip()
    cpu, wall = host_cpu_ms_per_round(timeline), host_ms_per_round(timeline)
    if not cpu:
        return Verdict(False, "this timeline has no host spans: run the engine first")
    largest, wall_largest = max(cpu, key=cpu.get), max(wall, key=wall.get)
    measured = f"Host CPU time per round: {_table(cpu)}"
    if wall_largest != largest:
        lost = wall[wall_largest] - cpu[wall_largest]
        measured += (f". (By wall-clock time {wall_largest} took the longest, {wall[wall_largest]:.3f} ms per round, "
                     f"but only {cpu[wall_largest]:.3f} ms of it was CPU work: for about {lost:.3f} ms the host "
                     f"thread was waiting for a core, because the machine was busy)")
    if answer == "wait":
        return Verdict(False, f"waiting is the host doing nothing: the question is about host work. {measured}")
    if answer in _DEVICE_STAGE_NAMES:
        return Verdict(False, f"{_show(answer)} is a device stage; the host stages are {', '.join(HOST_WORK_STAGES)}")
    if answer not in cpu:
        return Verdict(False, f"{_show(answer)} is not a host stage of this run; choose from {', '.join(cpu)}")
    if answer == largest:
        return Verdict(True, f"{largest} does the most host work per round here. {measured}")
    why = "a launch only queues work and returns; " if answer.startswith("launch") else ""
    return Verdict(False, f"{why}on this run {largest!r} used the most CPU. {measured}")


@_bounded
def check_overhead_gap(answer_ms, overhead_ms: float = 5.0) -> Verdict:
    """Predict (02): in the serial loop, how many ms longer does each round-boundary gap
    get when ``host_overhead_ms`` adds ``overhead_ms`` of host work per round?"""
    if answer_ms is None:
        return _unanswered("set `longer_by_ms` to a number of milliseconds")
    number = _number(answer_ms)
    if number is None:
        return Verdict(False, f"write a number of milliseconds, not {_show(answer_ms)}")
    answer_ms = number
    if abs(answer_ms - overhead_ms) <= 0.1 * overhead_ms:
        return Verdict(True, f"about {overhead_ms:g} ms: in the serial loop the device has nothing queued while "
                             f"the host works, so every millisecond of host work is a millisecond of device idle")
    if abs(answer_ms) <= 0.1 * overhead_ms:
        return Verdict(False, "the device cannot hide it: in the serial loop the next round is launched only "
                              "after the host finishes its work, so the gap grows by all of it")
    if answer_ms < 0:
        return Verdict(False, "more host work cannot shorten the gap: the device waits for the host")
    if answer_ms < overhead_ms:
        return Verdict(False, "none of the extra host work overlaps the device in the serial loop: the gap grows "
                              "by all of it, not a part")
    return Verdict(False, "the overhead is added once per round, in `schedule`, so each gap grows by that amount, "
                          "not more")


# ================================================================ 03a/03b: the ZOS order, the future-token map, the ideal

def _round_number(x) -> int | None:
    """``x`` as a whole number (int, numpy integer, one-element tensor or list), else None."""
    return _whole(x)


def rounds_processed_in_pass(timeline, round: int) -> list[int]:
    """Rounds whose results the host waits on or processes between launching round
    ``round``'s forward and its sample (in ZOS: the deferred previous decode step)."""
    rounds, inside = [], False
    for span in timeline.lane("host"):
        if span.stage == "launch_forward" and span.round == round:
            inside = True
        elif inside and span.stage == "launch_sample":
            break
        elif inside and span.stage in ("wait", "postprocess", "flush") and span.round not in rounds:
            rounds.append(span.round)
    return rounds


@_bounded
def check_processed_under(answer, timeline, round: int) -> Verdict:
    """Predict (03a): in the ZOS pass that launches round ``round``'s forward, whose
    results does the host wait on and postprocess before it launches that round's sample?"""
    if answer is None:
        return _unanswered("set `processed` to a round number")
    if isinstance(answer, str):
        text = answer.strip()
        inner = text[len("StepState(round="):-1] if text.startswith("StepState(round=") and text.endswith(")") else ""
        if not inner.isdigit() or len(inner) > 12:
            return Verdict(False, f"write the round as a number (or as its owner, \"StepState(round=N)\"), "
                                  f"not {_show(answer)}")
        answer = int(inner)
    got = _round_number(answer)
    if got is None:
        return Verdict(False, f"write the round as one whole number, not {_show(answer)}")
    processed = rounds_processed_in_pass(timeline, round)
    launched = sorted({s.round for s in timeline.lane("host") if s.stage == "launch_forward"})
    if round not in launched:  # e.g. the run above was interrupted, or the engine ran something else since
        return Verdict(False, f"the run this check reads has no round {round} (its rounds: "
                              f"{f'0 to {launched[-1]}' if launched else 'none'}): run the cell above to the end, "
                              f"then this one")
    if not processed:
        return Verdict(False, f"in this run the host processed nothing between round {round}'s forward and sample "
                              f"launches (was round {round - 1} a prefill, or is this not a ZOS run?): ask about a "
                              f"later decode round")
    want = processed[0]
    if got == want:
        return Verdict(True, f"round {want}: its StepState waited in `previous`, and the host waits on its event and "
                             f"commits its tokens while round {round}'s forward is queued or running on the device")
    if got == round:
        return Verdict(False, f"round {round}'s own sample is not launched yet at that point (it comes after the "
                              f"postprocess): its results are processed in the next pass. Processing a round in its "
                              f"own pass is the serial order")
    if got > round:
        return Verdict(False, f"round {got} is not even launched yet: the host can only process a round whose "
                              f"sample is already queued on the device")
    if got < want:
        return Verdict(False, f"round {got} was processed in an earlier pass: ZOS defers a decode step by one round "
                              f"only, so `previous` holds round {want}")
    return Verdict(False, f"round {got} is not it: the host processes the step kept in `previous`, the round "
                          f"launched one pass earlier")


@_bounded
def check_tokens_lost(answer, reference, without_flush) -> Verdict:
    """Predict (03a): how many tokens does each request lose when the flush drops the
    deferred step?  ``reference`` and ``without_flush`` are the two runs' completions."""
    if answer is None:
        return _unanswered("set `lost` to a number of tokens per request")
    try:
        want = [len(r.token_ids) - len(g.token_ids) for r, g in zip(reference, without_flush)]
    except (TypeError, AttributeError):
        return Verdict(False, "pass the completions of the normal run and of the run without the flush")
    if not want:
        return Verdict(False, "run the two generate() calls above first: there are no completions to compare")
    number = _whole(answer)
    got = [number] * len(want) if number is not None else _int_list(answer)
    if got is None:
        return Verdict(False, f"write the number of tokens lost per request as a whole number (or a list, one "
                              f"per request), not {_show(answer)}")
    if len(got) != len(want):
        return Verdict(False, f"the run has {len(want)} requests: give one number, or a list of {len(want)}")
    if got == want:
        counts = f"{want[0]} token{'s' * (want[0] != 1)}" if len(set(want)) == 1 else f"{want} tokens"
        return Verdict(True, f"{counts} per request: the final decode step was sampled on the device into an "
                             f"output slot, but nobody waited on its event and committed it")
    total = [len(r.token_ids) for r in reference]
    if all(g == 0 for g in got):
        return Verdict(False, "the last decode step is still held in `previous` when the scheduler has nothing "
                              "left to launch; without the flush nobody commits it, so its token is lost")
    if got == total:
        return Verdict(False, "only the last decode step has no next round to be processed under: every earlier "
                              "one was processed in the following pass, so its tokens reached the requests")
    if any(g < 0 for g in got):
        return Verdict(False, "a request cannot gain tokens by losing the flush")
    if got == [len(g.token_ids) for g in without_flush]:
        return Verdict(False, "that is how many tokens the requests kept; the question asks how many they lost")
    if all(g > w for g, w in zip(got, want)):
        return Verdict(False, f"ZOS defers one decode step at a time (`previous` holds one StepState), and each "
                              f"decode step adds one token per request: each lost {want}")
    return Verdict(False, f"{got} is not it: compare the two runs above, token counts {total} with the flush and "
                          f"{[len(g.token_ids) for g in without_flush]} without")


def _bool_pair(x) -> tuple[bool, bool] | None:
    # A set has no order ({False, True} iterates the same whatever was meant), so it cannot
    # say which of the two questions got which answer.
    if isinstance(x, (dict, set, frozenset, str, bytes)):
        return None
    try:
        items = list(x)
    except TypeError:
        return None
    if len(items) != 2:
        return None
    out = []
    for item in items:
        if isinstance(item, torch.Tensor) and item.numel() == 1 and item.dtype == torch.bool:
            item = item.item()
        if type(item).__name__ in ("bool", "bool_"):
            out.append(bool(item))
        else:
            return None
    return out[0], out[1]


@_bounded
def check_swapped_order(answer, plain_same: bool, constraint_same: bool) -> Verdict:
    """Predict (03a): does launching round N+1's sample before round N's postprocess keep
    the serial tokens, (without a constraint, with the title-case constraint)?  The two
    truths are the measured comparisons of the demo run."""
    if answer is None:
        return _unanswered("set `same_tokens` to a pair of booleans: (without a constraint, with title_case)")
    got = _bool_pair(answer)
    if isinstance(answer, (set, frozenset)):
        return Verdict(False, f"a set has no order, so {_show(answer)} cannot say which answer is which: write a pair of "
                              f"True/False values as a tuple, (without a constraint, with title_case)")
    if got is None:
        return Verdict(False, f"write a pair of True/False values, (without a constraint, with title_case), "
                              f"not {_show(answer)}")
    want = (bool(plain_same), bool(constraint_same))
    if got == want:
        return Verdict(True, f"{want}: without a constraint the sample reads only the logits on the device, so when "
                             f"the host processes round N cannot change it; with title_case the mask is built from "
                             f"the committed text, which lacks round N's token when the sample is launched first")
    if got[0] != want[0]:
        if want[0]:
            return Verdict(False, "without a constraint the sample reads only what is on the device (the logits); "
                                  "when the host processes round N does not change what the device samples")
        return Verdict(False, f"this run measured {want}: without a constraint the swapped order did change the "
                              f"tokens; look at the demo's output")
    if want[1]:
        return Verdict(False, f"this run measured {want}: the constrained text happened to match; look at the "
                              f"demo's output")
    return Verdict(False, "with title_case, launch_sample builds the mask from the tokens committed so far; "
                          "swapped, round N is not committed yet, so the mask is one token late and the capital "
                          "comes one character late")


def _id_list(x) -> list[int] | None:
    x = _as_list(x)
    if isinstance(x, (list, tuple)) and x and all(type(v).__name__ in ("bool", "bool_") for v in x):
        return [int(bool(v)) for v in x]
    return _int_list(x)


@_bounded
def check_future_inputs(input_ids, pending, meta, serial_meta=None) -> Verdict:
    """Predict (03b): ``input_ids`` and ``pending`` of a decode round the ZOS host prepared
    while the previous round was in flight (``meta``: the captured metadata of that round;
    ``serial_meta``: the same round of the serial run, to recognise its real ids)."""
    from toy_engine.kernels import FROM_DEVICE

    if input_ids is None or pending is None:
        return _unanswered("set `input_ids` and `pending` to lists, one value per request "
                           "(write FROM_DEVICE as -1)")
    ids, flags = _int_list(input_ids), _id_list(pending)
    if ids is None or flags is None:
        return Verdict(False, "write `input_ids` and `pending` as lists of whole numbers, one per request "
                              "(FROM_DEVICE is -1; pending is 0 or 1)")
    want_ids, want_pending = [int(v) for v in meta["input_ids"]], [int(v) for v in meta["pending"]]
    n = len(want_ids)
    if len(ids) != n or len(flags) != n:
        return Verdict(False, f"this decode round has {n} requests feeding one token each: give {n} input ids and "
                              f"{n} pending flags, not {len(ids)} and {len(flags)}")
    if ids == want_ids and flags == want_pending:
        return Verdict(True, f"input_ids {want_ids}, pending {want_pending}: the previous round is still in flight, "
                             f"so the host writes the placeholder FROM_DEVICE ({FROM_DEVICE}) and marks the request "
                             f"pending; the forward reads the real token from last_tokens on the device")
    if ids != want_ids:
        if serial_meta is not None and ids == [int(v) for v in serial_meta["input_ids"]]:
            return Verdict(False, f"{ids} are the serial run's ids: there the previous round was processed first. "
                                  f"In ZOS those tokens are still on the device (or not sampled yet) when this round "
                                  f"is prepared")
        known = [i for i, (g, w) in enumerate(zip(ids, want_ids)) if w == FROM_DEVICE and g != FROM_DEVICE]
        if known:
            return Verdict(False, f"request {known[0]}: the host cannot know that token, it is sampled by the round "
                                  f"still in flight; it writes FROM_DEVICE ({FROM_DEVICE})")
        return Verdict(False, f"request {[g == w for g, w in zip(ids, want_ids)].index(False)}: its previous round "
                              f"was already processed, so the host writes the real token id")
    if all(f == 0 for f in flags) and any(want_pending):
        return Verdict(False, "pending = 1 marks a request whose previous round is still in flight: the device must "
                              "take its newest token (and, with drafts, its lengths) from its own state")
    if flags == [1 - f for f in want_pending]:
        return Verdict(False, "the flags are inverted: pending = 1 where the previous round is still in flight, "
                              "0 where it was processed")
    return Verdict(False, f"pending {flags} is not it: a request is pending (1) exactly where its input id is "
                          f"FROM_DEVICE")


@_bounded
def check_ideal_ratio(answer, serial_stats, zos_stats=None) -> Verdict:
    """Your turn (03b): the ideal ZOS speed-up from the serial run's own per-round host and
    device times.  Compared with the learner's run's stats, to two decimals."""
    if answer is None:
        return _unanswered("set `ideal` to a number, e.g. 1.25")
    number = _number(answer)
    if number is None:
        return Verdict(False, f"write the ratio as a number, not {_show(answer)}")
    answer = number
    host, dev = serial_stats["mean_host_ms_per_round"], serial_stats["mean_device_ms_per_round"]
    want = ideal_ratio(serial_stats)

    def close(value):
        return abs(answer - value) <= max(0.006, 0.005 * abs(value))

    if close(want):
        bound = "device" if dev >= host else "host"
        return Verdict(True, f"({host:.2f} + {dev:.2f}) / {max(host, dev):.2f} = x{want:.2f}: at best the {bound} "
                             f"time of a round remains, everything else is hidden under it")
    mistakes = [
        ((host + dev) / min(host, dev), "divide by the larger of the two: overlap leaves the longer lane's time"),
        (max(host, dev) / (host + dev), "that is upside down: the serial round takes host + device, the overlapped "
                                        "one max(host, device); the speed-up is serial over overlapped"),
        (dev / host, "that is device over host; the ideal is (host + device) / max(host, device)"),
        (host / dev, "that is host over device; the ideal is (host + device) / max(host, device)"),
        (host + dev, "that is a serial round's time in ms; divide it by what an overlapped round takes, "
                     "max(host, device)"),
    ]
    idle = serial_stats.get("decode_device_idle_fraction")
    if isinstance(idle, float) and 0 <= idle < 1:
        mistakes.append((1 / (1 - idle), "that estimate comes from the idle fraction; the question asks for the "
                                         "per-round host and device times"))
    if zos_stats:
        try:
            mistakes.append((ideal_ratio(zos_stats), "those are the ZOS run's times: the ideal comes from the serial "
                                                     "run, where host and device work add up"))
            mistakes.append((zos_stats["tokens_per_s"] / serial_stats["tokens_per_s"],
                             "that is the measured speed-up; the ideal is computed from the serial run's times"))
        except (KeyError, TypeError, ZeroDivisionError):
            pass
    for value, why in mistakes:
        if close(value):
            return Verdict(False, f"{answer:.3g}: {why}")
    if abs(answer / 100 - want) <= 0.006:
        return Verdict(False, f"{answer:.3g} is a percentage: write the ratio itself, x{want:.2f} (as in 1.25, not 125)")
    if any(abs(answer - one_decimal) < 1e-9 for one_decimal in (round(want, 1), math.floor(want * 10) / 10)):
        return Verdict(False, f"{answer:.3g} is x{want:.3f} cut to one decimal: that hides the part this question is "
                              f"about, give two decimals")
    return Verdict(False, f"{answer:.3g} is not it: serial_stats gives host {host:.3f} ms and device {dev:.3f} ms per "
                          f"round; compute (host + device) / max(host, device)")


# ================================================================ 04: stale lengths

@_bounded
def check_true_key_length(answer, host_seqlens_k: int, accepted: int) -> Verdict:
    """Predict (04): the host planned ``host_seqlens_k`` for a request whose in-flight
    round accepted ``accepted`` drafts; what is the real key length?"""
    if answer is None:
        return _unanswered("set `true_seqlens_k` to a number")
    number = _whole(answer)
    if number is None:
        return Verdict(False, f"a key length is one whole number, not {_show(answer)}")
    answer = number
    want = host_seqlens_k + accepted
    if answer == want:
        return Verdict(True, f"{host_seqlens_k} + {accepted} = {want}: the host already counted one token for the "
                             f"in-flight round; the {accepted} accepted drafts are the part it could not know")
    if answer == host_seqlens_k:
        return Verdict(False, "that is the host's stale value: the in-flight round added its accepted drafts too")
    if answer == host_seqlens_k + accepted + 1:
        return Verdict(False, "one too many: the host's plan already counts the in-flight round's bonus token "
                              "(it assumed one token per in-flight round); add only the accepted drafts")
    if answer == host_seqlens_k + 1:
        return Verdict(False, "the host already assumed one token for the in-flight round; what it missed is the "
                              "number of accepted drafts")
    if answer == host_seqlens_k - accepted:
        return Verdict(False, "the host's value is too short, not too long: accepted drafts make the sequence longer")
    return Verdict(False, f"{answer} is not it: the real key length is the host's plan plus the accepted drafts "
                          f"of the in-flight round")


@_bounded
def check_corrected_slots(answer, positions, table, accepted: int, block_size: int) -> Verdict:
    """Your turn (04): the corrected slot_mapping of one request whose stale positions are
    ``positions`` and whose in-flight round accepted ``accepted`` drafts."""
    if answer is None:
        return _unanswered("set `new_slots` to a list of slots, one per fed token")
    got = _int_list(answer)
    if got is None:
        return Verdict(False, "write the slots as a list of whole numbers, one per fed token")
    table, positions = [int(b) for b in table], [int(p) for p in positions]
    if len(got) != len(positions):
        return Verdict(False, f"the request feeds {len(positions)} tokens this round (seqlens_q does not change), "
                              f"so give {len(positions)} slots, not {len(got)}")

    def slots(pos_list):
        return [table[p // block_size] * block_size + p % block_size if 0 <= p // block_size < len(table) else None
                for p in pos_list]

    want = slots([p + accepted for p in positions])
    if got == want:
        return Verdict(True, f"positions {[p + accepted for p in positions]} go through the block table to slots "
                             f"{want}")
    stale = slots(positions)
    mistakes = [
        (stale, "those are the host's stale slots: positions move right by the accepted count first"),
        ([s + accepted for s in stale], "adding the accepted count to the old slots is wrong where a position "
                                        "crosses into the next block: recompute each slot from the new position "
                                        "through the block table"),
        ([p + accepted for p in positions], "those are the corrected positions; now turn each into a slot "
                                            "through the block table"),
        (slots([p + accepted + 1 for p in positions]), "you shifted by 1 + accepted: the host's plan already "
                                                        "counts one token for the in-flight round"),
    ]
    if accepted != 1:
        mistakes.append((slots([p + 1 for p in positions]), f"you shifted by 1: this request's in-flight round "
                                                             f"accepted {accepted} drafts"))
    for value, why in mistakes:
        if got == value:
            return Verdict(False, f"{got}: {why}")
    return Verdict(False, f"{got} is not it: shift each position by the accepted count ({accepted}), then slot = "
                          f"table[pos // {block_size}] * {block_size} + pos % {block_size} with table {table}")


# ================================================================ 05: ownership and lifetime

@_bounded
def check_uncommitted_rounds(answer, launches, round: int) -> Verdict:
    """Predict (05): right after round ``round``'s forward is launched, which rounds were
    launched for the request but not processed yet (their tokens are uncommitted)?

    ``launches`` is the notebook's record of a one-prompt run: per launched forward a tuple
    ``(round, committed tokens, rounds in flight, ...)``.  The prompt is in every round, so
    the rounds in flight are the newest ``in flight`` rounds up to ``round``."""
    if answer is None:
        return _unanswered("set `uncommitted` to the set of round numbers, e.g. {1, 2}")
    got = _int_set(answer)
    if got is None:
        return Verdict(False, f"write a set of whole round numbers such as {{2, 5}}, not {_show(answer)}")
    rows = {}
    try:
        for row in launches:
            rows[int(row[0])] = (int(row[1]), int(row[2]))
    except (TypeError, ValueError, IndexError):
        return Verdict(False, "pass the record of watch_launches: one (round, committed, in flight, text) per launch")
    if round not in rows:
        return Verdict(False, f"this record has no launch of round {round} (it has rounds {sorted(rows)}): "
                              f"run it with more new tokens")
    committed, in_flight = rows[round]
    want = set(range(round - in_flight + 1, round + 1))
    shown = sorted(want)
    if got == want:
        if in_flight == 1:
            return Verdict(True, f"{shown}: only the round just launched; every earlier round was waited for and "
                                 f"processed before it, so the request already holds {committed} tokens")
        return Verdict(True, f"{shown}: round {round} was just launched, and round {round - 1}'s token is on the "
                             f"device, in StepState(round={round - 1})'s output slot, until the host processes it "
                             f"after this launch. The request holds {committed} committed tokens")
    unknown = sorted(r for r in got if r < 0 or r > round)
    if unknown:
        return Verdict(False, f"round {unknown[0]} was not launched yet when round {round}'s forward was: only "
                              f"rounds 0 to {round} exist at that moment")
    if round not in got:
        return Verdict(False, f"round {round} itself counts: its forward was just launched, so none of its tokens "
                              f"can be committed yet")
    missing = sorted(want - got)
    if missing:
        return Verdict(False, f"round {missing[0]} is still in flight too: under ZOS the host processes round "
                              f"{missing[0]} only after launching round {round}'s forward, so its token waits on "
                              f"the device in StepState(round={missing[0]})'s slot; the request holds {committed} "
                              f"tokens at this moment")
    extra = sorted(got - want)
    return Verdict(False, f"round {extra[-1]} is already processed: its token is among the {committed} the request "
                          f"holds (the host waited for it {'before' if in_flight == 1 else 'one iteration before'} "
                          f"this launch). In flight now: {len(want)} round(s)")


@_bounded
def check_discarded(answer, engine, name: str = "discarded") -> Verdict:
    """Predict (05): how many outputs did ``engine``'s last run discard (its
    ``stats["discarded_outputs"]``): rounds that came back for requests already finished?
    ``name`` is the answer's variable in the notebook, for the unanswered message."""
    if answer is None:
        return _unanswered(f"set `{name}` to a whole number of discarded outputs")
    number = _whole(answer)
    if number is None:
        return Verdict(False, f"a count of discarded outputs is one whole number, not {_show(answer)}")
    try:
        want = int(engine.stats["discarded_outputs"])
        mode, drafts = engine.config.mode, engine.config.num_draft_tokens
        reasons = [r.finish_reason for r in engine.requests]
    except (AttributeError, KeyError, TypeError):
        return Verdict(False, "pass the engine whose run the question is about (and run it first)")
    early = sum(r in ("stop", "eos", "abort") for r in reasons)
    ended = (f"in this run {early} request(s) ended by a stop string, EOS or abort and "
             f"{reasons.count('length')} by the length limit")
    answer = number
    if answer == want:
        if want == 0 and mode == "serial":
            why = ("the serial host processes every round before launching the next, so a finished request is "
                   "never in a launched round")
        elif want == 0:
            why = "no launched round held a request when the host learned that it had finished"
        else:
            why = ("each is a round that was launched with a request before the host learned that the request had "
                   "finished (the extra step); its tokens are dropped when they land")
        return Verdict(True, f"{want}: {why}; {ended}")
    if answer < 0:
        return Verdict(False, "a count cannot be negative")
    if want > 0 and answer == 0 and reasons.count("abort") and early == reasons.count("abort"):
        return Verdict(False, f"an abort takes effect at once, but under ZOS a round with the request in it was "
                              f"already launched and not yet processed: its output comes back and is discarded. "
                              f"The run discarded {want}; {ended}")
    if want > 0 and answer == 0:
        return Verdict(False, f"under ZOS the host learns that a request finished only when it processes that "
                              f"round, after the next round was launched with the request in it: that round's "
                              f"output comes back and is discarded. The run discarded {want}; {ended}")
    if want == 0 and mode == "serial":
        return Verdict(False, f"the serial host waits for and processes each round before launching the next: a "
                              f"finished request is never in a launched round, so nothing is discarded; {ended}")
    if want == 0:
        return Verdict(False, f"no launched round held a request when it finished (a prefill round is processed "
                              f"at once; a length limit is counted in advance). Nothing was discarded; {ended}")
    if answer > want and not drafts:
        return Verdict(False, f"too many: without drafts a request that ends by stop, EOS or abort is in at most "
                              f"one launched round the host did not know about, and a length limit never causes "
                              f"one (the scheduler counts in-flight rounds); {ended}")
    return Verdict(False, f"{answer} is not it: count the launched rounds that still held a request when the host "
                          f"learned that it had finished; {ended}")


def _race_answer(answer) -> tuple[tuple[str, int] | None, str | None]:
    pair = (answer.get("buffer"), answer.get("round")) if isinstance(answer, dict) else answer
    if isinstance(pair, (str, bytes)) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
        return None, f"write a pair (buffer name, round), e.g. (\"out1\", 3), not {_show(answer)}"
    buffer, round = pair[0], _round_number(pair[1])
    if not isinstance(buffer, str) or round is None:
        return None, f"write the buffer's name as a string and the round as a whole number, e.g. (\"out1\", 3), " \
                     f"not {_show(answer)}"
    return (buffer.strip().strip("'\"").lower(), round), None


@_bounded
def check_race_report(answer, err) -> Verdict:
    """Predict (05): with NUM_SLOTS = 1, which buffer will the race checker name, and the
    launch of which round still uses it?  ``err`` is the RaceError the run raised."""
    if answer is None:
        return _unanswered("set `race_guess` to a pair (buffer name, round)")
    parsed, problem = _race_answer(answer)
    if parsed is None:
        return Verdict(False, problem)
    if err is None or getattr(err, "kind", None) != "buffer":
        return Verdict(False, "this run raised no buffer race: run it with te.engine.NUM_SLOTS = 1 on an engine "
                              "with the race checker on (race_check=True)")
    buffer, round = parsed
    want_buffer, want_round, launch = err.buffer, err.round, err.launch
    kind = want_buffer.rstrip("0123456789")
    slot = want_buffer[len(kind):]
    if (buffer, round) == (want_buffer, want_round):
        return Verdict(True, f"{want_buffer} and round {want_round}: round {want_round + 1}'s prepare writes the "
                             f"one metadata slot while round {want_round}'s {launch}, the step the loop still holds "
                             f"as `previous`, may not have read it yet. The checker: {err}")
    if buffer.rstrip("0123456789") == kind and buffer != want_buffer:
        return Verdict(False, f"with NUM_SLOTS = 1 every round uses slot {slot}: the buffer is {want_buffer}, not "
                              f"{buffer}")
    if buffer != want_buffer:
        if buffer.startswith("out"):
            why = (f"the host reads an output slot only after waiting on its round's event; the first unordered "
                   f"access is the next round's prepare writing {want_buffer}")
        elif buffer.startswith("temps"):
            why = f"prepare writes {want_buffer} before temps, so the checker stops at {want_buffer}"
        else:
            why = f"the buffers are meta{slot}, temps{slot} and out{slot}; prepare writes {want_buffer} first"
        return Verdict(False, f"{_show(buffer)}: {why}")
    if round == want_round + 1:
        return Verdict(False, f"round {round} is the round whose prepare writes {want_buffer}; the report names "
                              f"the launch that still reads it: round {want_round}'s {launch}, not waited for yet")
    if round < want_round:
        return Verdict(False, f"round {round} was waited for before the host touched {want_buffer} again (the "
                              f"prefill is processed at once, and ZOS waits on round N-1 in iteration N): the "
                              f"first unordered access is one round later")
    return Verdict(False, f"round {round} is not it: the checker stops at the first host write that no wait has "
                          f"ordered after a launch using {want_buffer}")


# ================================================================ 06: real traces (issue 24)
# This section is self-contained (its own imports, names and __all__ entries) so that it merges
# cleanly with edits elsewhere in this file.  Every check judges against the trace it is given
# (the real A100 file, or the learner's own export), never against a number written here.

import re  # noqa: E402  (this section's own import, kept here for merging)

__all__ += ["check_idle_share", "check_idle_sync"]

#: How far (in share points) an eyeballed idle share may be from the measured one.
IDLE_SHARE_TOLERANCE = 0.10
_CALL_SUFFIX = ("()", "_v2")


def _trace_figures(trace, what):
    """(KinetoTrace, its summary) or a Verdict saying what is wrong with ``trace``."""
    from overlap_course.traces import kineto

    try:
        parsed = trace if isinstance(trace, kineto.KinetoTrace) else kineto.KinetoTrace(trace)
        return parsed, kineto.summary(parsed)
    except (ValueError, TypeError) as err:
        return Verdict(False, f"cannot measure {what}: {err}")


def check_idle_share(answer, trace) -> Verdict:
    """Predict (06): the share of the trace's device span (first to last event on a GPU stream)
    in which no device work runs -- HTA's idle, :func:`overlap_course.traces.kineto.summary`'s
    ``device_idle_fraction``.  A fraction (0.8) or a percentage (80); within 10 points passes,
    since it is read off a figure."""
    if answer is None:
        return _unanswered("set `idle_share` to a number, e.g. 0.5 or 50 (%)")
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if isinstance(answer, str):
        return Verdict(False, f"write the share as a number (0.5, or 50 for 50 %), not the string {answer!r}")
    if not _is_number(answer) or not math.isfinite(answer):
        return Verdict(False, f"write the share as a finite number (0.5, or 50 for 50 %), not {answer!r}")
    measured = _trace_figures(trace, "the idle share")
    if isinstance(measured, Verdict):
        return measured
    _, s = measured
    idle, span, busy_us, idle_us = (s["device_idle_fraction"], s["device_span_us"], s["device_busy_us"],
                                    s["device_idle_us"])
    numbers = (f"measured: the device is idle {idle_us:.0f} of the {span:.0f} us from its first to its last "
               f"event, {idle:.1%} (busy {busy_us:.0f} us)")
    if answer < 0:
        return Verdict(False, f"a share cannot be negative; {numbers}")
    if answer > 100:
        unit = ("that is the idle time in microseconds, not a share" if abs(answer - idle_us) <= 0.05 * idle_us
                else "a share is at most 1 (or 100 %)")
        return Verdict(False, f"{answer:g}: {unit}; {numbers}")
    share, as_percent = (answer / 100, True) if answer > 1 else (answer, False)
    written = f"{answer:g} %" if as_percent else f"{answer:g}"
    if answer > 1 and busy_us > 0 and abs(answer - idle_us / busy_us) <= 0.05 * idle_us / busy_us:
        return Verdict(False, f"{answer:g}: that is idle over busy ({idle_us:.0f} / {busy_us:.0f}); the share is "
                              f"idle over the whole span; {numbers}")
    if abs(share - idle) <= IDLE_SHARE_TOLERANCE:
        kernels_only = s["kernels_only_idle_fraction"]
        extra = (f" (counting only kernels, copies and memsets as busy, not the stream's sync interval: "
                 f"{kernels_only:.1%})" if abs(kernels_only - idle) >= 0.001 else "")
        most = ". Most of the span the GPU has nothing queued" if idle > 0.5 else ""
        return Verdict(True, f"{written} is close: {numbers}{extra}{most}")
    if abs(share - (1 - idle)) <= IDLE_SHARE_TOLERANCE / 2 and abs(share - idle) > IDLE_SHARE_TOLERANCE:
        return Verdict(False, f"{written} is the busy share: the question asks how much of the span the device "
                              f"is idle; {numbers}")
    direction = "more" if share < idle else "less"
    return Verdict(False, f"{written} is more than {100 * IDLE_SHARE_TOLERANCE:.0f} points off: the device is idle "
                          f"{direction} than that; {numbers}. Look at how little of the device row the bars cover")


def _call_name(answer: str) -> str:
    name = answer.strip().strip("'\"`").strip()
    for suffix in _CALL_SUFFIX:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.lower()


def check_idle_sync(answer, trace) -> Verdict:
    """Your turn (06): name the host call after which the device sat idle longest -- the
    blocking ``...Synchronize`` call charged with the most idle time by
    :func:`overlap_course.traces.kineto.idle_after_syncs` (the gaps in which it returned).  Judged on the
    trace given: the real A100 file, or the learner's own exported run."""
    from overlap_course.traces import kineto

    if answer is None:
        return _unanswered("set `culprit` to the host call's name, as a string")
    if not isinstance(answer, str) or not answer.strip():
        return Verdict(False, f"write the call's name as a string, e.g. \"cudaLaunchKernel\", not {answer!r}")
    measured = _trace_figures(trace, "which sync left the device idle")
    if isinstance(measured, Verdict):
        return measured
    parsed, _ = measured
    idle = kineto.idle_after_syncs(parsed)
    if not idle["by_sync_us"]:
        return Verdict(False, f"no host sync returned while the device was idle in this trace: its "
                              f"{idle['idle_us']:.0f} us of idle are the host launching too slowly")
    want, want_us = next(iter(idle["by_sync_us"].items()))
    gaps = [g for g in idle["gaps"] if g["sync"] == want]
    total = idle["idle_us"]
    got = _call_name(answer)
    got = _call_name(SYNC_EVENT_NAMES.get(got, got))
    where = (f"{len(gaps)} gap{'s' * (len(gaps) != 1)}, {want_us:.0f} of the {total:.0f} us the device idled"
             if len(gaps) > 1 else
             f"the device drained at {gaps[0]['start_us']:.0f} us, {want} returned at {gaps[0]['sync_end_us']:.0f} us "
             f"and nothing was queued until {gaps[0]['end_us']:.0f} us: {want_us:.0f} of the {total:.0f} us it idled")
    if got == want.lower():
        alias = (f" ({answer.strip()!r} is its record on the device's sync track)"
                 if _call_name(answer) != want.lower() else "")
        rest = (f"; the other {idle['no_sync_us']:.0f} us are gaps in which no sync returned: the host issuing work "
                f"too slowly" if idle["no_sync_us"] >= 1 else "")
        return Verdict(True, f"{want}{alias}: the host blocked until the queue was empty, so the device waited "
                             f"for everything the host did next; {where}{rest}")
    host_names = {e.name.lower(): e.name for e in parsed.host}
    if re.search(r"item|local_scalar|is_nonzero|\.cpu|tolist", got):
        return Verdict(False, f"{answer.strip()!r} is the PyTorch side of it (reading a GPU value on the host "
                              f"copies it and waits); name the CUDA runtime call on the host lane that waited")
    if got in host_names and kineto.is_launch_call(host_names[got]):
        return Verdict(False, f"{host_names[got]} queues work and returns at once; it never waits for the device. "
                              f"Look for the call the host blocked in right after the device went idle")
    if got in host_names and not _is_sync_name(got):
        return Verdict(False, f"{host_names[got]} does not block the host (it records, queries or measures an "
                              f"event). Look for a ...Synchronize call")
    if got in host_names:  # another sync of this trace
        own = idle["by_sync_us"].get(host_names[got], 0.0)
        why = (f"it returned in gaps worth {own:.0f} us" if own else
               "it did not return while the device was idle: it waited on work that was still running, or came "
               "after the last device event")
        return Verdict(False, f"{host_names[got]}: {why}. The most idle after one call, {want_us:.0f} of the "
                              f"{total:.0f} us, follows a different sync")
    listed = ", ".join(idle["syncs"])
    return Verdict(False, f"{answer.strip()!r} is not a call of this trace; its host syncs are: {listed}")


SYNC_EVENT_NAMES = {"stream sync": "cudaStreamSynchronize", "event sync": "cudaEventSynchronize",
                    "context sync": "cudaDeviceSynchronize"}


def _is_sync_name(name: str) -> bool:
    return "synchronize" in name.lower()


from overlap_course.progress import record_all  # noqa: E402  (issue 27: every verdict recorded, overlap_course/progress.py)
record_all(globals(), __all__)
