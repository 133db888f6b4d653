"""What the stages refuse, each its own class: a checker tells the mistakes apart by class and
reads their attributes (``round``, ``stage``); the messages name the fix.  ``run`` exports them
too, as the course imports them from there."""

from .validate import plugin_label, shown


class StepProcessedTwice(RuntimeError):
    """A launched round's results were handed out a second time (``round``, ``prompt_indexes``),
    from the same StepState or (``same_step`` False) another one of the round."""

    def __init__(self, round: int, requests=(), same_step: bool = True):
        why = ("process each StepState exactly once" if same_step else
               f"it came from another StepState: launch_sample was called more than once for "
               f"round {round}'s inputs (each call returns a new StepState of the round). Launch "
               f"each round's sample once, and process its StepState once")
        super().__init__(f"round {round}'s step was already processed: {why} (a second time "
                         f"would hand its tokens out twice)")
        self.round = round
        self.prompt_indexes = [r.index for r in requests]


class StaleInputs(RuntimeError):
    """A launch (``stage``) given round ``round``'s inputs when the device holds another's:
    round ``latest``'s, uploaded since; ``foreign`` (``latest`` None): inputs of another run."""

    def __init__(self, stage: str, round: int, latest: int | None, foreign: bool = False):
        if foreign:
            why = ("which another run prepared (an earlier generate, on this engine or another): "
                   "a RoundInputs is launched only in the run that prepared it")
        else:
            why = (f"but round {latest}'s inputs were prepared since, and the device holds one "
                   f"round's inputs, the latest upload: it would work on round {latest}'s "
                   f"metadata as round {round}'s. Launch with the inputs the latest "
                   f"prepare_inputs returned, and launch a round before preparing the next")
        super().__init__(f"{stage} was given round {round}'s inputs, {why}")
        self.stage, self.round, self.latest, self.foreign = stage, round, latest, foreign


class SampleBeforeForward(RuntimeError):
    """launch_sample was given round ``round``'s inputs before launch_forward was (refused on
    the host: the device's sample would read logits no forward computed)."""

    def __init__(self, round: int):
        super().__init__(f"launch_sample was given round {round}'s inputs before their forward "
                         f"was launched: sampling picks tokens from the logits the round's "
                         f"forward computes. Call engine.launch_forward(inputs) first, then "
                         f"engine.launch_sample(inputs)")
        self.round = round


class ForeignStep(RuntimeError):
    """A step (``what``: "step") or plan ("plan") of another run (an earlier ``generate``, or one
    still going on another engine) was given to this run: its requests (and a step's event and
    output slot) are that run's (``round``: its round)."""

    def __init__(self, round: int, what: str = "step"):
        whose = ("another run (an earlier generate, on this engine or another, or one still "
                 "going on another engine)")
        super().__init__(
            f"round {round}'s step was launched by {whose}: a StepState is processed only in "
            f"the run that launched it. Was `previous` kept from that run (a global, a default "
            f"argument)? Start each loop with `previous = None`" if what == "step" else
            f"round {round}'s plan was scheduled by {whose}, or built by hand: a plan is "
            f"prepared only in the run whose engine.schedule() returned it (its requests, KV "
            f"blocks and rows are that run's). Was `plan` kept from that run (a global, a "
            f"default argument)? Prepare the plan this loop's engine.schedule() just returned")
        self.round, self.what = round, what


class PreparedTwice(RuntimeError):
    """prepare_inputs was given round ``round``'s plan again (prepared before; ``ran``: its
    tokens handed out); ``latest``: the last round engine.schedule() planned."""

    def __init__(self, round: int, latest: int, ran: bool):
        done = " and its round ran (its tokens were handed out)" if ran else ""
        since = (f"; engine.schedule() has returned round {latest}'s plan since, and that plan "
                 f"never runs" if latest > round else "")
        super().__init__(f"prepare_inputs was given round {round}'s plan, which was already "
                         f"prepared{done}{since}. Prepare each plan once, the one "
                         f"engine.schedule() just returned (a plan kept from an earlier round, "
                         f"in a variable the loop reuses, runs nothing new)")
        self.round, self.latest, self.ran = round, latest, ran


