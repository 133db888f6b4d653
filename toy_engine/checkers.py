"""Checkers for the course's exercises.

Each ``check_*`` plugs a learner's code into the engine (race checker on), compares the
result with the reference engine, and returns a ``Verdict`` whose message says what went
wrong *in terms of the lesson* -- "request 2 lost its last token: the deferred step was
never flushed" -- never just "assertion failed".  A checker never raises for a learner's
mistake, so an exercise notebook runs top to bottom and shows the message.
"""

from __future__ import annotations

import atexit
import functools
from dataclasses import dataclass

import torch

from .device import RaceError
from .engine import Engine, EngineConfig, EngineStalled
from .kernels import FROM_DEVICE

PROMPTS = ["Once upon a time", "One day, the little", "There was a fox", "The bird said"]
MAX_NEW_TOKENS = 24


@dataclass
class Verdict:
    passed: bool
    message: str

    def __repr__(self) -> str:
        return ("PASSED: " if self.passed else "NOT YET: ") + self.message

    def __bool__(self) -> bool:
        return self.passed


def _not_implemented(what: str) -> Verdict:
    return Verdict(False, f"not implemented yet: fill in {what} (it still raises NotImplementedError)")


_ENGINES: dict = {}


def _engine(**config) -> Engine:
    """Small engines shared by all checks (starting a device takes a moment)."""
    key = tuple(sorted(config.items()))
    if key not in _ENGINES:
        _ENGINES[key] = Engine(EngineConfig(max_batch_size=3, race_check=True, **config))
    return _ENGINES[key]


@atexit.register
def close_engines() -> None:
    for engine in _ENGINES.values():
        engine.close()
    _ENGINES.clear()


@functools.lru_cache(maxsize=1)
def _reference():
    """The reference (serial engine) tokens for PROMPTS, computed once."""
    return [c.token_ids for c in _engine(mode="serial").generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS)]


