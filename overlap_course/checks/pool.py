"""The engines the exercise checkers run a learner's code on, and the reference runs they
compare it with.

Starting a device is the slow part of a first check, so there are few engines, shared by
every check and kept whole between checks (:func:`heal`): one per configuration, on one
loaded model.  A serial run is a ZOS-mode engine given ``loop=loops.serial_loop`` (the mode
only picks the default loop).  Start-up times are in docs/measurements/checks.md.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import enum
import functools
import typing
from concurrent.futures import ThreadPoolExecutor

import torch

from toy_engine.data import CharTokenizer
from toy_engine.config import MAX_SLOTS, EngineConfig
from toy_engine import loops
from overlap_course.checks import devices
from overlap_course.labs import plugins
from toy_engine.device import Device
from toy_engine.engine import Engine
from toy_engine.model import load_model
from toy_engine.process_device import ProcessDevice
from toy_engine.races import RaceChecker
from toy_engine.record import Commit, RunRecord
from toy_engine.scheduler import BlockManager, Scheduler

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]
MAX_NEW_TOKENS = 24
# Exercise 02's second run: its requests end at a stop string at different rounds (after 2 to 9
# tokens), one by the length limit of 16, in 19 rounds: a loop that counts rounds or tokens fails it.
SECOND_RUN = {"max_new_tokens": 16, "stop": "a"}
# The endings run: its requests end every way a request can (without drafts: EOS, the stop
# string, the limit at a round's end; with DRAFTS drafts also the limit inside a speculative step),
# and later prompts wait for a row that only a freed request gives back: code that keeps a finished
# request's blocks stalls here.  With drafts, one round holds only requests that finished in the
# round before it (the extra step) while a waiting prompt's prefill is launched, and the last step
# flushed is such a step too: code that skips processing such a step, as if discarding it needed
# nothing, stalls too.
ENDINGS_PROMPTS = ["Tom was happy.\nAnd they all",
                   "Mia smiled.\nAnd they all lived happily ever after",
                   "Once upon a time", "And they all lived happily ever", "There was a fox"]
ENDINGS_RUN = {"max_new_tokens": 19, "stop": (" was",)}
DRAFTS = 3  # the ZOS checker's speculative run: stale lengths show only with drafts
CONSTRAINT = "title_case"  # the ZOS checker's constrained run: a wrong order shows in the text

_ENGINES: dict[tuple, Engine] = {}
_CONFIGS: dict = {}  # each engine's own frozen config, to put back a learner's replace()
_BUILT: dict = {}  # each engine's state as built (:func:`_state`): to see a change in place
_PRINTS: dict = {}  # each device as built (device_state.fingerprint): to see a kernel's change
_DEVICES: dict = {}  # each engine's device as built: to tell one the engine itself replaced


@functools.lru_cache(maxsize=1)
def _model():
    return load_model()


def engine(**config) -> Engine:
    """The shared engine of this configuration (ZOS mode, batches of 3, race checker on);
    ``slots=N`` builds it with N host buffer slots."""
    key = tuple(sorted(config.items()))
    if key not in _ENGINES:
        model, alphabet = _model()
        slots = config.pop("slots", None)
        with plugins.ring(slots) if slots else contextlib.nullcontext():
            _ENGINES[key] = Engine(EngineConfig(mode="zos", max_batch_size=3, race_check=True,
                                                **config),
                                   model=model, tokenizer=CharTokenizer(alphabet))
        _CONFIGS[key] = _ENGINES[key].config
        _BUILT[key] = _state(_ENGINES[key])
        built = _ENGINES[key]
        _DEVICES[key] = built.device
        _PRINTS[key] = devices.expected(built.config.num_draft_tokens, built.config.block_size)
        what = devices.changed(built, _PRINTS[key])
        if what is not None:  # a model changed on its way to the device
            _retire(_ENGINES.pop(key))
            raise RuntimeError(devices.not_shipped(key, what))
    return _ENGINES[key]


def ring_engine(**config) -> Engine:
    """The labs' ring engine for the checks (rings of up to MAX_SLOTS host slots), shared and
    healed like the others.  Not ``plugins.ring_engine()``: that one is the learner's, handed
    out by notebooks 07 and 07b to experiment on (closed, its race checker off), which a check
    must not inherit."""
    return engine(slots=MAX_SLOTS, **config)


def start(*configs: dict) -> None:
    """Start the engines a check needs at the same time: a first check then waits for its
    slowest device, not for their sum."""
    missing = [c for c in configs if tuple(sorted(c.items())) not in _ENGINES]
    if len(missing) > 1:
        _model()
        with ThreadPoolExecutor(len(missing)) as threads:
            list(threads.map(lambda config: engine(**config), missing))


def heal() -> list[str]:
    """Make every shared engine whole again before a check: its config, its race checker
    on, and a cache pool with each block exactly once; an engine changed anywhere else a run
    reads (``engine.tokenizer.eos_id = 5`` in a wrong loop) is replaced by a fresh one.  Returns
    what had to be put back."""
    changed = []
    for key, shared in list(_ENGINES.items()):
        replaced = False
        try:
            if shared.config is not _CONFIGS[key]:
                changed.append("`engine.config`")
                shared.config = _CONFIGS[key]
            if not shared.device.races.enabled:
                changed.append("`engine.device.races.enabled`")
                shared.device.races.enabled = True
            _finish_recovery(shared)
            if shared.device.failure() or not whole_pool(shared) or shared.scheduler.has_work():
                what = f"a shared engine's KV pool ({pool_size(shared)}"
            else:
                replaced = _replaced_device(shared, key)
                what = _changed(shared, _BUILT[key], replaced)
                what = (f"`{what}` of a shared engine (changed in place" if what else
                        None if replaced else devices.changed(shared, _PRINTS[key]))
        except Exception:  # noqa: BLE001 - a learner's junk where the engine's parts were
            what = "a shared engine (its parts could not be read"
        if what is not None and f"{what}; a fresh engine was started)" not in changed:
            changed.append(f"{what}; a fresh engine was started)")
        if what is not None or replaced:  # replaced: its device is new to the state as built
            _retire(_ENGINES.pop(key))
            engine(**dict(key))
    return changed


def whole_pool(shared: Engine) -> bool:
    """Whether the engine's KV pool holds each of its blocks exactly once (a block twice stands
    in for a missing one at the same length, and would be handed to two requests)."""
    return sorted(shared.scheduler.blocks.free_ids) == list(range(shared.config.num_kv_blocks))


def whole_again(engine: Engine) -> None:
    """A pool a learner's run left short or with a block or row twice (its verdict says so) is
    made whole at once, after each run of a check (exercise 05, lab 2): left for the next
    check's heal, it would be reported as an earlier cell's change."""
    try:
        rows = sorted(engine.scheduler.free_rows) != list(range(engine.config.max_batch_size))
        short = rows or not whole_pool(engine)
    except Exception:  # noqa: BLE001 - a learner's junk where the pool was: heal replaces it
        short = True
    if short:
        heal()


def pool_size(shared: Engine) -> str:
    """The pool as a note names it: its distinct free blocks, and its entries if some repeat."""
    free, n = list(shared.scheduler.blocks.free_ids), shared.config.num_kv_blocks
    twice = f", in {len(free)} entries" if len(set(free)) != len(free) else ""
    return f"{len(set(free))} free blocks of {n}{twice}"


def _finish_recovery(shared: Engine) -> None:
    """Finish the engine's own recovery after a run's exception where it was cut short, as its
    next run would (``Engine._ensure_ready``): a check's time limit raises TimeUp again every
    few ms until the check ends, and one can land in that recovery.  Nothing a learner changed:
    left unfinished, the run state reads as changed and the verdict would blame an earlier cell."""
    if shared._clean is False and not shared._running.locked():  # locked: a run still going
        shared._recover()


def _retire(shared: Engine) -> None:
    """Close a replaced engine; one a learner's thread still runs stops when it is dropped."""
    try:
        shared.close()
    except Exception:  # noqa: BLE001 - busy in another thread, or its device replaced by junk
        pass