class PlannedSince(RuntimeError):
    """prepare_inputs was given round ``round``'s plan after engine.schedule() had planned
    round ``latest``: scheduling counts a round in flight, so this one's lengths are stale."""

    def __init__(self, round: int, latest: int):
        super().__init__(f"prepare_inputs was given round {round}'s plan, but engine.schedule() "
                         f"has planned round {latest} since: planning it counted round {round} "
                         f"as launched (each request's length and rounds in flight), so round "
                         f"{round}'s inputs would be prepared for the wrong positions. Prepare "
                         f"and launch each plan before asking for the next, and run the plans "
                         f"in the order engine.schedule() returns them")
        self.round, self.latest = round, latest


class StageInPlugin(RuntimeError):
    """A round's stage (``stage``) called from inside a plug-in or another stage (``inside``)."""

    def __init__(self, stage: str, inside: str):
        replaced = stage == "process_outputs"  # inside the plug-in that replaces it
        super().__init__(f"engine.{stage}() was called from inside {inside}" + (
            ", the stage it replaces: in this run engine.process_outputs calls it, so it would "
            "call itself until Python's recursion limit; process the step in it yourself: "
            "engine.device.wait(step.sample_done), out = engine.read_outputs(step), then for "
            "req in engine.commit_outputs(step, out): engine.scheduler.release_if_done(req)"
            if replaced else
            ": a stage called there plans or launches a round the loop never processes (and "
            "engine.schedule() calls on_round itself); only the loop calls the stages. To see "
            "what runs next, read engine.scheduler.waiting and engine.scheduler.running"))
        self.stage = stage


class RunEnded(RuntimeError):
    """A stage (``stage``) was given round ``round``'s inputs or step after its run ended."""

    def __init__(self, stage: str, round: int, what: str):
        super().__init__(f"{stage} was given round {round}'s {what} of a run that has ended "
                         f"(its generate returned, or raised): nothing of it can be launched or "
                         f"processed any more. Objects a loop kept (globals, a cell run again) "
                         f"end with their run; to run rounds, call engine.generate (your loop "
                         f"as loop=)")
        self.stage, self.round = stage, round


class ClassChanged(TypeError):
    """A stage was given a subclass of what it takes (``what``: plan, inputs or step): its
    __class__ changed, or one built by hand; the stages read the fields of the engine's own."""

    def __init__(self, stage: str, cls: type, got: type, maker: str):
        what = getattr(cls, "NAME", "plan")  # RoundInputs' and StepState's, as messages name them
        super().__init__(f"{stage} takes the {cls.__name__} that {maker} returned, got a "
                         f"{got.__name__}, a subclass of it ({what}.__class__ changed, or one "
                         f"built by hand): the engine reads a {cls.__name__}'s fields as it made "
                         f"them, and a subclass's code would decide what its stages see; leave "
                         f"its class as it is")
        self.stage, self.what = stage, what


class PlannedPastLimit(ValueError):
    """A decode planned for a request (prompt ``prompt``) past the positions its KV blocks were
    reserved for; ``processor`` (the loop's process_outputs, or None), the request's replaced
    commit or wants_more planned it, or ``who`` (the loop) lowered its max_new_tokens below
    ``given`` (generate's) since; the message names which must end it."""

    def __init__(self, round: int, req, writes: int, holds: int, processor: str | None,
                 given: int, who: str):
        super().__init__(
            f"round {round} plans prompt {req.index} for more tokens, but it has "
            f"{len(req.output_ids)} of its max_new_tokens {req.max_new_tokens}, "
            f"{'finished' if req.finished else 'unfinished'}, and {req.num_inflight} rounds in "
            f"flight (this round writes position {writes}; its KV blocks hold {holds}, reserved "
            f"for its prompt and max_new_tokens): {_who_ends(req, processor, given, who)}")
        self.round, self.prompt = round, req.index


