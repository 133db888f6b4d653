"""Exercise 05's runs (a stop string and the limit; the endings run without and with drafts; an
abort of a request whose round is in flight, without and with drafts), the engine's own
completions of each, and the messages that name how a run's requests ended."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from toy_engine.engine import Engine
from toy_engine.record import Launch
from toy_engine.buffers import BadOutputs
from toy_engine.refusals import EndTakenBack, HandedBeside, OtherTokens
from toy_engine.run import EngineStalled

from . import endings, pool
from .answers import show
from .errors import engines, said
from .step_watch import UNKNOWN, StepWatch
from .verdict import Verdict, counted, fails


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
# The main run (a stop string, the limit), the endings run without and with drafts, aborts of a
# request whose round is in flight (round 4, prompt 1), without and with drafts, and a run whose
# first two requests end with their first token (EOS, the stop string ","), so they keep no token
# and code that frees only requests with tokens stalls the two that wait.
_IN_FLIGHT = "prompt 1 aborted just before round 4, while round 3 holds it"
_NO_TOKEN = ("Mia smiled.\nAnd they all lived happily ever after.", "Once upon a time",
             "One day, the little", "There was a fox", "The bird said")
_NO_TOKEN_RUN = (("max_new_tokens", 8), ("stop", (",",)))
RUNS = (Run("", tuple(pool.PROMPTS), tuple(STOP_RUN.items())),
        Run(pool.endings_label(0), tuple(pool.ENDINGS_PROMPTS), tuple(pool.ENDINGS_RUN.items())),
        Run(pool.endings_label(pool.DRAFTS), tuple(pool.ENDINGS_PROMPTS),
            tuple(pool.ENDINGS_RUN.items()), pool.DRAFTS),
        Run(f"in the abort run ({_IN_FLIGHT})", tuple(pool.PROMPTS), (("max_new_tokens", 12),),
            abort=(4, 1)),
        Run(f"in the abort run with {pool.DRAFTS} drafts per round ({_IN_FLIGHT})",
            tuple(pool.PROMPTS), (("max_new_tokens", 12),), pool.DRAFTS, (4, 1)),
        Run(f"in the no-token run (prompts {list(_NO_TOKEN)}: the first two end with their "
            "first token, on EOS and at the stop string ',')", _NO_TOKEN, _NO_TOKEN_RUN))


def aborter(abort):
    def on_round(engine, rnd):
        if rnd == abort[0]:
            engine.abort(engine.requests[abort[1]].id)
    return on_round if abort else None


def run_engine(run: Run) -> Engine:
    return pool.engine(**pool.drafted(run.drafts))


@functools.lru_cache(maxsize=len(RUNS))
def completions(run: Run) -> tuple:
    """The engine's own process_outputs on this run: its completions (immutable:
    ``pool.Ended``)."""
    return pool.ended(run_engine(run).generate(list(run.prompts), on_round=aborter(run.abort),
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
                     f"{how.get(r.finish_reason, 'unfinished')} {_kept_tokens(r)}"
                     for r in reqs[:3])


def _kept_tokens(req) -> str:
    """How many tokens a request kept: none where its first token was EOS or ended a stop string."""
    if req.output_ids or req.finish_reason not in ("eos", "stop"):
        return f"after {counted(len(req.output_ids), 'token')}"
    return "with its first token, so it kept no token"


def kept(blocks: bool, row: bool) -> str:
    """What a finished request kept that a free gives back: its KV blocks, its batch row or both
    (a hand-written free may give back one of them)."""
    if blocks and row:
        return "its KV blocks and batch row"
    if blocks:
        return "its KV blocks (its batch row was given back, its blocks never were)"
    return "its batch row: it stays in `engine.scheduler.running`, though its KV blocks went back"


_LATER = ("an event recorded after the step's sample (`engine.device.synchronize()`, or a "
          "freshly recorded event)")


def waited_too_long(mistake: Verdict, engine: Engine, watch: StepWatch) -> Verdict:
    """A wait on a later event than the step's own: the tokens are right, so say what the named
    call did and what it cost, read from the run's record (its waits, in order with its
    commit), not from which function it called; the cost does not depend on how busy the
    machine is."""
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
    did, cost, fix = _later_wait(next(c for c in watch.calls if _waits_later(c)), clock)
    mistake.message = (f"{mistake.message}: your process_outputs {did}. The tokens are right, but "
                       f"{cost}: in this run {covered} of {steps} deferred decode steps waited "
                       f"for the next round's forward too (the engine's own process_outputs "
                       f"waits for none). {fix}")
    return mistake


def _waits_later(call: dict) -> bool:
    return any(seq > call["step"].sample_done.seq for seq, _, _, _ in call["waits"])


def _later_wait(call: dict, clock) -> tuple[str, str, str]:
    """What one call did (did it also wait on its own event; did the later wait come before or
    after its commit), what that cost and the fix, each as the message words it."""
    own = any(seq == call["step"].sample_done.seq for seq, _, _, _ in call["waits"])
    later = next(start for seq, start, _, _ in call["waits"] if seq > call["step"].sample_done.seq)
    if call["commits"] and clock(call["commits"][0].t_ns) < later:
        did = ("waited on `step.sample_done`, committed the step, then waited again, on "
               if own else "committed the step, then waited on ")
        return (did + _LATER, "that extra wait also waits for the next round's forward, so the "
                "host stands idle until the forward ends instead of queueing the round's sample "
                "behind it and preparing the next round while the device works",
                "Drop the extra wait: `step.sample_done` alone covers what the step needs")
    did = (f"waited on `step.sample_done` and also, before it committed, on {_LATER}" if own
           else f"waited on {_LATER} instead of `step.sample_done`")
    return (did, "the host now also waits for the next round's forward before it commits, so "
            "nothing is left to hide the commit under", "Wait on exactly `step.sample_done`: it "
            "covers the step's sample and nothing after it")


def stalled(err: EngineStalled, engine: Engine, reference) -> Verdict:
    """The run could not go on: name the prompts, how they should have ended and where they
    stopped."""
    reqs = engine._run.requests
    if err.reason == "finished_kept_blocks":
        stuck = [reqs[i] for i in err.prompt_indexes]
        held = kept(any(r.blocks for r in stuck), any(r in engine.scheduler.running for r in stuck))
        return fails("kept_blocks",
                     f"the engine could not go on: {ended(stuck)}, but your process_outputs kept "
                     f"{held}, so the run could not end. A request finishes at its limit, at a "
                     "stop string, on EOS or by an abort: free every finished request once no "
                     "launched round uses it (`engine.scheduler.release_if_done(req)`)")
    return fails("stalled", f"the engine could not go on ("
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


_STEPS = ("Do the steps yourself: `engine.device.wait(step.sample_done)`, "
          "`engine.read_outputs(step)`, `engine.commit_outputs(step, out)`, then free what is "
          "finished")


def stage_called(stage: str, refused: bool = True) -> Verdict:
    """A round's stage the learner's process_outputs called (the engine refused it,
    ``StageInPlugin``; not ``refused``: Python's RecursionError stopped it), named as called,
    with why: ``process_outputs`` and ``flush`` run the learner's function on the step again;
    the others plan or launch a round that no loop processes (blind round 25:
    ``engine.schedule()`` was told it "would process the step again")."""
    if stage in ("process_outputs", "flush"):
        via = " (`flush` processes the step through `process_outputs`)" if stage == "flush" else ""
        end = ("would run your function again on a step it is processing, and the engine "
               "refused it" if refused else "ran your function again, and each call started "
               "another one until Python gave up (RecursionError)")
        return fails("calls_itself",
                     f"your process_outputs called `engine.{stage}`{via}: in this run the "
                     "engine's `process_outputs` calls *your* function (that is how it is "
                     f"plugged in), so that call {end}. {_STEPS}")
    called = "`engine.schedule()`" if stage == "schedule" else f"`engine.{stage}`"
    return fails("calls_stage",
                 f"your process_outputs called {called}: only the run's loop calls a round's "
                 "stages (here the engine's own, which calls your function with each step), and "
                 "one called from inside a results step would plan or launch a round that loop "
                 "never processes, so the engine refused it. A results step waits, reads, "
                 "commits and frees, nothing more; to see what runs next, read "
                 "`engine.scheduler.waiting` and `engine.scheduler.running`")


def refused_tokens(err, who: str) -> Verdict | None:
    """The engine's refusal of tokens the learner's process_outputs handed out beside
    ``commit_outputs`` or gave it changed, or of a finished request set back to unfinished, in
    the lesson's words (blind round 25: the refusals' class names and the watch's own name were
    the verdict); None for any other error."""
    took = engines(err, HandedBeside) and len(err.handed) - len(err.holds)  # < 0: appended
    if engines(err, HandedBeside) and not err.before and took >= 0:  # taken back, or replaced
        did = f"took {counted(took, 'token')} back off" if took else "replaced a token of"
        return fails("tokens_beside", f"{who}: after `engine.commit_outputs(step, out)` had set "
                     f"prompt {err.prompt}'s `req.output_ids`, your process_outputs {did} it (the "
                     "engine refused it): a committed token stays (the device's cache holds it, "
                     "the next round sends the newest). Leave it as the commit set it")
    if engines(err, HandedBeside):
        return fails("tokens_beside",
                     f"{who}: your process_outputs committed the step with "
                     f"`engine.commit_outputs(step, out)`, which handed prompt {err.prompt} the "
                     f"tokens {show(err.handed)}, but after your process_outputs its "
                     f"`req.output_ids` holds {show(err.holds)} from that round (the engine "
                     "refused it): `commit_outputs` already appends each token the round kept "
                     "(and ends the request where it ends). Do not append them again, nor other "
                     "tokens, before or after the call")
    if engines(err, OtherTokens):  # one committed by hand is judged before: never_committed
        sampled = "at least one token" if err.sampled is None else show(err.sampled)
        did = (f"gave `engine.commit_outputs` outputs that keep {show(err.given)} for prompt "
               f"{err.prompt}, where the round sampled {sampled}")
        return fails("wrong_tokens",
                     f"{who}: your process_outputs {did} (the engine refused it): the device "
                     "goes on from the tokens it sampled (under ZOS it has already fed them to "
                     "the next round), so other tokens give a text the model never produced. "
                     "Commit the list `engine.read_outputs(step)` returns, unchanged")
    if engines(err, EndTakenBack):
        return fails("overwrote_finish",
                     f"{who}: your process_outputs set prompt {err.prompt}'s `req.finish_reason` "
                     f"back from {err.was!r} to None (the engine refused it): a request ends "
                     "exactly once, and generate returns it as it ended. Leave a finished "
                     "request's finish_reason as it is: one whose extra step is still in flight "
                     "(`req.num_inflight > 0`) is freed when that step is processed")
    return None


def reason_mistake(call: dict, who: str, reference) -> Verdict | None:
    """A finish_reason the learner's process_outputs set (StepWatch's ``reasons``): in a call
    only ``commit_outputs`` ends a request, where its tokens end it, and no code changes a
    finished one's reason, which generate returns (blind round 24: "abort" on a request whose
    extra step was in flight passed; "length" on one with no round in flight was told to commit
    its tokens once).  ``reference``: the engine's own completions of the run."""
    for req, before, after, by_commit, ids in call["reasons"]:
        if by_commit in (after, UNKNOWN):
            continue
        want, keeps = reference[req.index], "a finished request keeps the reason it ended with"
        if before is not None or by_commit is not None:
            did = (f"changed prompt {req.index}'s finish_reason from {before!r} to {after!r}"
                   if before is not None else f"set prompt {req.index}'s finish_reason to "
                   f"{after!r} after `commit_outputs` had ended it with {by_commit!r}")
            flight = (" (one whose extra step is still in flight is freed when that step is "
                      "processed)" if call["states"][req.index][0] else "")
            return fails("overwrote_finish",
                         f"{who}: your process_outputs {did}: {keeps}, which generate returns "
                         f"({want.finish_reason!r} here). Leave it, and free a finished request "
                         f"once `num_inflight == 0`{flight}")
        got = counted(len(ids), "token") if ids is not None else "its tokens"
        stop = req.stop[0] if want.finish_reason == "stop" else ""  # a token per character
        taken = f", then takes the {len(stop)} of its stop string {stop!r} back off" if stop else ""
        reference_end = (f"the engine's own process_outputs goes on committing until it ends "
                         f"{want.finish_reason!r}, with "
                         f"{counted(len(want.token_ids) + len(stop), 'token')}{taken}")
        if after == "abort":
            return fails("ended_unfinished", _aborted(who, req.index, got, reference_end))
        return fails("ended_unfinished",
                     f"{who}: your process_outputs set prompt {req.index}'s finish_reason to "
                     f"{after!r} after {got}, though `commit_outputs` had left it unfinished: "
                     f"that ended it early ({reference_end}). A request ends where "
                     f"`commit_outputs` ends it (its limit, a stop string, EOS), or where its "
                     f"user aborts it: leave `finish_reason` to them, and free a request only "
                     f"once `req.finished` and `req.num_inflight == 0`")
    return None