# What a run replaces or advances (each checked by :func:`_run_state` instead of compared);
# the model is read only when the engine is built (the device has its own copy).
_PER_RUN = ((Engine, {"record", "scheduler", "timeline", "stats", "completions", "_run", "_next_id",
                      "_clean", "model"}),
            (Device, {"_seq", "_last_round", "_last_stage", "run_record", "_kernel_ids", "_sent_ns",
                      "_done_upto", "_stamps", "_latencies_ns", "_last_end_ns", "_events", "_timed",
                      "ctx"}),
            (RaceChecker, {"pending", "free_blocks"}))
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_MAX_ITEMS = 4096  # a longer container is compared by its identity and length


class _Same:
    """Equal only to the very same object (a learner's object may lie in ``__eq__``)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return type(other) is _Same and other.obj is self.obj


def _state(shared: Engine) -> dict:
    """What a run reads from ``shared`` and never changes itself, flat: path -> value."""
    out: dict = {}
    _flatten(shared, "engine", out, set())
    return out


def _flatten(value, path: str, out: dict, seen: set) -> None:
    kind = type(value)
    if kind in _PLAIN:
        out[path] = (kind, value)
    elif kind in (list, tuple, dict, collections.deque) and len(value) > _MAX_ITEMS:
        out[path] = (_Same(value), len(value))
    elif kind in (list, tuple, collections.deque):
        out[path] = (kind, len(value))
        for i, item in enumerate(value):
            _flatten(item, f"{path}[{i}]", out, seen)
    elif kind is dict:
        out[path] = (kind, tuple(k if type(k) in _PLAIN else _Same(k) for k in value))
        for i, item in enumerate(value.values()):
            _flatten(item, f"{path}[{i}]", out, seen)
    elif isinstance(value, torch.Tensor):  # a host buffer's contents change in every run
        whole = value.numel() <= _MAX_ITEMS and not value.is_shared() and value.device.type == "cpu"
        out[path] = (_Same(value), tuple(value.shape), value.dtype,
                     value.detach().numpy().tobytes() if whole and not value.is_pinned() else None)
    elif (kind.__module__.partition(".")[0] != "toy_engine" or id(value) in seen
          or isinstance(value, (enum.Enum, torch.nn.Module)) or not hasattr(value, "__dict__")):
        out[path] = _Same(value)
    else:
        seen.add(id(value))
        attributes = vars(value)
        out[path] = _Same(kind)  # each attribute its own path: an added one is named (round 30)
        skip = set().union(*(names for cls, names in _PER_RUN if isinstance(value, cls)))
        for name, item in attributes.items():  # of a per-run one, only that it is there
            _flatten("per run" if name in skip else item, f"{path}.{name}", out, seen)


def _replaced_device(shared: Engine, key: tuple) -> bool:
    """Whether the engine closed its device and started a new one: a run that left the device
    failing (a learner's sample launched before its forward) ends so.  Not a learner's change,
    though its buffers and process differ from the state as built."""
    built = _DEVICES[key]
    return shared.device is not built and built.failure() is not None


def _changed(shared: Engine, built: dict, skip_device: bool = False) -> str | None:
    """Where the engine differs from itself as built, in the parts a run reads, or None
    (``skip_device``: apart from its device, which the engine replaced)."""
    now = _state(shared)
    mine = [p for p in {**built, **now} if not (skip_device and _on_device(p))]
    return next((p for p in mine if p not in now or p not in built or now[p] != built[p]),
                None) or _run_state(shared)


def _on_device(path: str) -> bool:
    return path == "engine.device" or path.startswith(("engine.device.", "engine.device["))


def _run_state(shared: Engine) -> str | None:
    """What a run replaces or advances, as a run leaves it (idle, recovered), or None."""
    device, c = shared.device, shared.config
    process = type(device) is ProcessDevice  # the CPU stand-in's own books (CUDA has none)
    counters = [shared._next_id, device._seq,
                *([device._done_upto, device._events] if process else [])]
    if (not all(type(n) is int and n >= 0 for n in counters) or shared._clean is not True
            or type(shared.record) is not RunRecord or device.run_record is not shared.record
            or (process and device._done_upto > device._events)):
        return "engine's run state"
    ids = device._kernel_ids if process else {}
    if type(ids) is not dict or sorted(ids.values()) != list(range(len(ids))) or not all(
            type(i) is int for i in ids.values()):
        return "engine.device._kernel_ids"
    if type(device.races.pending) is not list or type(device.races.free_blocks) is not dict:
        return "engine.device.races"
    s = shared.scheduler
    fresh = shared._new_scheduler()
    if (type(s) is not Scheduler or vars(s).keys() != vars(fresh).keys()
            or type(s.blocks) is not BlockManager
            or vars(s.blocks).keys() != vars(fresh.blocks).keys() or s.waiting or s.running
            or type(s.free_rows) is not list or not all(type(r) is int for r in s.free_rows)
            or sorted(s.free_rows) != fresh.free_rows or type(s.round) is not int
            or type(s.num_draft_tokens) is not int or s.num_draft_tokens != c.num_draft_tokens
            or type(s.blocks.block_size) is not int or s.blocks.block_size != c.block_size
            or type(s.blocks.free_ids) is not collections.deque
            or not all(type(b) is int for b in s.blocks.free_ids)
            or s.blocks.on_alloc != fresh.blocks.on_alloc
            or s.blocks.on_free != fresh.blocks.on_free):
        return "engine.scheduler"
    return None


@atexit.register
def close_engines() -> None:
    """Close every shared engine and forget it with its books: the next check builds its own.
    The judge calls it after the submission's cells: an engine they built (``pool.Engine`` or a
    piece of the toy swapped for one ``engine()`` call, then put back) was "as built" for
    :func:`heal`, and the check ran the answer on it (round thirteen)."""
    for shared in list(_ENGINES.values()):
        _retire(shared)
    for books in (_ENGINES, _CONFIGS, _BUILT, _PRINTS, _DEVICES):
        books.clear()  # after the closes: an engine a learner's close() built is dropped too


def names_of(shared: Engine) -> dict[str, tuple]:
    """A shared engine's instance attributes, and its scheduler's and KV blocks' (grading round
    48: a plug-in's ``engine.scheduler.free = guard`` hid exercise 05's early free and scored
    4/4), before a check's run: ``"engine."`` -> (the object, its names)."""
    scheduler = shared.scheduler
    return {f"engine.{where}": (obj, set(vars(obj))) for where, obj in (
        ("", shared), ("scheduler.", scheduler), ("scheduler.blocks.", scheduler.blocks))}