def _who_ends(req, processor: str | None, given: int, who: str) -> str:
    """Who planned ``req`` past its ``max_new_tokens``, and what to change.  The engine's own
    commit ends a request there: without a plug-in, ``who`` lowered it, or grew its tokens."""
    commit = vars(req).get("commit")
    ender = (f"its commit, replaced on the request by a plug-in ({plugin_label(commit)}),"
             if commit else processor)
    end = (f"{ender} must end it (req.finish_reason = \"length\") once len(req.output_ids) "
           f"reaches max_new_tokens")
    if "wants_more" in vars(req):
        return (f"its wants_more, replaced on the request by a plug-in, must answer False once "
                f"it is finished or len(req.output_ids) + req.num_inflight reaches "
                f"max_new_tokens" + (f", and {end}" if commit else ""))
    if ender:
        return end
    if req.max_new_tokens < given:
        return (f"{who} lowered its req.max_new_tokens from {given} to {req.max_new_tokens} "
                f"after engine.schedule() planned this round for it; lower it before the round "
                f"is planned (in on_round, or before engine.schedule(): a request lowered to "
                f"the tokens it has ends \"length\" there), or end it with engine.abort(req.id)")
    return (f"its req.output_ids grew outside the engine's commit (by {who}), which ends a "
            f"request at max_new_tokens; leave output_ids to the engine")


class InflightChanged(ValueError):
    """A request's ``num_inflight`` (prompt ``prompt``) differs from the run's own count of its
    rounds in flight: the loop or a plug-in (``who``) changed it; ``why`` says so otherwise (a
    plug-in that lowered the others of its step's, committing it itself, left this one)."""

    def __init__(self, prompt: int, now, count: int, who: str, why: str = ""):
        super().__init__(
            f"prompt {prompt}'s req.num_inflight is {shown(now)}, but the run counts {count} of "
            f"its rounds in flight (planned, not yet committed): {why or f'it was changed {who}'}"
            f"; the engine counts them itself (engine.schedule() adds one, committing a round "
            f"takes one off), prepare_inputs places the round's tokens by it and "
            f"release_if_done frees by it; read it, never change it")
        self.prompt = prompt


class OtherTokens(ValueError):
    """Round ``round``'s tokens handed to prompt ``prompt`` (``given``) are not the ones its
    sample kept (``sampled``: the token and its accepted drafts, as the step's output slot holds
    them; None: not read).  ``who`` gave engine.commit_outputs other outputs, or (``itself``)
    committed the round itself, lowering num_inflight."""

    def __init__(self, round: int, prompt: int, given: list, sampled, who: str, itself: bool,
                 ended: bool = False):
        kept = "at least one token" if sampled is None else shown(sampled)
        if itself:
            got = f"the tokens {shown(given)}" if given else "no token"
            what = (f"{who} committed round {round} itself for prompt {prompt} (it lowered "
                    f"req.num_inflight) but handed it {got}"
                    f"{'' if ended else ' and did not end it'}, where the round kept {kept}")
            fix = ("append every kept token (req.commit(kept, eos_id, decode)) or end the "
                   "request (req.finish_reason); or leave num_inflight alone and call "
                   "engine.commit_outputs(step, engine.read_outputs(step))")
        else:
            what = (f"{who} gave engine.commit_outputs() round {round}'s outputs with "
                    f"{shown(given)} kept for prompt {prompt}, where the round sampled {kept} "
                    f"(the step's output slot holds them)")
            fix = "pass the outputs as engine.read_outputs(step) returns them, unchanged"
        super().__init__(f"{what}: the device goes on from the tokens it sampled (under ZOS it "
                         f"has already fed them to the next round), so other tokens give a "
                         f"text the model never produced; {fix}")
        self.round, self.prompt, self.given, self.sampled = round, prompt, given, sampled


