"""CUDA paths: run when a GPU is present, skipped (with the reason) elsewhere."""

import pytest
import torch

import toy_engine as te
from overlap_course.measure.bench import default_workload

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)")


@pytest.fixture(scope="module")
def cuda_engines(shipped):
    model, alphabet = shipped
    engines = {mode: te.Engine(te.EngineConfig(mode=mode, device="cuda"), model=model,
                               tokenizer=te.CharTokenizer(alphabet)) for mode in ("serial", "zos")}
    yield engines
    for e in engines.values():
        e.close()


def test_cuda_device_is_used_and_events_give_host_clock_times(cuda_engines):
    engine = cuda_engines["zos"]
    from toy_engine.device import CudaDevice

    assert isinstance(engine.device, CudaDevice)
    engine.generate(["Once upon a time"], max_new_tokens=16)
    device_spans = engine.timeline.lane("device")
    assert device_spans and all(s.end_ms >= s.start_ms for s in device_spans)
    host = engine.timeline.lane("host")
    # device work happens inside the run's host time window, on the same clock
    assert host[0].start_ms - 5 <= device_spans[0].start_ms <= host[-1].end_ms + 5


def test_cuda_zos_and_spec_equal_cpu_serial(cuda_engines, make_engine):
    prompts = default_workload(8)
    expected = [c.token_ids for c in make_engine(device="cpu").generate(prompts, max_new_tokens=48)]
    for engine in cuda_engines.values():
        assert [c.token_ids for c in engine.generate(prompts, max_new_tokens=48)] == expected
    spec = make_engine(device="cuda", mode="zos", num_draft_tokens=4)
    assert [c.token_ids for c in spec.generate(prompts, max_new_tokens=48)] == expected


def test_decode_loop_has_no_hidden_syncs(cuda_engines, make_engine):
    """Only the deliberate event waits may synchronize: no .item()/.tolist()/.cpu() on device data."""
    for engine in (cuda_engines["zos"], make_engine(device="cuda", mode="zos", num_draft_tokens=4)):
        engine.generate(["Once"], max_new_tokens=4)  # warm-up outside the check
        torch.cuda.set_sync_debug_mode("error")
        try:
            engine.generate(default_workload(4), max_new_tokens=24)
        finally:
            torch.cuda.set_sync_debug_mode("default")
