"""The two bugs of notebook 07b, in the shape the engines cited there shipped them, for the toy.

Each is right in the situation its authors had in mind (a sampler that needs no token history,
a batch that keeps its order from one round to the next) and wrong in the one overlap adds;
notebook 07b's learner cells start from a copy of each (tests/test_labs07b.py keeps them equal).
"""

from __future__ import annotations


def before_sample(engine, plan, held) -> int:
    """Process none of the held steps before the sample: it goes in right behind the forward."""
    return 0


def key(req, b: int) -> int:
    """Keep a request's newest token under its place in this round's batch."""
    return b
