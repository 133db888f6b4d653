"""Exercise 05's runs (a stop string and the limit; the endings run without and with drafts; an
abort of a request whose round is in flight, without and with drafts), the engine's own
completions of each, and the messages that name how a run's requests ended."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from toy_engine.engine import Engine
from toy_engine.record import Launch
from toy_engine.buffers import BadOutputs
from toy_engine.run import EngineStalled

from . import endings, pool
from .errors import said
from .learner_code import StepWatch
from .verdict import Verdict, fails


@dataclass(frozen=True)
class Run:
    """One run exercise 05's checker makes with the learner's process_outputs."""

    label: str
    prompts: tuple
    args: tuple  # generate's keyword arguments, as pairs
    drafts: int = 0
    # (round, prompt): abort that prompt just before that round is scheduled
    abort: tuple | None = None


STOP_RUN = dict(max_new_tokens=pool.MAX_NEW_TOKENS, stop=(" the",))
# The main run (a stop string, the limit), the endings run without and with drafts, and aborts of a
# request whose round is in flight (round 4, prompt 1), without and with drafts.
_IN_FLIGHT = "prompt 1 aborted just before round 4, while round 3 holds it"
RUNS = (Run("", tuple(pool.PROMPTS), tuple(STOP_RUN.items())),
        Run(pool.endings_label(0), tuple(pool.ENDINGS_PROMPTS), tuple(pool.ENDINGS_RUN.items())),
        Run(pool.endings_label(pool.DRAFTS), tuple(pool.ENDINGS_PROMPTS),
            tuple(pool.ENDINGS_RUN.items()), pool.DRAFTS),
        Run(f"in the abort run ({_IN_FLIGHT})", tuple(pool.PROMPTS), (("max_new_tokens", 12),),
            abort=(4, 1)),
        Run(f"in the abort run with {pool.DRAFTS} drafts per round ({_IN_FLIGHT})",
            tuple(pool.PROMPTS), (("max_new_tokens", 12),), pool.DRAFTS, (4, 1)))


def aborter(abort):
    def on_round(engine, rnd):
        if rnd == abort[0]:
            engine.abort(engine.requests[abort[1]].id)
    return on_round if abort else None


def run_engine(run: Run) -> Engine:
    return pool.engine(**pool.drafted(run.drafts))


@functools.lru_cache(maxsize=len(RUNS))
def completions(run: Run) -> tuple:
    """The engine's own process_outputs on this run: its completions."""
    return tuple(run_engine(run).generate(list(run.prompts), on_round=aborter(run.abort),
                                           **dict(run.args)))


def warm() -> None:
    pool.start({}, {"num_draft_tokens": pool.DRAFTS})
    for run in RUNS:
        completions(run)


def ended(reqs) -> str:
    """Finished requests and how each ended, for a message."""
    how = {"eos": "on EOS (its story ended)", "stop": "at a stop string", "length": "at its limit",
           "abort": "by an abort"}
    return "; ".join(f"prompt {r.index} ({r.prompt!r}) ended "
                     f"{how.get(r.finish_reason, 'unfinished')} after "
                     f"{len(r.output_ids)} tokens" for r in reqs[:3])


def kept(blocks: bool, row: bool) -> str:
    """What a finished request kept that a free gives back: its KV blocks, its batch row or both
    (a hand-written free may give back one of them)."""
    if blocks and row:
        return "its KV blocks and batch row"
    if blocks:
        return "its KV blocks (its batch row was given back, its blocks never were)"
    return ("its batch row: it stays in `engine.scheduler.running`, though its KV blocks went "
            "back")


def waited_too_long(mistake: Verdict, engine: Engine, watch: StepWatch) -> Verdict:
    """A wait on a later event than the step's own: the tokens are right, so say what it waited for,
    read from the run's record (what the host waited on does not depend on how busy the machine
    is)."""
    clock = engine.timeline.ns_to_ms
    forwards = {lnch.round: (lnch.seq, clock(lnch.t_ns)) for lnch in engine.record.of(Launch)
                if lnch.stage == "forward"}
    steps = covered = 0
    for call in watch.calls:
        rnd = call["step"].plan.round
        if call["step"].plan.is_prefill or rnd + 1 not in forwards or not call["waits"]:
            continue
        seq, launched_ms = forwards[rnd + 1]
        if launched_ms <= call["waits"][0][1]:  # a deferred step: the next forward went in first
            steps += 1
            covered += max(w[0] for w in call["waits"]) >= seq
    mistake.message = (
        f"{mistake.message}: your process_outputs waited on an event recorded after the step's sample "
        f"(`engine.device.synchronize()`, or a freshly recorded event) instead of `step.sample_done`. The "
        f"tokens are right, but the host now also waits for the next round's forward before it commits: in "
        f"this run {covered} of {steps} deferred decode steps waited for the next round's forward "
        "too (their "
        "wait came after that forward's launch, so nothing was left to hide the commit under; "
        "the engine's "
        "own process_outputs waits for none). Wait on exactly `step.sample_done`: it covers the "
        "step's "
        f"sample and nothing after it")
    return mistake


