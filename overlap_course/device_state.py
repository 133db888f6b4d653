"""What the checks' shared devices keep for good, as a digest: a learner's kernel that changed a
device's weights shows as a different one (``checks.pool.heal``), and so does a model that
reached a device changed on its way there (``checks.pool.engine``).  A light module: a device
process imports it to run :func:`verify`, and torch is all it needs."""

import functools
import hashlib

import torch

# A module's own tensors and submodules: read by value below, not as its settings
_HELD = ("_parameters", "_buffers", "_modules")


def fingerprint(model, ngram_table, num_drafts: int, block_size: int) -> str:
    """A digest of the model and the drafter's table, the same on the host and on any device
    (their bytes, not float sums)."""
    return combined(model_print(model), table_print(ngram_table), num_drafts, block_size)


def combined(model: str, table: str, num_drafts: int, block_size: int) -> str:
    """:func:`fingerprint` from the model's and the table's own digests."""
    return hashlib.sha256(repr((model, table, num_drafts, block_size)).encode()).hexdigest()


def model_print(model) -> str:
    """A digest of the model as a device runs it: each module's class and settings (its instance
    attributes other than its tensors and submodules: a changed ``n_head``, a ``forward`` or a
    hook set on it, its ``training`` flag) and the bytes of its weights."""
    digest = hashlib.sha256(repr(type(model).__qualname__).encode())
    for name, module in model.named_modules():
        settings = sorted((k, repr(v)) for k, v in vars(module).items() if k not in _HELD)
        kind = type(module)
        digest.update(repr((name, kind.__module__, kind.__qualname__, settings)).encode())
    for name, t in list(model.state_dict().items()):
        digest.update(name.encode())
        _tensor(digest, t)
    return digest.hexdigest()


def table_print(ngram_table) -> str:
    """A digest of the drafter's table (None: an engine without drafts has none)."""
    digest = hashlib.sha256(b"ngram")
    if ngram_table is not None:
        _tensor(digest, ngram_table)
    return digest.hexdigest()


def _tensor(digest, t) -> None:
    digest.update(repr((str(t.dtype), tuple(t.shape))).encode())
    digest.update(t.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy())


def verify(ctx, expected: str) -> None:
    """A kernel: raise (a sticky device error) unless the device's model and lasting state are
    as the engine built them."""
    st = ctx.state
    found = fingerprint(ctx.model, st.get("ngram_table"), st.get("num_drafts"), ctx.block_size)
    if found != expected:
        raise RuntimeError("the device's model or lasting state is not as the engine built it")



class WrongKeyLengths(ValueError):
    """A batch of a run whose corrected ``seqlens_k`` is not the engine's own correction's."""


def watched_correction(correction):
    """``correction`` as exercise 04's engine runs call it, each batch's ``seqlens_k`` then
    compared with the engine's own correction of the same inputs; a difference raises
    WrongKeyLengths (a sticky device error).  The toy's attention masks keys by position and
    never reads ``seqlens_k``, so its tokens cannot show a wrong one; a real kernel's would."""
    from toy_engine.kernels import correct_seqlens_qk  # the engine's: a device process has it

    @functools.wraps(correction)
    def watched(meta, accepted, block_size):
        given = {name: t.clone() for name, t in meta.items()}
        was = accepted.clone()
        want = {name: t.clone() for name, t in given.items()}
        correct_seqlens_qk(want, was.clone(), block_size)
        answer = correction(meta, accepted, block_size)
        got, right = meta.get("seqlens_k"), want["seqlens_k"]
        if not (isinstance(got, torch.Tensor) and got.shape == right.shape and got.equal(right)):
            raise WrongKeyLengths(_key_lengths_differ(given, was, got, right))
        return answer
    return watched


def _key_lengths_differ(given: dict, accepted, got, right) -> str:
    shown = got.tolist() if isinstance(got, torch.Tensor) else type(got).__name__
    q = given["seqlens_q"].tolist()
    return (f"a batch of {len(q)} request(s) of {q[0] if q else 0} tokens each (rows "
            f"{given['rows'].tolist()}, pending {given['pending'].tolist()}, accepted drafts by "
            f"row {accepted[given['rows']].tolist()}, the host's seqlens_k "
            f"{given['seqlens_k'].tolist()}): your seqlens_k is {shown}, expected {right.tolist()}")


def key_lengths_message(err: BaseException) -> str | None:
    """What a run's WrongKeyLengths said, raised here (a CUDA device runs kernels in this
    process) or reported by a device process (``"WrongKeyLengths: ... (in kernel ...)"``)."""
    if isinstance(err, WrongKeyLengths):
        return str(err)
    text, mark = str(err), f"{WrongKeyLengths.__name__}: "
    if not text.startswith(mark):
        return None
    return text[len(mark):].rpartition(" (in kernel")[0] or text[len(mark):]