class EndTakenBack(ValueError):
    """``req.finish_reason`` set back to None on prompt ``prompt``, which had ended ``was``
    (``who``: the plug-in that did, once ``RoundStages.calling`` names it)."""

    def __init__(self, prompt: int, was: str, who: str = "by the loop or a plug-in"):
        super().__init__(
            f"prompt {prompt}'s req.finish_reason was set back from {was!r} to None {who}: a "
            f"request ends exactly once (its KV blocks and row go back as it ends, later "
            f"rounds discard its tokens, generate returns it as it ended); leave a finished "
            f"request's finish_reason as it is, and give the prompt to another generate call "
            f"for more tokens")
        self.prompt, self.was, self.who = prompt, was, who

    def by(self, plugin: str) -> "EndTakenBack":
        """The refusal naming ``plugin``, the plug-in running as it was raised (the innermost:
        one named already is kept), with the traceback of the assignment."""
        if self.who != EndTakenBack.__init__.__defaults__[0]:
            return self
        return EndTakenBack(self.prompt, self.was, f"by {plugin}").with_traceback(
            self.__traceback__)


class HandedBeside(ValueError):
    """A process_outputs plug-in (``who``) committed round ``round`` through
    engine.commit_outputs, which handed prompt ``prompt`` the tokens ``handed``, and changed
    its output_ids (``was`` -> ``now``) beside that call: ``before`` it, or after (the round
    left it ``holds``)."""

    def __init__(self, round: int, prompt: int, was: list, now: list, handed: list, who: str,
                 before: bool = False):
        edit = f"{_edit(was, now)} prompt {prompt}'s req.output_ids"
        super().__init__(
            (f"{who} {edit} before it called engine.commit_outputs(step, out) for round {round}"
             if before else
             f"{who} committed round {round} through engine.commit_outputs(step, out), which "
             f"handed prompt {prompt} the tokens {shown(handed)}, then {edit}") +
            ": engine.commit_outputs hands each token the round kept out once, after the tokens "
            "committed before (and ends the request where it ends), and a committed token stays "
            "(the device's cache holds it, the next round sends the newest); leave "
            "req.output_ids to it, before and after the call")
        self.round, self.prompt, self.handed, self.before = round, prompt, handed, before
        self.holds = now[len(was) - len(handed):] if not before else now


def _edit(was: list, now: list) -> str:
    """What was done to a request's tokens, ``was`` -> ``now``, in words."""
    if now[:len(was)] == was:
        return f"appended {shown(now[len(was):])} to"
    if was[:len(now)] == now:
        return f"removed {len(was) - len(now)} of the {len(was)} tokens of"
    i = next(i for i, (a, b) in enumerate(zip(was, now)) if a != b)
    return f"changed the token at [{i}] from {shown(was[i])} to {shown(now[i])} in"


class CommitOtherTokens(ValueError):
    """A commit replaced on a request (``who``) was handed round ``round``'s kept tokens
    (``kept``) for prompt ``prompt`` and appended others (``appended``): not those, in order,
    stopping early only where the request ends."""

    def __init__(self, round: int, prompt: int, appended: list, kept: list, who: str,
                 eos: int | None = None):
        made_up = (f" (EOS {eos} among them, which the round did not sample there)"
                   if eos is not None else "")
        super().__init__(
            f"prompt {prompt}'s commit, replaced on the request by a plug-in ({who}), was handed "
            f"round {round}'s kept tokens {shown(kept)} and appended {shown(appended)}{made_up}: "
            f"a commit appends each kept token once, in order, and stops early only where the "
            f"request ends (EOS, a stop string, its limit); the device goes on from the tokens it "
            f"sampled (under ZOS it has already fed them to the next round), so other tokens "
            f"give a text the model never produced")
        self.round, self.prompt, self.appended, self.kept = round, prompt, appended, kept

    @classmethod
    def check(cls, round: int, prompt: int, appended: list, kept: list, who: str,
              eos: int, removed: int = 0, ended: str | None = None, full: bool = False) -> None:
        """Refuse ``appended`` unless it is ``kept`` in order, stopping early, less any EOS
        the round kept (left out or kept: lab 4's to judge, past_eos); an EOS the round never
        sampled there is refused too: it would hide the tokens the device goes on from.  A
        commit that stopped before a kept token other than EOS, or ``removed`` tokens committed
        before, must have ended the request (``ended``), a removal at a stop string
        (``CommitStoppedEarly``); one left unended at its limit (``full``) stalls, loudly
        (EngineStalled; lab 4's "stalled"), as one stopped at an EOS goes on (past_eos)."""
        i = 0
        for tok in appended:
            while i < len(kept) and kept[i] == eos != tok:
                i += 1
            if i == len(kept) or kept[i] != tok:
                raise cls(round, prompt, appended, kept, who, eos if tok == eos else None)
            i += 1
        early = i < len(kept) and kept[i] != eos and not full
        if removed and ended != "stop" or early and ended is None:
            raise CommitStoppedEarly(round, prompt, appended, kept, who, removed, ended)