def stalled(err: EngineStalled, engine: Engine, reference) -> Verdict:
    """The run could not go on: name the prompts, how they should have ended and where they
    stopped."""
    reqs = engine._run.requests
    if err.reason == "finished_kept_blocks":
        stuck = [reqs[i] for i in err.prompt_indexes]
        held = kept(any(r.blocks for r in stuck), any(r in engine.scheduler.running for r in stuck))
        return fails("kept_blocks",
                     "the engine could not go on: "
                     f"{ended(stuck)}, but "
                     f"your process_outputs kept {held}, so the run could "
                     "not end. A "
                     "request finishes at its limit, at a stop string, on EOS or by an abort: "
                     "free every "
                     "finished request once no launched round uses it "
                     "(`engine.scheduler.release_if_done(req)`)")
    return fails("stalled", f"the engine could not go on ({err.reason}: "
                            f"{endings.stopped_at(reqs, reference, err.prompt_indexes)}): {err}")


def bad_outputs(err: BadOutputs, who: str, call: dict) -> Verdict:
    """``commit_outputs`` refused the ``out`` of a watched ``call`` (a short list is named by
    what it lacks): notebook 05 reads them with "`engine.read_outputs(step)` | the round's sampled
    tokens from its output slot, as a list" and commits that list whole ("hand the tokens to the
    round's requests")."""
    if err.length is None or err.length >= err.expected:
        return fails("bad_outputs", f"{who}: `engine.commit_outputs` refused what your "
                                    f"process_outputs gave it: {said(err)}. Commit the list "
                                    f"`engine.read_outputs(step)` returns, whole")
    n = len(call["requests"])
    counts = max(0, min(n, err.length - (err.expected - n)))  # the accepted counts come last
    held = (f"only the accepted counts of {counts} of the round's {n} requests" if counts else
            "none of the accepted counts, which follow the tokens")
    return fails("short_commit",
                 f"{who}: the token list your process_outputs committed has {err.length} values "
                 f"where the round needs {err.expected}: it holds {held}, so the engine refused "
                 f"it. Commit the whole list `engine.read_outputs(step)` returns: "
                 f"`engine.commit_outputs(step, out)`")


def whole_again(engine: Engine) -> None:
    """A pool the learner's run left short (its verdict says so) is made whole at once: left for
    the next check's heal, it would be reported as an earlier cell's change."""
    try:
        short = len(engine.scheduler.blocks.free_ids) != engine.config.num_kv_blocks
    except Exception:  # noqa: BLE001 - a learner's junk where the pool was: heal replaces it
        short = True
    if short:
        pool.heal()


def lost_blocks(engine: Engine, watch: StepWatch) -> Verdict | None:
    """Blocks the run ended without, held by no request: freed requests whose ``req.blocks``
    was changed before the free (``free`` gives back the blocks the list names then)."""
    lost = sorted(set(range(engine.config.num_kv_blocks))
                  - set(engine.scheduler.blocks.free_ids))
    if not lost:
        return None
    owners = sorted({watch.held[b] for b in lost if b in watch.held})
    return fails("kept_blocks",
                 f"after the run {len(lost)} KV block(s) never came back to the pool (blocks "
                 f"{lost[:12]}{' ...' if len(lost) > 12 else ''}, held by prompt(s) {owners}), "
                 f"though no request holds them any more: `engine.scheduler.free(req)` gives "
                 f"back the blocks `req.blocks` lists at that moment, so a list emptied or "
                 f"shortened before the free loses them for good, and waiting requests run out "
                 f"of cache. Leave `req.blocks` as the engine set it and free the request once")