def forget_edits(before: dict[str, tuple]) -> None:
    """Undo what a learner's code added to a shared engine (``names_of``) in a check's run, over
    a method (``engine.process_outputs = ...``, refused) or a new name (``engine.last_out =
    ...``): a later check runs on the engine as built, and :func:`heal` finds nothing to note."""
    for obj, names in before.values():
        for name in set(vars(obj)) - names:
            delattr(obj, name)


def shadowing(before: dict[str, tuple]) -> list[str]:
    """The instance attributes set since ``before`` (``names_of``) that hide a method of the
    engine's, its scheduler's or its KV blocks' (``engine.scheduler.free``)."""
    return sorted(f"{where}{n}" for where, (obj, names) in before.items()
                  for n in set(vars(obj)) - names if hasattr(type(obj), n))


def run_args(second: bool = False) -> dict:
    """``generate``'s arguments for a checker's run of PROMPTS: the main one, or exercise 02's second."""
    return dict(SECOND_RUN) if second else {"max_new_tokens": MAX_NEW_TOKENS}


def drafted(drafts: int) -> dict:
    """The engine configuration of a run with ``drafts`` drafts per round (0: the plain engine)."""
    return {"num_draft_tokens": drafts} if drafts else {}


def endings_label(drafts: int = 0) -> str:
    """The endings run, as a verdict names it."""
    with_drafts = f", {drafts} drafts per round" if drafts else ", no drafts"
    return (f"in the endings run (prompts {ENDINGS_PROMPTS} end on EOS, at the stop string "
            f"{ENDINGS_RUN['stop'][0]!r} or at the limit of {ENDINGS_RUN['max_new_tokens']} new "
            "tokens"
            f"{with_drafts})")