def _aborted(who: str, prompt: int, got: str, reference_end: str) -> str:
    """A request the learner's process_outputs aborted, by ``engine.abort(req.id)`` or a write
    of "abort" (the watch sees the reason, not which): a results step ends no request, and an
    abort comes from outside it (blind round 25: told it had set the reason, and that "an
    abort" was a right way to end)."""
    return (f"{who}: your process_outputs aborted prompt {prompt} after {got} (its "
            f"finish_reason became 'abort', as `engine.abort(req.id)` sets it), though "
            f"`commit_outputs` had left it unfinished: that ended it early ({reference_end}). "
            f"A results step ends no request: it waits, reads, commits and frees. An abort is "
            f"its user's call, made from outside (a client; this check's abort runs make one "
            f"from `on_round`), and what your process_outputs does with an aborted request is "
            f"free it once `req.num_inflight == 0`")


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


_BLOCKS, _ROWS = "`engine.scheduler.blocks.free_ids`", "`engine.scheduler.free_rows`"


# Why a request is still in a launched round when a learner's code gives its cache back
_IN_ROUND = {"process_outputs": " (the extra step: under ZOS the finished request is already "
                                "in the next launched round)",
             "abort": " (an aborted request stays in the rounds already launched until they "
                      "are processed)"}


def pool_mistake(call: dict, who: str, code: str = "process_outputs",
                 waited: bool = False) -> Verdict | None:
    """The pool after one call of the learner's ``code`` (process_outputs, watched by StepWatch;
    an abort, by ``lab_runs.abort_run``), whatever code gave blocks or rows back (``free``, or
    writes to ``free_ids``/``free_rows`` the race checker never sees): each entry a real block
    or row and there once, none a launched round still uses, none a request still lists.
    ``waited``: the call waited for the device itself; a free that wait left no launch under
    is no race, and the caller names the wait (blind round 22)."""
    if call["pool"] is None or call.get("pool_after") is None:
        return None  # junk where the pool was: the run's exception is judged, the pool healed
    (blocks0, rows0), (blocks1, rows1) = call["pool"], call["pool_after"]
    for what, where, ids, n in (("KV block", _BLOCKS, blocks1, call["sizes"][0]),
                                ("batch row", _ROWS, rows1, call["sizes"][1])):
        junk = [x for x in ids if type(x) is not int or not 0 <= x < n]
        if junk:
            return fails("pool_junk", f"{who}: after your {code} {where} holds "
                                      f"{show(junk[0])}, which is no {what} (they are 0 to "
                                      f"{n - 1}). Give a finished request back with "
                                      "`engine.scheduler.free(req)`, not by writing the pool")
        twice = sorted(x for x, k in Counter(ids).items() if k > 1)
        if twice:
            return fails("double_free", f"{who}: after your {code} {where} holds "
                                        f"{what}(s) {twice[:12]} twice ({len(ids)} entries for "
                                        f"{len(set(ids))} distinct ones): each was given back a "
                                        "second time, and the pool would hand it to two "
                                        "requests. Give each finished request back once, with "
                                        "`engine.scheduler.release_if_done(req)`")
    early = _early_in_pool(call, who, set(blocks1) - set(blocks0), set(rows1) - set(rows0), code,
                           waited)
    return early if early is not None else _claimed_in_pool(call, who, blocks1)


