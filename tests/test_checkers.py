"""The exercise checkers accept the reference solutions and name each known mistake."""

import torch

from toy_engine import checkers, kernels


# ---- exercise 2: the serial loop ---------------------------------------------------

def serial_never_processes(engine):
    while engine.scheduler.has_work():
        plan = engine.schedule()
        inputs = engine.prepare_inputs(plan)
        engine.launch_forward(inputs)
        engine.launch_sample(inputs)


def not_written(engine):
    raise NotImplementedError


def test_serial_checker():
    assert checkers.check_serial_loop(lambda engine: engine.serial_loop()).passed
    v = checkers.check_serial_loop(serial_never_processes)
    assert not v and "waited for and processed" in v.message
    v = checkers.check_serial_loop(not_written)
    assert not v and v.message.startswith("not implemented yet")


# ---- exercise 3: the ZOS loop and its flush ----------------------------------------

def make_zos(flush=True, process_first=False, defer=True):
    def loop(engine):
        previous = None
        while engine.scheduler.has_work():
            plan = engine.schedule()
            if plan is None:
                previous = engine.flush(previous) if flush else None
                continue
            inputs = engine.prepare_inputs(plan)
            if previous is not None and process_first:
                engine.process_outputs(previous)
            if previous is not None:
                engine.correct_on_device(inputs)
            engine.launch_forward(inputs)
            if previous is not None and not process_first:
                engine.process_outputs(previous)
            current = engine.launch_sample(inputs)
            if plan.is_prefill or not defer:
                engine.process_outputs(current)
                previous = None
            else:
                previous = current
    return loop


def test_zos_checker_accepts_the_solution_and_the_engines_own_loop():
    assert checkers.check_zos_loop(make_zos()).passed
    assert checkers.check_zos_loop(lambda e: e.zos_loop()).passed


def test_zos_checker_names_a_missing_flush():
    v = checkers.check_zos_loop(make_zos(flush=False))
    assert not v
    assert "lost its last 1 token(s)" in v.message and "never flushed" in v.message


def test_zos_checker_names_processing_before_the_forward_launch():
    v = checkers.check_zos_loop(make_zos(process_first=True))
    assert not v and "processed before round" in v.message and "Launch this round's forward first" in v.message


def test_zos_checker_names_a_loop_that_never_defers():
    v = checkers.check_zos_loop(make_zos(defer=False))
    assert not v and "no decode step was deferred" in v.message


def test_zos_checker_not_implemented():
    assert checkers.check_zos_loop(not_written).message.startswith("not implemented yet")


# ---- exercise 4: the seqlen correction ----------------------------------------------

def stale(meta, accepted, block_size):
    pass  # forgets the correction entirely


def positions_only(meta, accepted, block_size):
    delta = accepted[meta["rows"]] * meta["pending"]
    meta["seqlens_k"] += delta
    meta["positions"] += torch.repeat_interleave(delta, meta["seqlens_q"])


def grows_queries(meta, accepted, block_size):  # also stretches the query lengths
    kernels.correct_seqlens_qk(meta, accepted, block_size)
    meta["seqlens_q"] += accepted[meta["rows"]] * meta["pending"]


def test_correction_checker():
    assert checkers.check_correction(kernels.correct_seqlens_qk).passed
    v = checkers.check_correction(stale)
    assert not v and "seqlens_k" in v.message and "stale" in v.message
    v = checkers.check_correction(positions_only)
    assert not v and v.message.startswith("slot_mapping") and "block table" in v.message
    v = checkers.check_correction(grows_queries)
    assert not v and v.message.startswith("seqlens_q") and "must not change" in v.message
    assert checkers.check_correction(lambda m, a, b: (_ for _ in ()).throw(NotImplementedError)).message.startswith(
        "not implemented")


def test_metadata_answer_checker():
    assert checkers.check_metadata_answer({"seqlens_k", "positions", "slot_mapping", "input_ids"}).passed
    assert "also stale: ['slot_mapping']" in checkers.check_metadata_answer(
        {"seqlens_k", "positions", "input_ids"}).message
    assert "do not change" in checkers.check_metadata_answer(
        {"seqlens_k", "positions", "slot_mapping", "input_ids", "seqlens_q"}).message
    assert "not a metadata field" in checkers.check_metadata_answer({"lengths"}).message


def test_three_rounds_checker():
    expected = [("forward", 1), ("sample", 1), ("forward", 2), ("postprocess", 1), ("sample", 2),
                ("forward", 3), ("postprocess", 2), ("sample", 3), ("flush", 3)]
    assert checkers.expected_three_rounds() == expected
    assert checkers.check_three_rounds(expected).passed
    serial_order = [("forward", 1), ("sample", 1), ("postprocess", 1), ("forward", 2)]
    v = checkers.check_three_rounds(serial_order)
    assert not v and "step 2" in v.message
    no_flush = expected[:-1] + [("postprocess", 3)]
    assert "flushed" in checkers.check_three_rounds(no_flush).message


# ---- exercise 5: ownership and lifetime ----------------------------------------------

def process_ok(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def process_reads_first(engine, step):
    out = engine.read_outputs(step)
    engine.device.wait(step.sample_done)
    for req in engine.commit_outputs(step, out):
        if req.finished and req.num_inflight == 0:
            engine.scheduler.free(req)


def process_frees_early(engine, step):
    engine.device.wait(step.sample_done)
    out = engine.read_outputs(step)
    for req in engine.commit_outputs(step, out):
        if req.finished:
            engine.scheduler.free(req)


def process_never_frees(engine, step):
    engine.device.wait(step.sample_done)
    engine.commit_outputs(step, engine.read_outputs(step))


def test_lifetime_checker():
    assert checkers.check_process_outputs(process_ok).passed
    v = checkers.check_process_outputs(process_reads_first)
    assert not v and "before waiting on its completion event" in v.message
    v = checkers.check_process_outputs(process_frees_early)
    assert not v and "freed a finished request's KV cache while a launched round still uses it" in v.message
    v = checkers.check_process_outputs(process_never_frees)
    assert not v and "kept their KV blocks" in v.message and "prompts []" not in v.message


def test_a_correction_defined_at_run_time_reaches_the_device():
    namespace = {}
    exec(  # like a notebook cell: the function lives in no importable module
        "import torch\n"
        "def correct(meta, accepted, block_size):\n"
        "    delta = accepted[meta['rows']] * meta['pending']\n"
        "    owner = torch.repeat_interleave(torch.arange(len(delta)), meta['seqlens_q'],"
        " output_size=len(meta['positions']))\n"
        "    meta['seqlens_k'] += delta\n"
        "    meta['positions'] += delta[owner]\n"
        "    block = meta['block_tables'][owner, meta['positions'] // block_size]\n"
        "    meta['slot_mapping'].copy_(block * block_size + meta['positions'] % block_size)\n",
        namespace)
    assert checkers.check_correction(namespace["correct"]).passed
