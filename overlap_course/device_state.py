"""What the checks' shared devices keep for good, as a digest: a learner's kernel that changed a
device's weights shows as a different one (``checks.pool.heal``).  A light module: a device
process imports it to run :func:`verify`, and torch is all it needs."""

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