def _compare(got, expected) -> str | None:
    """Describe the first difference between two runs' token lists in words."""
    for i, (g, e) in enumerate(zip(got, expected)):
        if g == e:
            continue
        if e[: len(g)] == g:
            return f"prompt {i} lost its last {len(e) - len(g)} token(s)"
        first = next((j for j, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
        return f"prompt {i} differs from the reference from its token {first} on"
    return None


def _run_loop(loop, mode: str, what: str, mismatch: str):
    """Run a learner's loop and compare its tokens with the reference.

    Returns (engine, Verdict) when something went wrong -- ``mismatch`` explains wrong
    tokens -- and (engine, None) when the run matched.
    """
    engine = _engine(mode=mode)
    try:
        outs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, loop=loop)
    except NotImplementedError:
        return engine, _not_implemented(what)
    except EngineStalled as err:
        lost = _compare([c.token_ids for c in engine.completions], _reference())
        if err.reason == "loop_returned_with_work":
            hint = "your loop returned while the scheduler still had work: loop while engine.scheduler.has_work()"
        elif mode == "zos":
            hint = ("the deferred step was never flushed: when nothing is left to launch, process "
                    "`previous` with engine.flush(previous)")
        else:
            hint = "every launched step must be waited for and processed (engine.process_outputs)"
        return engine, Verdict(False, f"{lost or 'results went missing'}: {hint}. ({err})")
    except RaceError as err:
        why = ""
        if err.kind == "buffer" and err.buffer.startswith(("meta", "temps")):
            why = ("an input buffer was reused while the step that reads it was never waited for: every "
                   "launched step must be waited for and processed (engine.process_outputs). ")
        return engine, Verdict(False, f"{why}The race checker stopped your loop: {err}")
    except Exception as err:  # noqa: BLE001 - turned into a message for the learner
        return engine, Verdict(False, f"your loop raised {type(err).__name__}: {err}")
    diff = _compare([c.token_ids for c in outs], _reference())
    return engine, Verdict(False, f"{diff}: {mismatch}") if diff else None


def _host_order(engine: Engine, keep=("launch_forward", "launch_sample", "postprocess", "flush")):
    return [(s.stage, s.round) for s in engine.timeline.lane("host") if s.stage in keep]


def check_serial_loop(loop) -> Verdict:
    """Exercise 2: ``loop(engine)`` runs the serial engine with the stage methods."""
    engine, verdict = _run_loop(loop, "serial", "`serial_loop`", "each round must prepare, launch forward, "
                                "launch sample, then process that step before the next round")
    if verdict is not None:
        return verdict
    return Verdict(True, f"the serial loop reproduces the reference: {len(PROMPTS)} prompts, "
                         f"{engine.stats['rounds']} rounds, every step processed before the next round")


def check_zos_loop(loop) -> Verdict:
    """Exercise 3: ``loop(engine)`` is the overlapped loop, flush included."""
    engine, verdict = _run_loop(loop, "zos", "`zos_loop`", "process every step exactly once, in round order")
    if verdict is not None:
        return verdict
    order = _host_order(engine, keep=("prepare", "launch_forward", "launch_sample", "postprocess", "flush"))
    prefill = set(engine.timeline.meta["prefill_rounds"])
    seen, deferred = set(), 0
    for stage, rnd in order:
        seen.add((stage, rnd))
        if stage != "postprocess" or rnd in prefill or ("prepare", rnd + 1) not in seen:
            continue  # not a deferred decode step (yet)
        if ("launch_forward", rnd + 1) not in seen:
            return Verdict(False, f"round {rnd}'s results were processed before round {rnd + 1}'s forward "
                                  f"was launched: the device sits idle while the host works. Launch this "
                                  f"round's forward first, then process the previous step")
        deferred += 1
    if not deferred:
        return Verdict(False, "no decode step was deferred: a decode round's StepState must be kept as "
                              "`previous` and processed during the next round, after its forward launch")
    if ("flush", max(r for s, r in order if s == "launch_sample")) not in seen:
        return Verdict(False, "the last round was not processed by engine.flush(previous)")
    return Verdict(True, f"ZOS loop matches the serial tokens; {deferred} decode steps were processed under "
                         f"the next round's forward, and the last one was flushed")


# ------------------------------------------------------------------ seqlen correction

def worked_case():
    """The notebook's worked case (block size 4, k = 2): three pending decode requests
    whose previous round accepted 1, 0 and 2 drafts.  Returns (meta, accepted, expected)."""
    meta = {
        "input_ids": torch.tensor([FROM_DEVICE] * 9),
        "positions": torch.tensor([6, 7, 8, 3, 4, 5, 10, 11, 12]),
        "slot_mapping": torch.tensor([30, 31, 4, 11, 16, 17, 34, 35, 20]),
        "seqlens_q": torch.tensor([3, 3, 3]),
        "seqlens_k": torch.tensor([9, 6, 13]),
        "rows": torch.tensor([0, 2, 5]),
        "pending": torch.tensor([1, 1, 1]),
        "block_tables": torch.tensor([[3, 7, 1, 0], [2, 4, 9, 0], [6, 0, 8, 5]]),
    }
    accepted = torch.tensor([1, 0, 0, 0, 0, 2, 0, 0])
    expected = {"seqlens_q": [3, 3, 3], "seqlens_k": [10, 6, 15],
                "positions": [7, 8, 9, 3, 4, 5, 12, 13, 14],
                "slot_mapping": [31, 4, 5, 11, 16, 17, 20, 21, 22]}
    return meta, accepted, expected


_WHY = {
    "seqlens_k": "the key length must grow by the accepted drafts of the in-flight round",
    "positions": "every query token moves right by the accepted drafts",
    "slot_mapping": "slots must be recomputed from the corrected positions through the block table",
    "seqlens_q": "query lengths must not change: a decode request always feeds 1 + k tokens",
}


def check_correction(correct_seqlens_qk) -> Verdict:
    """Exercise 4: ``correct_seqlens_qk(meta, accepted, block_size)`` fixes meta in place."""
    meta, accepted, expected = worked_case()
    try:
        correct_seqlens_qk(meta, accepted, 4)
    except NotImplementedError:
        return _not_implemented("`correct_seqlens_qk`")
    except Exception as err:  # noqa: BLE001
        return Verdict(False, f"your correction raised {type(err).__name__}: {err}")
    for name in ("seqlens_q", "seqlens_k", "positions", "slot_mapping"):
        got = meta[name].tolist()
        if got != expected[name]:
            stale = worked_case()[0][name].tolist()
            state = " (still the host's stale values)" if got == stale else ""
            return Verdict(False, f"{name} is {got}, expected {expected[name]}{state}: {_WHY[name]}")
    engine = _engine(mode="zos", num_draft_tokens=3)
    try:
        outs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, correction=correct_seqlens_qk)
    except Exception as err:  # noqa: BLE001
        return Verdict(False, f"in the engine your correction failed: {type(err).__name__}: {err}")
    diff = _compare([c.token_ids for c in outs], _reference())
    if diff:
        return Verdict(False, f"with your correction in ZOS + speculation, {diff}")
    return Verdict(True, f"the worked case is right and ZOS + speculation (k=3) matches plain greedy decoding; "
                         f"{engine.stats['mean_accepted_per_round']:.2f} drafts accepted per request-round")


