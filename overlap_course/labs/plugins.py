"""How a lab puts a learner's function into a run, through the engine's own plug-in points
(``on_round``, ``loop``, and ``te.engine.RING_SLOTS``, the ring of host slots read per run): the
engine's code calls the learner's function where it would call its own."""

from __future__ import annotations

import collections
import difflib
import functools
import inspect
import itertools
import numbers
import threading

import numpy as np
import torch

import toy_engine.engine as engine_module
from toy_engine.config import MAX_SLOTS, EngineConfig
from toy_engine.engine import Engine
from toy_engine.sequence import Request
from toy_engine.validate import body_checked, check_int, check_takes, plugin_label, shown

#: What ``per_request`` may replace: a request's own methods that the run calls.  Its fields
#: (``finish_reason``, ``output_ids``, ...) are data the engine reads; a function there would be
#: taken for a value.  ``completion`` is called after the run, to build what ``generate`` returns.
AFTER_THE_RUN = ("completion",)
REQUEST_METHODS = tuple(sorted(name for name, value in vars(Request).items()
                               if inspect.isfunction(value) and not name.startswith("_")
                               and name not in AFTER_THE_RUN))


def per_request(**methods):
    """An ``on_round`` plug-in giving each request of the run ``methods`` in place of its own:
    with ``commit=f`` the engine's ``commit_outputs`` calls ``f(req, tokens, eos_id, decode)``, with
    ``wants_more=f`` its scheduler asks ``f(req)`` whether to plan the request again."""
    for name, method in methods.items():
        _check_method_name(name)
        params = list(inspect.signature(getattr(Request, name)).parameters)
        check_takes(f"per_request: {name}", method, ["req", *params[1:]])

    run = dict(requests=None)  # a commit that commits nothing: the engine's check_progress

    def on_round(engine, round):
        if run["requests"] is not engine.requests:  # a new run (the plug-in may serve several)
            run.update(requests=engine.requests)
            for req in engine.requests:
                for name, method in methods.items():
                    setattr(req, name, _answer_checked(name, method, req))
    return on_round


class NotTrueOrFalse(TypeError):
    """``wants_more`` (the function ``name``) answered something else than True or False
    (``answer``, for the prompt ``prompt``): a function that forgot its ``return`` answers
    None, and the run would stop blaming the loop."""

    def __init__(self, name: str, answer, prompt: int):
        hint = " (no `return` gives None)" if answer is None else ""
        super().__init__(f"per_request(wants_more={name}) returned {shown(answer)} for prompt "
                         f"{prompt}, not True or False{hint}")
        self.name, self.answer, self.prompt = name, answer, prompt


def _answer_checked(name: str, method, req):
    """``method`` bound to ``req``; ``wants_more``'s answer must be True or False (numpy's
    np.True_ and np.False_, a comparison of numpy values, are taken as the bools they are, and
    so are the whole numbers 1 and 0: the scheduler uses only the truth value), another's is
    ignored, so it must not be a generator (whose body never ran)."""
    if name != "wants_more":
        bound = functools.partial(body_checked(f"per_request: {name}", method), req)
        bound.label = f"per_request({name}={plugin_label(method)})"  # the engine's messages
        return bound
    bound = functools.partial(method, req)

    def wants_more():
        answer = bound()
        value = zero_d(answer)
        if type(value) is np.bool_ or (isinstance(value, (int, np.integer)) and value in (0, 1)):
            value = bool(value)  # numpy's bool type cannot be subclassed: exactly that
        if type(value) is not bool:
            raise NotTrueOrFalse(plugin_label(method), answer, req.index)  # reads types only
        return value
    wants_more.label = f"per_request(wants_more={plugin_label(method)})"  # the engine's messages
    return wants_more


def aborts(abort, at):
    """An ``on_round`` plug-in calling ``abort(engine, request_id)`` once for each ``(round, prompt
    index)`` in ``at``, just before that round is scheduled (as a client's abort would arrive)."""
    check_takes("aborts: abort", abort, ["engine", "request_id"])
    abort = body_checked("aborts: abort", abort)  # its answer ignored: a generator never ran
    at = _abort_points(at)
    done, ids, run = set(), [], [None]

    def on_round(engine, round):
        if run[0] is not engine.requests:  # a new run (the plug-in may serve several): start over
            run[0] = engine.requests
            done.clear()
            ids[:] = [r.id for r in engine.requests]
        for when, index in at:
            if when == round and (when, index) not in done:
                done.add((when, index))
                if not 0 <= index < len(ids):
                    raise ValueError(f"aborts: prompt index {index} is not in this run, which has prompts 0 to "
                                     f"{len(ids) - 1}")
                abort(engine, ids[index])
    return on_round