class CommitStoppedEarly(ValueError):
    """A commit replaced on a request (``who``) was handed round ``round``'s kept tokens
    (``kept``) for prompt ``prompt``, appended fewer (``appended``) or removed ``removed`` of the
    tokens committed before, and did not end the request (``ended``: its finish_reason), or
    ended it otherwise than at a stop string, the one end that takes tokens back."""

    def __init__(self, round: int, prompt: int, appended: list, kept: list, who: str,
                 removed: int, ended: str | None):
        did = (f"removed {removed} of the tokens committed before" if removed else
               f"appended {shown(appended)}, {len(appended)} of its {len(kept)}")
        end = "did not end it" if ended is None else f"ended it {ended!r}, not at a stop string"
        fix = ("append each kept token once, in order (req.output_ids.append(tok), req.text += "
               "decode([tok])), until the request ends: set req.finish_reason (\"eos\", "
               "\"stop\", \"length\") where it does, and stop there")
        if removed:
            fix = ("take tokens back only to cut a stop string off the end, and end the request "
                   "there (req.finish_reason = \"stop\"); otherwise " + fix)
        super().__init__(
            f"prompt {prompt}'s commit, replaced on the request by a plug-in ({who}), was handed "
            f"round {round}'s kept tokens {shown(kept)}, {did}, and {end}: a commit hands out "
            f"fewer tokens than the round kept, or takes one back, only where the request ends "
            f"(EOS, a stop string, its limit; a stop string's cut alone takes tokens back); the "
            f"device goes on from every token it kept (under ZOS it has already fed the newest "
            f"to the next round), so the text would be one the model never produced, and "
            f"serial and ZOS would differ; {fix}")
        self.round, self.prompt, self.appended, self.kept = round, prompt, appended, kept
        self.removed, self.ended = removed, ended


class StateReplaced(TypeError):
    """Prompt ``prompt``'s ``output_ids`` or ``text`` (``name``) replaced by ``who`` with a
    value of another type than the plain list or str the engine's commit adds to."""

    KINDS = {"output_ids": (list, "the token ids committed: the engine appends to it, copies "
                                  "and checks it each round, and the next round sends its "
                                  "newest; append each token id: req.output_ids.append(tok)"),
             "text": (str, "the text of the tokens committed: the engine's commit adds to it and "
                           "generate returns it; add each token's: req.text += decode([tok])")}

    def __init__(self, prompt: int, name: str, value, who: str):
        kind, (want, why) = type(value).__name__, self.KINDS[name]
        if "engine.commit_outputs" in who:  # the commit adds the round's tokens: none by hand
            why = (f"{why.partition('; ')[0]}; engine.commit_outputs already adds each kept "
                   f"token to it: leave it the {want.__name__} the commit made")
        super().__init__(f"prompt {prompt}'s req.{name} = {kind} {shown(value)} was stored "
                         f"{who}: {name} must stay a plain {want.__name__}, not a {kind} "
                         f"(it holds {why})")
        self.prompt, self.name = prompt, name

    @classmethod
    def check(cls, req, prompt: int, who: str) -> None:
        """Refuse ``req``'s (prompt ``prompt``) output_ids or text of another type."""
        for name, (want, _) in cls.KINDS.items():
            if type(value := getattr(req, name)) is not want:
                raise cls(prompt, name, value, who)