CORRECTED = {"seqlens_k", "positions", "slot_mapping", "input_ids"}
UNCHANGED = {"seqlens_q", "cu_seqlens_q", "block_tables", "rows"}


def check_metadata_answer(answer) -> Verdict:
    """Try-it: which metadata must be corrected when the previous round accepted one draft?"""
    if answer is None or answer is NotImplemented:
        return _not_implemented("the set of field names")
    answer = {str(a) for a in answer}
    unknown = answer - CORRECTED - UNCHANGED
    if unknown:
        return Verdict(False, f"not a metadata field of the batch: {sorted(unknown)}; choose from "
                              f"{sorted(CORRECTED | UNCHANGED)}")
    missing, extra = CORRECTED - answer, answer & UNCHANGED
    if missing:
        return Verdict(False, f"also stale: {sorted(missing)} (hint: what depends on where the sequence ends?)")
    if extra:
        return Verdict(False, f"{sorted(extra)} do not change: each decode request still feeds 1 + k tokens "
                              f"and its blocks were reserved at admission")
    return Verdict(True, "seqlens_k, positions and slot_mapping shift by the accepted count; input_ids take "
                         "the bonus token and new drafts from the device")


# ------------------------------------------------------------------ three rounds

def expected_three_rounds() -> list[tuple[str, int]]:
    """What the host issues in a ZOS run of one prefill and three decode rounds."""
    engine = _engine(mode="zos")
    engine.generate(["Once upon a time"], max_new_tokens=4)
    order = []
    for stage, rnd in _host_order(engine):
        if rnd == 0:
            continue  # the prefill round
        order.append(({"launch_forward": "forward", "launch_sample": "sample"}.get(stage, stage), rnd))
    return order


def check_three_rounds(order) -> Verdict:
    """Try-it: the order of forward / sample / postprocess / flush for decode rounds 1-3."""
    if order is None or order is NotImplemented:
        return _not_implemented("the list of (stage, round) pairs")
    expected = expected_three_rounds()
    order = [tuple(x) for x in order]
    if order == expected:
        return Verdict(True, "that is the order the engine just recorded: " +
                       ", ".join(f"{s} {r}" for s, r in expected))
    for i, (got, want) in enumerate(zip(order, expected)):
        if got != want:
            why = ""
            if want[0] == "postprocess" and got[0] == "sample":
                why = ": the previous step is processed after this forward is launched, before this sample"
            elif want[0] == "flush":
                why = ": the last round has no next round to hide under, so it is flushed"
            return Verdict(False, f"step {i}: you wrote {got}, the engine did {want}{why}")
    return Verdict(False, f"you listed {len(order)} steps, the engine did {len(expected)}")


# ------------------------------------------------------------------ ownership / lifetime

def check_process_outputs(process_outputs) -> Verdict:
    """Exercise 5: ``process_outputs(engine, step)`` waits, reads, commits and frees."""
    engine = _engine(mode="zos")
    reference = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, stop=[" the"])
    try:
        outs = engine.generate(PROMPTS, max_new_tokens=MAX_NEW_TOKENS, stop=[" the"],
                               process_outputs=process_outputs)
    except NotImplementedError:
        return _not_implemented("`process_outputs`")
    except EngineStalled as err:
        return Verdict(False, f"prompts {err.prompt_indexes} finished but kept their KV blocks and batch rows, so "
                              f"waiting requests could never start: free a finished request once no launched "
                              f"round uses it (req.num_inflight == 0)")
    except RaceError as err:
        if err.kind == "buffer" and err.buffer.startswith("out"):
            why = ("you read the step's sampled tokens before waiting on its completion event "
                   "(step.sample_done): the device may still be writing them")
        elif err.kind == "free_in_use":
            why = ("you freed a finished request's KV cache while a launched round still uses it "
                   "(the extra step): free only when req.num_inflight == 0")
        else:
            why = "see the race report"
        return Verdict(False, f"{why}. Race checker: {err}")
    except Exception as err:  # noqa: BLE001
        return Verdict(False, f"your process_outputs raised {type(err).__name__}: {err}")
    if [c.token_ids for c in outs] != [c.token_ids for c in reference]:
        return Verdict(False, _compare([c.token_ids for c in outs], [c.token_ids for c in reference]) +
                       ": commit every step's tokens exactly once")
    leaked = [r.index for r in engine.requests if r.blocks]
    if leaked or engine.scheduler.running:
        return Verdict(False, f"prompts {leaked} finished but kept their KV blocks: free them once no "
                              f"launched round uses them")
    return Verdict(True, "results are read only after their event, and caches are freed only when no "
                         "launched round can touch them")
