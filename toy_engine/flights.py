"""Each request's rounds in flight, as the run counts them, against ``req.num_inflight``: the
engine changes it (engine.schedule() adds one, committing a round takes one off), the learner
reads it.  prepare_inputs places a round's tokens by it and release_if_done frees by it, so a
count a plug-in changed is refused where the plug-in returns, naming it; and the tokens a round
hands out are checked against what its sample kept, which the device goes on from."""

from . import buffers
from .refusals import HandedBeside, InflightChanged, OtherTokens
from .validate import check_committed


class Flights:
    """id(request) -> its rounds planned, not yet committed (``counts``; ``prompts``: its prompt
    index, as generate made it); ``samples``: per host slot, the event seq of the last sample
    launched into it (its output slot holds that sample's tokens)."""

    def __init__(self, prompts: dict):
        self.prompts, self.counts, self.samples = prompts, {}, {}
        # While a process_outputs plug-in runs, per request of its step, the output_ids it
        # holds: as the call began, then as engine.commit_outputs left them (``check_held``).
        self.held: dict = {}

    def planned(self, requests) -> None:
        """As the scheduler adds one to each planned request's num_inflight."""
        for req in requests:
            self.counts[id(req)] = self.counts.get(id(req), 0) + 1

    def committed(self, requests) -> None:
        """As committing a round takes one off each of its requests' num_inflight."""
        for req in requests:
            self.counts[id(req)] -= 1

    def check(self, requests, who: str) -> None:
        """Refuse a num_inflight other than the run's count (not this run's request: skipped)."""
        for req in requests:
            now, n = req.num_inflight, self.counts.get(id(req))
            if n is not None and not (type(now) is int and now == n):
                raise InflightChanged(self.prompts[id(req)], now, n, who)

    def kept(self, device, step, k: int) -> list | None:
        """Per request, the tokens ``step``'s sample kept, read from its output slot; None while
        the slot may not hold them: its sample not waited for (a read would race), or another
        sample launched into the slot since."""
        seq, n = step.sample_done.seq, len(step.plan.requests)
        if self.samples.get(step.slot) != seq or any(
                launch.seq == seq for launch in device.run_record.outstanding()):
            return None
        flat = device.buffers[buffers.out_buffer(step.slot)][:buffers.outputs_size(n, k)]
        return buffers.unpack_outputs(flat.tolist(), n, k)

    def check_outputs(self, planned: tuple, sampled: list, kept, who: str) -> None:
        """Refuse outputs given to engine.commit_outputs that keep other tokens than the step's
        sample did (``kept``: ``Flights.kept``, None: unknown)."""
        rnd, _, requests = planned
        for req, given, held in zip(requests, sampled, kept or ()):
            if given != held and not req.finished:  # a finished one's are discarded
                raise OtherTokens(rnd, self.prompts[id(req)], given, held, who, itself=False)

    def after_process(self, planned: tuple, label: str, through_engine: bool, before,
                      kept) -> bool:
        """After a process_outputs plug-in (``label``): whether it committed the round itself,
        lowering each of its requests' num_inflight by one and handing each unfinished one
        (``before``: each admitted request, its output_ids and finished before the call) the
        tokens its sample kept (``kept()``: ``Flights.kept``); any other change to
        num_inflight is refused."""
        rnd, _, requests = planned
        if through_engine:  # engine.commit_outputs took one off each already
            self.check(requests, f"by {label}, beside engine.commit_outputs(step, out), which "
                                 f"takes one off itself")
            self._check_given(rnd, requests, label, before)
            return False
        lowered = [type(r.num_inflight) is int and r.num_inflight == self.counts[id(r)] - 1
                   for r in requests]
        if not any(lowered):
            self.check(requests, f"by {label}")
            self._kept_in_flight(rnd, requests, label, before)
            return False
        for req, down in zip(requests, lowered):
            n = self.counts[id(req)]
            if not down:
                raise InflightChanged(self.prompts[id(req)], req.num_inflight, n - 1, "", (
                    f"{label} committed round {rnd} itself, lowering the other requests' of "
                    f"its step by one, but left this one's at {n}: lower every one of them, "
                    f"finished ones too" if req.num_inflight == n else
                    f"it was changed by {label}"))
        self._check_handed(rnd, requests, label, before, kept())
        return True

    def _check_handed(self, rnd: int, requests, label: str, before, held) -> None:
        """Refuse a round committed by hand whose unfinished requests did not get exactly the
        tokens its sample kept (``held``; None: unknown, then some, or an end)."""
        before = {id(req): (ids, done) for req, ids, done in before}
        for i, req in enumerate(requests):
            ids, finished = before[id(req)]
            now = req.output_ids
            if finished:  # the extra round: its tokens are discarded
                continue
            if held is None:  # its tokens unknown: some must be handed out, or it ended
                ok = req.finished or len(now) > len(ids)
            else:  # all of them, or fewer as it ends (EOS, a stop string, its limit)
                want = ids + held[i]
                ok = now == want or req.finished and now == want[:len(now)]
            if not ok:
                raise OtherTokens(rnd, self.prompts[id(req)], now[len(ids):],
                                  None if held is None else held[i], label, True, req.finished)

    def _kept_in_flight(self, rnd: int, requests, label: str, before) -> None:
        """Refuse a plug-in that handed out round ``rnd``'s tokens itself (or ended a request of
        it) but left its requests' num_inflight as they were (round 23: it was told a deferred
        step was dropped)."""
        handed = next((req for req, ids, done in before if req in requests and not done and (
            req.finished or req.output_ids != ids)), None)
        if handed is not None:
            n = self.counts[id(handed)]  # the round committed, it counts one less
            raise InflightChanged(self.prompts[id(handed)], n, n - 1, "", (
                f"{label} handed out round {rnd}'s tokens itself (or ended the request) "
                f"without taking the round off its num_inflight: lower each request's "
                f"num_inflight of the step by one as it commits the round, or commit with "
                f"engine.commit_outputs(step, out), which does"))

    def check_held(self, rnd: int, requests, who: str, vocab: int) -> None:
        """Refuse tokens a process_outputs plug-in (``who``) changed (``check_committed``),
        appended or removed before it called engine.commit_outputs for round ``rnd``: the
        engine's commit would hand the round's tokens out after them."""
        for req in requests:
            was = self.held.get(id(req))
            if was is None:
                continue
            check_committed(req, was, f"{who}, committing prompt {self.prompts[id(req)]}'s "
                                      f"tokens through engine.commit_outputs,", vocab)
            if req.output_ids != was:
                raise HandedBeside(rnd, self.prompts[id(req)], was, req.output_ids, [], who,
                                   before=True)

    def _check_given(self, rnd: int, requests, label: str, before) -> None:
        """Refuse a round committed through engine.commit_outputs whose requests' tokens the
        plug-in changed after the call (its tokens handed out again, one made up, one taken
        back): the engine handed each kept token out once, and the device goes on from them."""
        before = {id(req): ids for req, ids, _ in before}
        for req in requests:
            post = self.held.get(id(req))
            if post is not None and req.output_ids != post:
                raise HandedBeside(rnd, self.prompts[id(req)], post, req.output_ids,
                                   post[len(before[id(req)]):], label)
