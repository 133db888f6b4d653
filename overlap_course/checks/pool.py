"""The engines the exercise checkers run a learner's code on, and the reference runs they
compare it with.

Starting a device is the slow part of a first check, so there are few engines, shared by
every check and kept whole between checks (:func:`heal`): one per configuration, on one
loaded model.  A serial run is a ZOS-mode engine given ``loop=loops.serial_loop`` (the mode
only picks the default loop).  Start-up times are in docs/measurements/checks.md.
"""

from __future__ import annotations

import atexit
import functools
from concurrent.futures import ThreadPoolExecutor

from toy_engine.data import CharTokenizer
from toy_engine.config import EngineConfig
from toy_engine import loops
from toy_engine.engine import Engine
from toy_engine.model import load_model

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


@functools.lru_cache(maxsize=1)
def _model():
    return load_model()


def engine(**config) -> Engine:
    """The shared engine of this configuration (ZOS mode, batches of 3, race checker on)."""
    key = tuple(sorted(config.items()))
    if key not in _ENGINES:
        model, alphabet = _model()
        _ENGINES[key] = Engine(EngineConfig(mode="zos", max_batch_size=3, race_check=True, **config),
                               model=model, tokenizer=CharTokenizer(alphabet))
        _CONFIGS[key] = _ENGINES[key].config
    return _ENGINES[key]


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
    on, and a cache pool with each block exactly once.  Returns what had to be put back."""
    changed = []
    for key, shared in list(_ENGINES.items()):
        if shared.config is not _CONFIGS[key]:
            changed.append("engine.config")
            shared.config = _CONFIGS[key]
        if not shared.device.races.enabled:
            changed.append("engine.device.races.enabled")
            shared.device.races.enabled = True
        free, n = shared.scheduler.blocks.free_ids, shared.config.num_kv_blocks
        if shared.device.failure() or sorted(free) != list(range(n)) or shared.scheduler.has_work():
            changed.append(f"the shared engine's KV pool ({len(free)} free blocks of {n}; a fresh engine was started)")
            _ENGINES.pop(key).close()
            engine(**dict(key))
    return changed


@atexit.register
def close_engines() -> None:
    for shared in _ENGINES.values():
        shared.close()
    _ENGINES.clear()


def forget_edits(shared: Engine, attributes: set[str]) -> None:
    """Undo what a learner's code set on a shared engine over one of its methods (e.g.
    ``engine.process_outputs = ...`` inside a plug-in), so that a later check runs on the
    engine it expects.  (A run's own new attributes, ``stats``, ``completions``, stay.)"""
    for name in shadowing(shared, attributes):
        delattr(shared, name)


def shadowing(shared: Engine, attributes: set[str]) -> list[str]:
    """The instance attributes set since ``attributes`` that hide one of the engine's methods."""
    return sorted(n for n in set(vars(shared)) - attributes if hasattr(type(shared), n))


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


@functools.lru_cache(maxsize=1)
def endings_reference() -> tuple:
    """The serial loop's completions of the endings run (greedy: the same with drafts or
    without)."""
    return tuple(engine().generate(ENDINGS_PROMPTS, loop=loops.serial_loop, **ENDINGS_RUN))


@functools.lru_cache(maxsize=3)
def reference(constraint: str | None = None, *, second: bool = False) -> list[list[int]]:
    """The serial loop's tokens for PROMPTS (greedy, optionally constrained, or the second
    run's stop strings), computed once (call it as ``reference()`` for the plain run: the cache
    keys on how it is called)."""
    shared = engine(**({"constraint": constraint} if constraint else {}))
    outs = shared.generate(PROMPTS, loop=loops.serial_loop, **run_args(second))
    return [c.token_ids for c in outs]


def compare(got, expected) -> str | None:
    """The first difference between two runs' token lists, in words; None if they are equal."""
    if len(got) != len(expected):
        return (f"the run returned {len(got)} completions for {len(expected)} prompts: every prompt must end with "
                f"one (did your code remove requests from `engine.requests`? it is the run's own list)")
    for i, (g, e) in enumerate(zip(got, expected)):
        if g == e:
            continue
        if e[: len(g)] == g:
            return f"prompt {i} lost its last {len(e) - len(g)} token(s)"
        first = next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
        return f"prompt {i} differs from the reference from its token {first} on"
    return None