class Ended(typing.NamedTuple):
    """A reference completion, immutable: the learner's code can call the cache that holds it
    (round 15: a wrong loop edited ``pool.reference()``'s lists in place, and passed)."""

    prompt: str
    token_ids: tuple[int, ...]
    finish_reason: str
    text: str = ""


class SerialRun(typing.NamedTuple):
    """A checker's workload as the serial loop ran it: completions, each round's prompts."""

    ends: tuple[Ended, ...]
    rounds: tuple[tuple[int, ...], ...]

    @staticmethod
    def rounds_of(commits) -> tuple[tuple[int, ...], ...]:
        """Each round's prompts as its ``record.Commit`` handed them tokens (refused left out)."""
        return tuple(c.prompts for c in commits if not c.refused)


def serial_run(constraint: str | None = None, *, second=False, endings=False) -> SerialRun:
    """The serial loop's run of PROMPTS (constrained, or ex. 02's second) or the endings run."""
    return _serial_run(constraint, second, endings)  # one cache key however it is called


@functools.lru_cache(maxsize=4)
def _serial_run(constraint: str | None, second: bool, endings: bool) -> SerialRun:
    shared = engine(**({"constraint": constraint} if constraint else {}))
    prompts, args = (ENDINGS_PROMPTS, ENDINGS_RUN) if endings else (PROMPTS, run_args(second))
    outs = shared.generate(prompts, loop=loops.serial_loop, **args)
    return SerialRun(ended(outs), SerialRun.rounds_of(shared.record.of(Commit)))


