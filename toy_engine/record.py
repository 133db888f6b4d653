"""What a run did, in order: the record the course's checks judge.

The timeline says *when* things ran, this record *what depended on what*.  Events are recorded
where they happen (device, commit, block manager): a stage written out inline is recorded like the
engine's, a refused free or commit stays even if the error is swallowed.  A launch is *outstanding*
until the host waited on an event at or after it (not the clock: verdicts do not depend on the machine).
"""

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """Work enqueued on the stream; ``waited_upto``: the last launch waited for when it was enqueued."""

    seq: int
    round: int
    stage: str
    blocks: frozenset
    waited_upto: int
    t_ns: int

    def enqueued_before_waiting_for(self, other: "Launch") -> bool:
        """Whether this launch went in while ``other`` was still outstanding."""
        return other.seq < self.seq and other.seq > self.waited_upto


@dataclass(frozen=True)
class Wait:
    """A host wait on the event after launch ``seq`` (of ``round``'s ``stage``)."""

    seq: int
    round: int
    stage: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Schedule:
    """A schedule call: the round it planned, or None when nothing could be launched."""

    round: int | None
    t_ns: int


@dataclass(frozen=True)
class Commit:
    """A round's tokens handed to its requests (``prompts``); ``refused``: it was committed already."""

    round: int
    prompts: tuple
    refused: bool
    t_ns: int
    offered: tuple = ()  # how many tokens the round sampled for each prompt: 1 + accepted drafts


@dataclass(frozen=True)
class Free:
    """KV blocks given back by request ``prompt``.  ``in_use``: (round, stage) of outstanding launches
    on them; ``double``: blocks free already; ``refused``: the free raised, nothing was freed."""

    prompt: int
    blocks: tuple
    in_use: tuple
    double: tuple
    refused: bool
    t_ns: int


@dataclass(frozen=True)
class Refused:
    """A host access (``access`` "r"/"w") the race checker refused: ``round``'s ``launch`` used it."""

    buffer: str
    access: str
    round: int
    launch: str
    t_ns: int


@dataclass(frozen=True)
class Access:
    """A host access to a buffer the race checker let through: whether a wait ordered it after
    the launches using it is read from the record's waits before it, not from the checker's
    state (grading round 44: an answer that emptied the checker read before its wait)."""

    buffer: str
    access: str
    t_ns: int


class RunRecord:
    """The events of one run, in order (``events``); the engine starts a new one per run."""

    def __init__(self) -> None:
        self.events: list = []
        self._pending: list[Launch] = []  # launches the host has not waited for yet
        self._waited_upto = 0

    def launch(self, seq: int, round: int, stage: str, blocks) -> None:
        item = Launch(seq, round, stage, frozenset(blocks), self._waited_upto, time.perf_counter_ns())
        self._pending.append(item)
        self.events.append(item)

    def wait(self, seq: int, round: int, stage: str, start_ns: int, end_ns: int) -> None:
        self._waited_upto = max(self._waited_upto, seq)
        self._pending = [p for p in self._pending if p.seq > self._waited_upto]
        self.events.append(Wait(seq, round, stage, start_ns, end_ns))

    def schedule(self, round: int | None) -> None:
        self.events.append(Schedule(round, time.perf_counter_ns()))

    def commit(self, round: int, prompts, refused: bool = False, sampled=()) -> None:
        self.events.append(Commit(round, tuple(prompts), refused, time.perf_counter_ns(),
                                  tuple(map(len, sampled))))

    def free(self, prompt: int, blocks, double=(), refused: bool = False) -> None:
        in_use = tuple((p.round, p.stage) for p in self.outstanding(blocks))
        self.events.append(Free(prompt, tuple(blocks), in_use, tuple(double), refused, time.perf_counter_ns()))

    def refused(self, buffer: str, access: str, round: int, launch: str) -> None:
        self.events.append(Refused(buffer, access, round, launch, time.perf_counter_ns()))

    def access(self, buffer: str, access: str) -> None:
        self.events.append(Access(buffer, access, time.perf_counter_ns()))

    def outstanding(self, blocks=None) -> list[Launch]:
        """Launches not yet covered by a host wait (touching ``blocks``, if given)."""
        return list(self._pending) if blocks is None else [p for p in self._pending if p.blocks & set(blocks)]

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]