def _early_in_pool(call: dict, who: str, blocks: set, rows: set, code: str,
                   waited: bool) -> Verdict | None:
    """Blocks or rows that came back during the call from a request a launched round uses (none
    still running after the call's own wait: nothing raced, the wait is the mistake)."""
    (holders, row_holders), states = call["claims"], call["states"]
    early = [(b, holders[b]) for b in sorted(blocks) if b in holders and states[holders[b]][0]]
    gone = "KV cache of prompt(s) {} (blocks {}) back to the pool (" + _BLOCKS + ")"
    if not early:
        early = [(r, row_holders[r]) for r in sorted(rows)
                 if r in row_holders and states[row_holders[r]][0]]
        gone = "batch row of prompt(s) {} (rows {}) back to " + _ROWS
    if not early:
        return None
    prompts = sorted({p for _, p in early})
    used = {b for b, p in holders.items() if p in prompts}  # as held before the call
    in_use = [(lnch.round, lnch.stage) for lnch in call["outstanding"] if lnch.blocks & used]
    if waited and not in_use:
        return None
    user = (f"round {in_use[0][0]}'s `{in_use[0][1]}`, launched and not yet waited for," if in_use
            else f"a launched round (`num_inflight` is {states[early[0][1]][0]})")
    return fails("free_in_use",
                 f"{who}: you gave the {gone.format(prompts, [x for x, _ in early])} while "
                 f"{user} still uses it{_IN_ROUND[code]}. Whatever code puts it there, the next "
                 "request admitted gets it while that round still runs. Free a finished request "
                 "only when `req.num_inflight == 0`, with `engine.scheduler.free(req)`")


def _claimed_in_pool(call: dict, who: str, free: tuple) -> Verdict | None:
    """Blocks in the pool that a request still lists as its own."""
    holders = call["claims_after"][0]
    claimed = sorted(b for b in set(free) if b in holders)
    if not claimed:
        return None
    prompt = holders[claimed[0]]
    _, finished, row = call["states"][prompt]
    mine = [b for b in claimed if holders[b] == prompt]
    state = ("it is not finished and still runs with them" if not finished else
             "its batch row went back too" if row < 0 else "it keeps its batch row")
    return fails("stale_blocks",
                 f"{who}: KV blocks {mine[:12]} are back in the pool ({_BLOCKS}), but prompt "
                 f"{prompt}'s `req.blocks` still lists them ({state}): the request claims "
                 "blocks the pool already has back, and the next request admitted gets them. "
                 "Give a finished request back with `engine.scheduler.free(req)`, which empties "
                 "`req.blocks`, and leave the list as it left it")
