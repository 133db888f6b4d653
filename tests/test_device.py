"""The CPU stand-in behaves like a CUDA stream: asynchronous, in order, event-driven."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from toy_engine.device import DeviceError
from toy_engine.process_device import ProcessDevice
from toy_engine.races import RaceError
from toy_engine.model import GPTConfig, TinyGPT
from toy_engine.record import Commit, Launch, RunRecord, Wait

SPECS = {"inbuf": ((8,), torch.long), "outbuf": ((8,), torch.long)}


def sleep_ms(ctx, ms):
    time.sleep(ms / 1000)


def append_log(ctx, value):
    ctx.state.setdefault("log", []).append(value)


def copy_log(ctx):
    log = torch.tensor(ctx.state["log"][-8:], dtype=torch.long)
    ctx.store("outbuf", log)


def fail(ctx):
    raise ZeroDivisionError("boom on the device")


@pytest.fixture(scope="module")
def device():
    model = TinyGPT(GPTConfig(vocab_size=10, context_len=16, n_layer=1, n_head=1, n_embd=8))
    dev = ProcessDevice(model, num_kv_blocks=4, block_size=4, buffer_specs=SPECS)
    yield dev
    dev.close()


def test_launch_returns_before_the_work_is_done(device):
    t0 = time.perf_counter()
    device.launch(sleep_ms, 300, round=0)
    launched = time.perf_counter() - t0
    ev = device.record_event()
    device.wait(ev)
    waited = time.perf_counter() - t0
    # Generous bounds: launching is a message (well under 0.1 s), waiting covers the work.
    assert launched < 0.1, launched
    assert waited >= 0.29, waited


def test_launches_run_in_order_and_times_are_monotonic(device):
    for i in range(8):
        device.launch(append_log, i, round=i)
    device.launch(copy_log, round=8, writes={"outbuf"})
    device.wait(device.record_event())
    assert device.host("outbuf").tolist() == list(range(8))
    spans = device.spans()
    starts = [s[2] for s in spans]
    assert starts == sorted(starts)
    assert all(end >= start for _, _, start, end, _ in spans)
    # device stamps are on the host clock: they fall inside this test's lifetime
    assert all(0 < start <= time.perf_counter_ns() for _, _, start, _, _ in spans)
    # and carry the CPU time the device process got, never more than the wall time allows
    assert all(0 <= cpu <= (end - start) * 1.05 + 100_000 for _, _, start, end, cpu in spans)


def test_kernels_defined_at_run_time_reach_the_device_by_value(device):
    offset = 40

    def add_offset(ctx, x):  # a closure, like a function defined in a notebook cell
        ctx.store("outbuf", torch.arange(8) + x + offset)

    device.launch(add_offset, 2, round=0, writes={"outbuf"})
    device.wait(device.record_event())
    assert device.host("outbuf").tolist()[:2] == [42, 43]


def test_race_checker_catches_reads_writes_and_freed_blocks(device):
    device.launch(sleep_ms, 1, round=7, writes={"outbuf"}, reads={"inbuf"}, blocks={2}, owner=7)
    with pytest.raises(RaceError, match=r"'outbuf'.*round 7") as info:
        device.host("outbuf", "r")
    err = info.value
    assert (err.kind, err.buffer, err.access, err.round, err.launch) == ("buffer", "outbuf", "r", 7, "sleep_ms")
    assert (err.owner, err.prompt) == (7, None)  # StepState(round=7) owns the results; no request's free
    with pytest.raises(RaceError, match=r"'inbuf'.*host write"):
        device.host("inbuf", "w")
    device.host("inbuf", "r")  # reading what the device only reads is fine
    with pytest.raises(RaceError, match=r"KV blocks \[2\].*round 7"):
        device.races.on_free([2], prompt=5)
    device.wait(device.record_event())
    device.host("outbuf", "r")
    device.races.on_free([3], prompt=6)
    with pytest.raises(RaceError, match=r"KV block 3.*freed by prompt 6") as info:
        device.launch(sleep_ms, 1, round=8, blocks={3})
    err = info.value
    assert (err.kind, err.blocks, err.round, err.launch, err.prompt) == ("launch_on_free", [3], 8, "sleep_ms", 6)
    device.races.on_alloc([3])
    device.launch(sleep_ms, 1, round=8, blocks={3})
    device.wait(device.record_event())


def test_device_exceptions_are_sticky_host_errors():
    model = TinyGPT(GPTConfig(vocab_size=10, context_len=16, n_layer=1, n_head=1, n_embd=8))
    dev = ProcessDevice(model, num_kv_blocks=4, block_size=4, buffer_specs=SPECS)
    try:
        dev.launch(fail, round=3)
        dev.launch(append_log, 1, round=4)
        with pytest.raises(DeviceError, match="ZeroDivisionError: boom on the device.*'fail'"):
            dev.wait(dev.record_event())
        with pytest.raises(DeviceError):  # sticky, like a CUDA error
            dev.wait(dev.record_event())
    finally:
        dev.close()
    assert not dev._proc.is_alive()


def test_device_process_ignores_sigint(device):
    os.kill(device.pid, signal.SIGINT)
    time.sleep(0.2)
    device.launch(append_log, 99, round=0)
    device.wait(device.record_event())


def test_device_process_dies_with_its_parent(tmp_path):
    script = textwrap.dedent("""
        import time
        from toy_engine.process_device import ProcessDevice
        from toy_engine.model import GPTConfig, TinyGPT
        dev = ProcessDevice(TinyGPT(GPTConfig(vocab_size=10, context_len=16, n_layer=1, n_head=1, n_embd=8)),
                            num_kv_blocks=4, block_size=4, buffer_specs={})
        print(dev.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        try:  # reap if it became our zombie (it should not)
            os.waitpid(child_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.2)
    pytest.fail(f"device process {child_pid} outlived its parent")


def test_waiting_again_on_a_finished_event_returns_at_once(device):
    device.launch(sleep_ms, 5, round=0)
    first = device.record_event()
    device.launch(sleep_ms, 5, round=1)
    second = device.record_event()
    device.wait(second)
    t0 = time.perf_counter()
    device.wait(first)   # older and already complete
    device.wait(second)  # the same event twice, as CUDA allows
    assert time.perf_counter() - t0 < 0.5


def test_launch_arguments_travel_by_value(device):
    """A function defined at run time (as in a notebook) can be passed *as an argument*."""
    def fill(ctx, value):
        ctx.store("outbuf", torch.full((8,), value))

    def apply(ctx, fn, value):
        fn(ctx, value)

    device.launch(apply, fill, 7, round=0, writes={"outbuf"})
    device.wait(device.record_event())
    assert device.host("outbuf").tolist() == [7] * 8


def test_each_wait_is_recorded_with_its_event_and_times(device):
    device.run_record = RunRecord()
    done = device.launch(sleep_ms, 50, round=3, stage="sample", record_event=True)
    device.launch(sleep_ms, 1, round=4, stage="forward")
    device.wait(done)
    device.synchronize()
    first, second = device.run_record.of(Wait)
    assert (first.seq, first.round, first.stage) == (done.seq, 3, "sample")
    assert (second.seq, second.round, second.stage) == (done.seq + 1, 4, "forward")
    # the first wait covered the 50 ms sleep (generous bound for a busy machine)
    assert first.end_ns - first.start_ns >= 40e6 and first.start_ns <= first.end_ns <= second.start_ns


def test_each_launch_records_how_far_the_host_had_waited(device):
    device.run_record = RunRecord()
    sample = device.launch(sleep_ms, 1, round=1, stage="sample", record_event=True)
    device.launch(sleep_ms, 1, round=2, stage="forward")      # enqueued while round 1's sample is outstanding
    device.wait(sample)
    device.launch(sleep_ms, 1, round=3, stage="forward")      # enqueued after the host waited for it
    launches = device.run_record.of(Launch)
    assert launches[1].enqueued_before_waiting_for(launches[0])
    assert not launches[2].enqueued_before_waiting_for(launches[0])
    assert [p.round for p in device.run_record.outstanding()] == [2, 3]
    device.synchronize()


def test_the_engine_starts_a_new_record_each_run(make_engine):
    engine = make_engine(mode="zos", max_batch_size=2)
    engine.generate(["Once upon a time"], max_new_tokens=4)
    waits = engine.record.of(Wait)
    assert waits and all(w.stage == "sample" for w in waits)  # the engine waits only on sample events
    commits = engine.record.of(Commit)
    assert [c.round for c in commits] == [0, 1, 2, 3] and not any(c.refused for c in commits)
    engine.generate(["Once upon a time"], max_new_tokens=4)
    assert len(engine.record.of(Wait)) == len(waits)


def test_every_free_is_recorded_even_when_refused(device):
    from toy_engine.record import Free

    device.run_record = RunRecord()
    device.launch(sleep_ms, 20, round=1, stage="forward", blocks={3, 4})
    with pytest.raises(RaceError) as info:  # in use by the pending forward
        device.free_blocks([3, 4], 0)
    assert (info.value.kind, info.value.prompt) == ("free_in_use", 0)
    device.races.enabled = False                         # a learner turns the checker off ...
    device.free_blocks([3, 4], 0)                        # ... and the free goes through
    device.races.enabled = True
    with pytest.raises(RaceError) as info:               # a second free of the same blocks
        device.free_blocks([4], 0, double=[4])
    assert info.value.kind == "double_free"
    device.synchronize()
    refused, through, double = device.run_record.of(Free)
    assert refused.refused and refused.in_use == ((1, "forward"),)
    assert not through.refused and through.in_use == ((1, "forward"),)   # the record still sees the hazard
    assert double.refused and double.double == (4,)
    assert {refused.prompt, through.prompt, double.prompt} == {0}


def test_a_double_free_is_refused_even_with_race_checking_off(make_engine):
    engine = make_engine(mode="serial", max_batch_size=2, race_check=False)
    pool = engine.scheduler.blocks
    blocks = pool.allocate(2)
    pool.free(blocks, "prompt 0")
    with pytest.raises(RaceError, match="freed a second time"):
        pool.free(blocks, "prompt 0")
    assert sorted(pool.free_ids) == list(range(engine.config.num_kv_blocks))
