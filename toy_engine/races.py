"""The race checker: the course's compute-sanitizer.

Every launch declares the host buffers it reads and writes and the KV-cache blocks it
touches; the host may touch a buffer, or free KV blocks, only after waiting on an event that
covers every unfinished launch using them.  Breaking that rule raises a ``RaceError``.
"""

from dataclasses import dataclass


class RaceError(RuntimeError):
    """The host touched state unfinished device work uses.  ``kind``: ``"buffer"``, ``"free_in_use"``,
    ``"launch_on_free"`` or ``"double_free"`` (refused even with checking off); ``round``/``launch``: the
    conflicting launch, ``owner`` the round owning its results, ``prompt`` whose blocks were freed."""

    KINDS = ("buffer", "free_in_use", "launch_on_free", "double_free")

    def __init__(self, message: str, *, kind: str, round: int, launch: str, buffer: str | None = None,
                 access: str | None = None, blocks=(), owner: int | None = None, prompt: int | None = None):
        super().__init__(message)
        assert kind in self.KINDS, kind
        self.kind, self.round, self.launch, self.owner, self.prompt = kind, round, launch, owner, prompt
        self.buffer, self.access, self.blocks = buffer, access, sorted(blocks)


@dataclass
class PendingLaunch:
    """What the checker keeps of a launch until a wait orders the host after it."""

    seq: int
    name: str
    round: int
    reads: frozenset
    writes: frozenset
    blocks: frozenset
    owner: int | None = None  # the round whose StepState owns the launch's results


class RaceChecker:
    """Happens-before bookkeeping, like compute-sanitizer's racecheck: an access is a race when no
    ``wait`` ordered it after the launch, even if it had finished (never the clock: deterministic)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.pending: list[PendingLaunch] = []
        self.free_blocks: dict[int, int] = {}  # block -> the prompt that freed it

    def on_launch(self, launch: PendingLaunch) -> None:
        if not self.enabled:
            return
        for block in sorted(launch.blocks & self.free_blocks.keys()):
            freed_by = self.free_blocks[block]
            raise RaceError(f"launch '{launch.name}' of round {launch.round} touches KV block {block}, which is free "
                            f"(freed by prompt {freed_by}): its cache may already belong to another request",
                            kind="launch_on_free", round=launch.round, launch=launch.name, blocks=[block],
                            prompt=freed_by)
        self.pending.append(launch)

    def forget(self, seq: int) -> None:
        """Launch ``seq`` never went in (its launch failed): nothing of it is pending."""
        self.pending = [p for p in self.pending if p.seq != seq]

    def on_wait(self, seq: int) -> None:
        self.pending = [p for p in self.pending if p.seq > seq]

    def check_access(self, name: str, mode: str) -> None:
        if not self.enabled:
            return
        for p in self.pending:
            if name in p.writes or (mode == "w" and name in p.reads):
                verb = "read" if mode == "r" else "write"
                use = "writes" if name in p.writes else "reads"
                raise RaceError(f"race on buffer '{name}': host {verb} while launch '{p.name}' of round {p.round} "
                                f"still {use} it; wait on an event recorded after that launch (round {p.round}'s "
                                f"completion event) first",
                                kind="buffer", round=p.round, launch=p.name, buffer=name, access=mode, owner=p.owner)

    def on_free(self, blocks, prompt: int, double=(), round: int = 0) -> None:
        """Request ``prompt`` frees ``blocks`` (``double``: those already free) during ``round``."""
        if double:
            raise RaceError(f"KV blocks {sorted(double)} of prompt {prompt} are freed a second "
                            f"time: they were freed already, and freeing them again would let two "
                            f"requests share them. Free a request once "
                            f"(`engine.scheduler.release_if_done(req)` checks)",
                            kind="double_free", round=round, launch="free", blocks=double, prompt=prompt)
        if not self.enabled:
            return
        blocks = set(blocks)
        for p in self.pending:
            if p.blocks & blocks:
                raise RaceError(f"KV blocks {sorted(p.blocks & blocks)} of prompt {prompt} freed while launch "
                                f"'{p.name}' of round {p.round} may still use them; free a finished request's cache "
                                f"only after waiting on round {p.round}'s event",
                                kind="free_in_use", round=p.round, launch=p.name, blocks=p.blocks & blocks,
                                prompt=prompt)
        self.free_blocks.update((b, prompt) for b in blocks)

    def on_alloc(self, blocks) -> None:
        for b in blocks:
            self.free_blocks.pop(b, None)

    def reset(self) -> None:
        """Forget every launch and freed block (after a synchronize: the cache starts over)."""
        self.pending.clear()
        self.free_blocks.clear()