def endings_reference() -> tuple[Ended, ...]:
    """The serial loop's completions of the endings run (the same with drafts or without)."""
    return serial_run(endings=True).ends


def ended(completions) -> tuple[Ended, ...]:
    """A reference run's completions, as a cache of the checker's keeps them."""
    return tuple(Ended(c.prompt, tuple(c.token_ids), c.finish_reason, c.text) for c in completions)


@functools.lru_cache(maxsize=3)
def reference(constraint: str | None = None, *, second: bool = False) -> tuple[tuple[int, ...]]:
    """The serial loop's tokens for PROMPTS (:func:`serial_run`), immutable (:class:`Ended`)."""
    return tuple(e.token_ids for e in serial_run(constraint, second=second).ends)


def compare(got, expected) -> str | None:
    """The first difference between two runs' token lists, in words; None if they are equal."""
    if len(got) != len(expected):
        return (f"the run returned {len(got)} completions for {len(expected)} prompts: every prompt must end with "
                f"one (did your code remove requests from `engine.requests`? it is the run's own list)")
    for i, (g, e) in enumerate(zip(map(list, got), map(list, expected))):
        if g == e:
            continue
        if e[: len(g)] == g:
            return f"prompt {i} lost its last {len(e) - len(g)} token(s)"
        first = next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
        return f"prompt {i} differs from the reference from its token {first} on"
    return None


def left_unfinished(outs, expected) -> str | None:
    """The first completion the engine ended "abort" (no run here aborts a request) because the
    learner's loop let its request go before it finished -- freed it, or returned -- in words;
    None if every request ran to its end.  Before: "lost its last 1 token(s)", naming no cause."""
    for i, (c, e) in enumerate(zip(outs, expected)):
        if c.finish_reason == "abort":
            return (f"prompt {i} never finished: your loop let it go with {len(c.token_ids)} of "
                    f"its {len(e)} tokens, and the engine ended it \"abort\". A request stays "
                    f"scheduled until it has finished: free only requests whose `req.finished` is "
                    f"true, and loop while `engine.scheduler.has_work()`")
    return None
