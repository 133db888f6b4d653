"""What the checks' shared devices keep for good, as a digest: a learner's kernel that changed a
device's weights shows as a different one (``checks.pool.heal``).  A light module: a device
process imports it to run :func:`verify`, and torch is all it needs."""

import functools
import hashlib

import torch


def fingerprint(model, ngram_table, num_drafts: int, block_size: int) -> str:
    """A digest of the model's weights and the drafter's table, the same on the host and on any
    device (their bytes, not float sums)."""
    digest = hashlib.sha256(repr((type(model).__qualname__, num_drafts, block_size)).encode())
    for name, t in list(model.state_dict().items()) + [("ngram", ngram_table)]:
        digest.update(name.encode())
        if t is not None:
            digest.update(repr((str(t.dtype), tuple(t.shape))).encode())
            digest.update(t.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy())
    digest.update(repr([m.training for m in model.modules()]).encode())
    return digest.hexdigest()


def verify(ctx, expected: str) -> None:
    """A kernel: raise (a sticky device error) unless the device's model and lasting state are
    as the engine built them."""
    st = ctx.state
    if fingerprint(ctx.model, st.get("ngram_table"), st.get("num_drafts"), ctx.block_size) != expected:
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