class PlacementChanged(ValueError):
    """Prompt ``prompt``'s ``row`` or ``blocks`` (``name``) changed from ``was`` to ``now``
    (``who`` may have): the engine placed it there at admission."""

    def __init__(self, prompt: int, name: str, was, now, who: str):
        super().__init__(
            f"prompt {prompt}'s req.{name} was changed from {shown(was)} to {shown(now)} {who}: "
            f"a request's row and KV blocks are the engine's, given at admission for its "
            f"prompt and max_new_tokens (its rounds write its cache there); read them, never "
            f"change them: end a request with req.finish_reason or engine.abort(req.id), and "
            f"free a finished one with engine.scheduler.release_if_done(req)")
        self.prompt, self.name = prompt, name


class DraftsTooDeep(ValueError):
    """A drafting decode round (``drafts`` a round) was prepared for prompt ``prompt`` with
    ``earlier`` rounds of it still in flight: a loop holding more than one decode step."""

    def __init__(self, round: int, prompt: int, earlier: int, drafts: int):
        super().__init__(
            f"prepare_inputs was given round {round}'s decode plan, whose prompt {prompt} has "
            f"{earlier} earlier rounds still in flight, on an engine that drafts {drafts} "
            f"tokens a round (num_draft_tokens={drafts}): the seqlen correction covers one "
            f"round in flight, so its text would be silently wrong; hold one decode step in "
            f"flight (process round N-1's step before round N+1 is prepared, as the ZOS loop "
            f"does), or run the deeper loop on an engine without drafts")
        self.round, self.prompt, self.earlier, self.drafts = round, prompt, earlier, drafts


class FixedChanged(ValueError):
    """A request's fixed field (prompt ``prompt``'s ``name``; ``fields``: those a learner
    sets) changed from ``was`` to ``now`` by ``who``, ``admitted`` or still waiting; generate
    checked them, and max_new_tokens may only be lowered, to an int; ``took``: the
    max_new_tokens generate took (``was`` is lower once a plug-in lowered it: the limit in
    force, which the scheduler reserves a request's KV blocks by when it admits it)."""

    def __init__(self, prompt: int, name: str, was, now, who: str, fields: tuple,
                 admitted: bool = True, took=None):
        lowered = name == "max_new_tokens" and took is not None and was != took
        what = (f"prompt {prompt}'s req.{name} was changed from {shown(was)}"
                + (f" (lowered from the {shown(took)} generate took)" if lowered else "")
                + f" to {shown(now)}")
        if name == "max_new_tokens" and type(now) is not int:
            why = (f" {who}, a value of type {type(now).__name__}: max_new_tokens is a plain "
                   f"int (the scheduler sizes the request's KV blocks and counts its tokens by "
                   f"it); it may only be lowered, to an int (req.max_new_tokens = int(n)), or "
                   f"end the request with engine.abort(req.id)")
        else:
            rose = (", above the limit in force, the lowest it had (the scheduler reserves a "
                    "request's KV blocks by the one it has when admitted)," if lowered else
                    " (past the positions its KV blocks were reserved for)"
                    if name == "max_new_tokens" and admitted else "")
            since = ("once it runs (its KV blocks and row were reserved, its sampling set from "
                     "them" if admitted else
                     "once generate takes them, admitted or waiting (generate checked that they "
                     "fit the model and the KV cache, the scheduler reserves its KV blocks and "
                     "row by them")
            why = (f"{rose} {who}: a request's {', '.join(fields)} are fixed {since}; "
                   f"max_new_tokens may only be lowered); pass them to generate(), and end a "
                   f"request with engine.abort(req.id)")
        super().__init__(what + why)
        self.prompt, self.name, self.was, self.now = prompt, name, was, now
