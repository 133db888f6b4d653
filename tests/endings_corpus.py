"""Wrong answers about how requests end (issue 33): code that frees or commits only some endings,
skips the deferred step whose requests have all finished, or (exercise 04) makes the host wait in an
operation whose result's size depends on the values; each with the verdict category its checker
must give and words its message must contain (the ending and the prompt).
``tests/test_endings_corpus.py`` runs them.  Each passed its checker before issue 33, when no
checker's run ended a request on EOS (nor exercise 03's at a stop string) and the host-wait rule
did not count data-dependent shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Answer:
    exercise: str   # "02a", "03a", "04a", "05", as in tests/mistakes.py
    name: str
    answer: object
    category: str
    words: tuple = ()  # what the message must say


def _loop_until_done(engine, process):
    """The serial loop with its processing step given."""
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        process(engine, engine.launch_sample(inputs))


def _inline(frees):
    """Processing written out inline, freeing the finished requests for which ``frees(req)``."""
    def process(engine, step):
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished and req.num_inflight == 0 and frees(req):
                engine.scheduler.free(req)
    return process


FREE_RULES = {
    "stop and length only": lambda req: req.finish_reason in ("stop", "length"),
    "length only": lambda req: req.finish_reason == "length",
    "when the limit is reached": lambda req: len(req.output_ids) >= req.max_new_tokens,
    "not at eos": lambda req: req.finish_reason != "eos",
    "stop, length and abort": lambda req: req.finish_reason in ("stop", "length", "abort"),
    "when it has a stop string or hit the limit": lambda req: req.text.endswith(tuple(req.stop))
    or len(req.output_ids) == req.max_new_tokens or req.finish_reason == "stop",
}


def _serial(frees):
    return lambda engine: _loop_until_done(engine, _inline(frees))


def _zos(process=None, skip_finished=False, skip_finished_at_flush=False):
    """The ZOS loop, processing steps with ``process`` (the engine's by default); it may skip a
    deferred step whose requests have all finished, under the next forward or at the flush."""
    def run_step(engine, step, stage):
        if process is not None:
            process(engine, step)
        elif stage == "flush":
            engine.flush(step)
        else:
            engine.process_outputs(step)

    def all_finished(step):
        return all(r.finished for r in step.plan.requests)

    def loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                if previous is not None and not (skip_finished_at_flush and all_finished(previous)):
                    run_step(engine, previous, "flush")
                previous = None
                continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if previous is not None and not (skip_finished and all_finished(previous)):
                run_step(engine, previous, "postprocess")
            current = engine.launch_sample(inputs)
            if plan.is_prefill:
                run_step(engine, current, "postprocess")
                previous = None
            else:
                previous = current
    return loop


def _process(frees, skip_finished=False):
    """Exercise 05's process_outputs, freeing the finished requests for which ``frees(req)``."""
    def process_outputs(engine, step):
        if skip_finished and all(r.finished for r in step.plan.requests):
            return
        engine.device.wait(step.sample_done)
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            if req.finished and req.num_inflight == 0 and frees(req):
                engine.scheduler.free(req)
    return process_outputs


def _process_skips_commit_of_finished(engine, step):
    """Waits, but commits only a step that still has an unfinished request ("nothing to commit")."""
    engine.device.wait(step.sample_done)
    if any(not r.finished for r in step.plan.requests):
        for req in engine.commit_outputs(step, engine.read_outputs(step)):
            engine.scheduler.release_if_done(req)


def _process_frees_by_length(engine, step):
    """Frees a request once its token count reached the limit (a length-only idea of finished)."""
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if len(req.output_ids) >= req.max_new_tokens and req.num_inflight == 0:
            engine.scheduler.free(req)


def _process_frees_stop_length_release(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finish_reason in ("stop", "length"):
            engine.scheduler.release_if_done(req)


def _process_forgets_abort(engine, step):
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, engine.read_outputs(step)):
        if req.finish_reason in ("stop", "length", "eos") and req.num_inflight == 0:
            engine.scheduler.free(req)


def _process_frees_only_committed_now(engine, step):
    """Frees a request only in the step that finished it: an aborted one, finished between two
    steps, is never freed (nor is one whose finishing step came back before its extra step)."""
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    before = [r.finished for r in step.plan.requests]
    for req, was in zip(engine.commit_outputs(step, out), before):
        if req.finished and not was:
            engine.scheduler.release_if_done(req)


KEPT = ("kept", "prompt")

WRONG = [
    *(Answer("02a", f"serial inline frees {rule}", _serial(fn), "kept_blocks", KEPT + ("EOS",))
      for rule, fn in FREE_RULES.items()),
    *(Answer("03a", f"zos inline frees {rule}", _zos(_inline(fn)), "kept_blocks", KEPT)
      for rule, fn in FREE_RULES.items()),
    Answer("03a", "zos skips a deferred step whose requests all finished", _zos(skip_finished=True),
           "skipped_extra_step", ("extra step", "prompt", "had ended")),
    Answer("03a", "zos skips the flush of finished requests", _zos(skip_finished_at_flush=True),
           "skipped_extra_step", ("extra step", "prompt")),
    Answer("03a", "zos skips both", _zos(skip_finished=True, skip_finished_at_flush=True),
           "skipped_extra_step", ("extra step",)),
    Answer("03a", "zos inline skip of finished steps", _zos(_inline(lambda r: True),
                                                            skip_finished=True),
           "skipped_extra_step", ("extra step",)),
    *(Answer("05", f"process frees {rule}", _process(fn), "kept_blocks", KEPT)
      for rule, fn in FREE_RULES.items()),
    Answer("05", "process skips a step whose requests all finished", _process(lambda r: True, True),
           "never_committed", ("never committed",)),
    Answer("05", "process commits only steps with unfinished requests",
           _process_skips_commit_of_finished,
           "never_committed", ("never committed",)),
    Answer("05", "process frees by token count", _process_frees_by_length, "kept_blocks", KEPT),
    Answer("05", "process release_if_done for stop and length", _process_frees_stop_length_release,
           "kept_blocks", KEPT),
    Answer("05", "process forgets aborted requests", _process_forgets_abort, "kept_blocks",
           KEPT + ("abort",)),
    Answer("05", "process frees only in the finishing step", _process_frees_only_committed_now,
           "kept_blocks", KEPT),
]


# ---------------------------------------------------------------- 04a: host waits in
# data-dependent shapes

def _owner(meta):
    q = meta["seqlens_q"]
    return torch.repeat_interleave(torch.arange(len(q), device=meta["seqlens_q"].device),
                                   q, output_size=len(meta["positions"]))


def _finish(meta, delta, owner, block_size):
    meta["seqlens_k"] += delta
    meta["positions"] += delta[owner]
    block = meta["block_tables"][owner, meta["positions"] // block_size]
    meta["slot_mapping"].copy_(block * block_size + meta["positions"] % block_size)


def correction_boolean_mask(meta, accepted, block_size):
    """The pending rows picked with a boolean mask: right values, a size read on the host."""
    delta = torch.zeros_like(meta["seqlens_k"])
    mask = meta["pending"].bool()
    delta[mask] = accepted[meta["rows"][mask]]
    _finish(meta, delta, _owner(meta), block_size)


def correction_nonzero(meta, accepted, block_size):
    delta = torch.zeros_like(meta["seqlens_k"])
    idx = meta["pending"].nonzero().flatten()
    delta.index_copy_(0, idx, accepted[meta["rows"][idx]])
    _finish(meta, delta, _owner(meta), block_size)


def correction_where_one_argument(meta, accepted, block_size):
    delta = torch.zeros_like(meta["seqlens_k"])
    (idx,) = torch.where(meta["pending"] == 1)
    delta.index_copy_(0, idx, accepted[meta["rows"][idx]])
    _finish(meta, delta, _owner(meta), block_size)


def correction_without_output_size(meta, accepted, block_size):
    """Notebook 04's old hint: repeat_interleave's length is the sum of seqlens_q, read on the
    host."""
    q = meta["seqlens_q"]
    _finish(meta, accepted[meta["rows"]] * meta["pending"],
            torch.repeat_interleave(torch.arange(len(q), device=meta["seqlens_q"].device), q),
            block_size)


def correction_method_without_output_size(meta, accepted, block_size):
    device = meta["seqlens_q"].device
    owner = torch.arange(len(meta["seqlens_q"]), device=device).repeat_interleave(meta["seqlens_q"])
    _finish(meta, accepted[meta["rows"]] * meta["pending"], owner, block_size)


def correction_masked_select(meta, accepted, block_size):
    rows = torch.masked_select(meta["rows"], meta["pending"].bool())
    delta = torch.zeros_like(meta["seqlens_k"])
    delta[meta["pending"].bool()] = accepted[rows]
    _finish(meta, delta, _owner(meta), block_size)


def correction_unique_owner(meta, accepted, block_size):
    """Owners by a unique over request ids: right values, a size the host must learn."""
    owner = _owner(meta)
    _, owner = torch.unique(owner, return_inverse=True)
    _finish(meta, accepted[meta["rows"]] * meta["pending"], owner, block_size)


WRONG += [
    Answer("04a", "boolean-mask indexing", correction_boolean_mask, "host_read", ("boolean mask",)),
    Answer("04a", "nonzero", correction_nonzero, "host_read", ("nonzero",)),
    Answer("04a", "where with one argument", correction_where_one_argument, "host_read",
           ("where",)),
    Answer("04a", "repeat_interleave without output_size", correction_without_output_size,
           "host_read",
           ("output_size",)),
    Answer("04a", "Tensor.repeat_interleave without output_size",
           correction_method_without_output_size,
           "host_read", ("output_size",)),
    Answer("04a", "masked_select", correction_masked_select, "host_read", ("masked_select",)),
    Answer("04a", "unique", correction_unique_owner, "host_read", ("unique",)),
]