def keep_in_flight(depth: int):
    """The ZOS loop holding up to ``depth`` decode steps instead of one: round N's forward goes in
    before round N - depth is processed (a deeper pipeline; with drafts only ``depth=1``: their
    correction covers one round in flight)."""
    depth = check_int("depth", depth, 1, None, " (decode steps the loop holds)")
    return deep_loop(depth, None, f"keep_{depth}_in_flight")


def deep_loop(depth: int, to_process, name: str):
    """The loop behind ``keep_in_flight`` and notebook 07b's ``batch_queue``: up to ``depth``
    decode steps held; ``to_process(engine, plan, held)``, if given, says how many of the oldest
    held steps to process after round N's forward and before its sample.  With drafts, the
    seqlen correction runs as in the ZOS loop, and only ``depth=1`` is taken: the correction
    fixes the lengths of one round in flight, so a deeper queue would silently give other text."""
    def loop(engine):
        drafts = engine.config.num_draft_tokens
        if drafts and depth > 1:
            raise ValueError(f"{name} holds {depth} decode steps, but this engine drafts "
                             f"{drafts} tokens a round (num_draft_tokens={drafts}): the seqlen "
                             f"correction covers one round in flight, so its text would be "
                             f"silently wrong; run it on an engine without drafts, or hold 1")
        held = collections.deque()
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:  # nothing to launch: process the oldest held step now
                if held:
                    engine.flush(held.popleft())
                continue
            inputs = engine.prepare_inputs(plan)
            if held:  # a round in flight: its drafts' lengths are fixed on the device
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if len(held) == depth:
                engine.process_outputs(held.popleft())
            for _ in range(to_process(engine, plan, tuple(held)) if to_process else 0):
                engine.process_outputs(held.popleft())
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                engine.process_outputs(current)
            else:
                held.append(current)
    loop.__name__ = loop.__qualname__ = name
    return loop


_OPEN_RINGS = threading.local()  # per thread: (ring, token) for each ring entered, innermost last


class ring:
    """Engines built and runs started inside, in this thread, use a ring of ``slots`` host slots
    (round N writes slot N % slots); another thread's keep their own (``te.engine.RING_SLOTS``,
    per thread: ``te.engine.NUM_SLOTS``, which all share, is left alone).  Reusable: a notebook
    keeps ``three = ring(3)`` in one cell and re-runs ``with three:`` in another.  Entered by
    hand (``__enter__``), rings are exited innermost first, as ``with`` blocks are: an exit out
    of that order is refused and changes nothing, since it would leave the outer ring's setting
    behind."""

    def __init__(self, slots: int):
        self.slots = check_int("slots", slots, 1, MAX_SLOTS, " (host slots in the ring)")

    def __enter__(self) -> None:
        opened = _OPEN_RINGS.__dict__.setdefault("rings", [])
        opened.append((self, engine_module.RING_SLOTS.set(self.slots)))

    def __exit__(self, *exc) -> None:
        opened = _OPEN_RINGS.__dict__.setdefault("rings", [])
        mine = [i for i, (entered, _) in enumerate(opened) if entered is self]
        if not mine:
            raise RuntimeError(f"{self!r} is not entered in this thread (exited already, or "
                               f"entered in another thread): there is nothing to exit")
        later = [repr(entered) for entered, _ in reversed(opened[mine[-1] + 1:])]
        if later:
            raise RuntimeError(f"{self!r} exited while {', '.join(later)}, entered after it, "
                               f"{'is' if len(later) == 1 else 'are'} still entered; nothing was "
                               f"changed: exit {', then '.join(later)} first, then {self!r} "
                               f"(with blocks exit in that order)")
        engine_module.RING_SLOTS.reset(opened.pop()[1])

    def __repr__(self) -> str:
        return f"ring({self.slots})"


def ring_engine() -> Engine:
    """A ZOS engine (batches of 3, race checker on) built with MAX_SLOTS host slots, so that a run
    may use any ring up to that; the same one on every call until it is closed (a ``with``
    block, ``close()``), then a new one; closed when Python exits, as every engine is."""
    return learners_engine("ring", EngineConfig(mode="zos", max_batch_size=3))


_LEARNERS: dict[str, Engine] = {}  # the engine a lab hands out, by name


