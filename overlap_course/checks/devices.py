"""What the checks verify of a shared engine's device (:mod:`overlap_course.checks.pool`): that
only the engine's kernels ran on it, that its books are plain, and that it holds the shipped
model and n-gram table, as read once, when the checks are imported (in the grading judge:
before the submission's first line)."""

import collections

from overlap_course.device_state import combined, model_print, table_print, verify
from toy_engine import kernels
from toy_engine.device import DeviceError
from toy_engine.drafter import ngram_table
from toy_engine.model import CHECKPOINT, load_model
from toy_engine.process_device import ProcessDevice

# The engine's own kernels: any other one run on a shared device may have changed it for good.
_KERNELS = (kernels.setup_state, kernels.upload_inputs, kernels.correct, kernels.forward,
            kernels.sample, verify)
RECOVER_S = 10.0  # how long a heal waits for a shared device's queue (its own kernel: a few ms)


def _read() -> tuple[str, str]:
    """The digests of the shipped model and n-gram table.  Each engine's device is verified
    against them when it is built: the model the checks load again later (after a judge empties
    their caches) passes through torch's and cloudpickle's code on its way to the device, which
    a learner's cell can patch (``torch.nn.Module.eval`` changed the weights and a wrong loop
    matched the reference, round 15); compared by value on the device, a change made anywhere
    on that path shows, whatever code made it."""
    model, alphabet = load_model()
    return model_print(model), table_print(ngram_table(alphabet))


_SHIPPED = _read()


def expected(num_drafts: int, block_size: int) -> str:
    """``device_state.verify``'s digest for an engine of the shipped model with ``num_drafts``
    drafts (and then the shipped table) and blocks of ``block_size``."""
    table = _SHIPPED[1] if num_drafts else table_print(None)
    return combined(_SHIPPED[0], table, num_drafts, block_size)


def not_shipped(key: tuple, what: str) -> str:
    return (f"the checks' engine {dict(key)} was not built as shipped: {what}), not the "
            f"checkpoint {CHECKPOINT} as read when the checks were imported; restart the kernel "
            f"and run the notebook again")


def changed(shared, expected: str) -> str | None:
    """What a learner's run left in the device, or None: a kernel of its own (it may have changed
    the device's weights), bookkeeping that is not plain, a launch or a freed block a wait and
    an idle pool do not explain, or a model or lasting state that differs
    (``device_state.verify``)."""
    device = shared.device
    if type(device) is not ProcessDevice:  # CUDA: not verified here (no GPU to test it on yet)
        return None
    if not all(any(k is own for own in _KERNELS) for k in device._kernel_ids):
        return "`engine.device` (a kernel that is not the engine's ran on it"
    books = device._latencies_ns
    if (type(books) is not collections.deque or books.maxlen is None
            or not all(type(n) is int for n in books) or type(device._last_end_ns) is not int
            or type(device._sent_ns) is not dict or type(device._stamps) is not list):
        return "`engine.device`'s bookkeeping (its launch latencies and times"
    try:
        device.launch(verify, expected, round=0, stage="verify")
        device.synchronize(timeout=RECOVER_S)
    except DeviceError:
        return "`engine.device`'s model or lasting state (changed by a kernel"
    races, n = device.races, shared.config.num_kv_blocks
    if races.pending or device._sent_ns:
        return "`engine.device.races.pending` (a launch no wait covers"
    freed = races.free_blocks.items()
    if not all(type(b) is int and 0 <= b < n and type(p) is int for b, p in freed):
        return "`engine.device.races.free_blocks` (entries that are not block numbers and rounds"
    return None