def learners_engine(name: str, config: EngineConfig) -> Engine:
    """The engine ``name`` a notebook hands the learner to experiment on, built with MAX_SLOTS
    host slots; a closed one is replaced (it would refuse every run, and no plain engine has
    the ring's slots)."""
    engine = _LEARNERS.get(name)
    if engine is None or engine.closed:
        with ring(MAX_SLOTS):
            engine = _LEARNERS[name] = Engine(config)
    return engine


def zero_d(value):
    """A 0-d torch tensor or NumPy array as the Python scalar it holds (``torch.tensor(0)``,
    ``np.array(True)``: what arithmetic or a comparison on tensors returns), as ``np.int64`` and
    ``np.bool_`` are taken; anything else as it is."""
    try:
        if issubclass(type(value), torch.Tensor) and value.dim() == 0 and not value.is_complex():
            return value.item()
        if isinstance(value, np.ndarray):  # as a plain array: a subclass's own shape may lie
            plain = np.ndarray.view(value, np.ndarray)
            return plain.item() if plain.shape == () and plain.dtype.kind in "biuf" else value
    except (RuntimeError, NotImplementedError, TypeError, ValueError):  # a meta tensor: no value
        pass
    return value


def whole_float(value) -> bool:
    """Whether ``value`` is a float of a whole value (2.0, ``np.float64(0.0)``).  Where a
    learner's function returns a ring size, a row or a count, the loop sizes, indexes or counts
    with it, which Python does with an int only: its message says so, where a prediction's 37.0
    is 37 (``overlap_course.checks.answers``; blind round 12)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or isinstance(
            value, numbers.Integral):
        return False
    try:
        return float(value).is_integer()
    except (TypeError, ValueError, OverflowError):  # the value's own __float__
        return False


AN_INT = "an int, even when it is whole: return `int(...)`, or compute it with ints"
NOT_A_BOOL = ("an int, not a bool (True and False answer yes or no, though Python adds them "
              "as 1 and 0; `x and n` is False, not 0, where x is false): return `int(...)`, "
              "or write the 0 out (`n if x else 0`)")


def a_bool(value) -> bool:
    """Whether ``value`` (:func:`zero_d`'s) is a Python or NumPy bool: refused where a count or
    an index is asked, as every check refuses a bool for a number, with :data:`NOT_A_BOOL` to
    say why (blind round 24: `engine.constraint is not None and len(held)` was told only "a
    whole number from 0 to 0")."""
    return isinstance(value, (bool, np.bool_))


def _check_method_name(name: str) -> None:
    """Only a request's methods: a typo would be ignored, a field overwritten with a function."""
    if name in REQUEST_METHODS:
        return
    methods = ", ".join(REQUEST_METHODS)
    if name in AFTER_THE_RUN:
        raise TypeError(f"per_request: {name} is not called during the run: the engine calls it "
                        f"after the run to build what generate returns; the methods a run calls "
                        f"are {methods}")
    if name in Request.__dataclass_fields__ or isinstance(getattr(Request, name, None), property):
        raise TypeError(f"per_request: {name} is a request's data, not a method, and cannot be "
                        f"replaced; a request's methods are {methods}")
    close = difflib.get_close_matches(name, REQUEST_METHODS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise TypeError(f"per_request: a request has no method {name}{hint}; its methods are {methods}")


#: More abort points than a lab's run has requests by far (the engine takes 10,000 prompts).
MAX_ABORTS = 10_000


def _abort_points(at) -> tuple:
    """``at`` as a tuple of (round, prompt index) pairs of integers >= 0, read once (a generator
    would be used up by the first round)."""
    refused = TypeError(f"aborts: at must be a list of (round, prompt index) pairs, such as "
                        f"[(5, 1)], got {type(at).__name__} {shown(at)}")
    if isinstance(at, (str, bytes)):
        raise refused
    try:
        points = tuple(itertools.islice(at, MAX_ABORTS + 1))  # an endless iterator too
    except TypeError:
        raise refused from None
    if len(points) > MAX_ABORTS:
        raise ValueError(f"aborts: at holds more than {MAX_ABORTS} (round, prompt index) pairs "
                         f"(or never ends): a run aborts each request at most once")
    checked = []
    for i, point in enumerate(points):
        if not isinstance(point, (tuple, list)) or len(point) != 2:
            raise TypeError(f"aborts: at[{i}] must be a (round, prompt index) pair, got "
                            f"{type(point).__name__} {shown(point)}")
        when, index = point
        checked.append((check_int(f"aborts: at[{i}]'s round", when, 0),
                        check_int(f"aborts: at[{i}]'s prompt index", index, 0)))
    return tuple(checked)

