"""Continuous batching: which requests run in the next round, and where their KV lives."""

from collections import deque
from dataclasses import dataclass, field

from .sequence import Request
from .validate import shown


class BlockManager:
    """Fixed-size KV-cache blocks; a request reserves all it can need when admitted (no preemption).
    ``on_alloc``/``on_free`` tell the race checker, which may refuse a free before anything changes."""

    def __init__(self, num_blocks: int, block_size: int, on_alloc, on_free):
        self.block_size = block_size
        self.free_ids = deque(range(num_blocks))
        self.on_alloc, self.on_free = on_alloc, on_free
        self.callbacks = {"on_alloc": on_alloc, "on_free": on_free}  # as the engine set them

    def blocks_needed(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def can_allocate(self, n: int) -> bool:
        return len(self.free_ids) >= n

    def allocate(self, n: int) -> list[int]:
        blocks = [self.free_ids.popleft() for _ in range(n)]
        self.on_alloc(blocks)
        return blocks

    def free(self, blocks: list[int], prompt: int) -> None:
        self.on_free(blocks, prompt, sorted(set(blocks) & set(self.free_ids)))
        self.free_ids.extend(blocks)

    def refuse_second_free(self, blocks: list[int], prompt: int) -> None:
        """Request ``prompt`` frees again the ``blocks`` it gave back, whoever holds them now:
        ``on_free`` is told they are all freed twice, which the race checker refuses (RaceError
        "double_free", checking on or off) and the record keeps; nothing is put back."""
        self.on_free(blocks, prompt, sorted(blocks))


@dataclass
class Plan:
    """One round's work: a prefill of newly admitted requests, or a decode of running ones."""

    round: int
    is_prefill: bool
    requests: list[Request]
    run: object = field(default=None, repr=False, compare=False)  # the run that scheduled it

    def __setattr__(self, name, value) -> None:
        """Its round and kind are set once, as planned: the stages find and size the round's
        inputs and results by them (vars() gets around this: ``Run.check_plan`` checks)."""
        if name in ("round", "is_prefill") and name in vars(self):
            who = self.run.who() if hasattr(type(self.run), "who") else "the loop"
            raise AttributeError(
                f"{who} set plan.{name} of round {self.round} to {shown(value)}: a plan's round "
                f"and kind are the engine's, as engine.schedule() planned it (the stages find "
                f"and size the round's inputs and results by them), and one changed would hand "
                f"another round's tokens out as this one's; read them, never change them")
        object.__setattr__(self, name, value)

    def snapshot(self) -> tuple:
        """Its round, kind and requests (by identity, in order): what stages check unchanged."""
        return (self.round, self.is_prefill, [id(r) for r in self.requests]
                if type(self.requests) is list else self.requests)


class Scheduler:
    """FIFO admission limited by batch size and KV capacity; prefill before decode."""

    def __init__(self, max_batch_size: int, blocks: BlockManager, num_draft_tokens: int = 0):
        self.blocks = blocks
        self.num_draft_tokens = num_draft_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted, holding a row and blocks
        self.freed: dict[int, list[int]] = {}  # request id -> the blocks it gave back
        self.free_rows = list(range(max_batch_size))
        self.placed: dict[int, tuple[int, list[int]]] = {}  # id(request) -> its row and blocks
        self._admitted: dict[int, tuple] = {}  # the engine's own copy of placed: check_pool
        self.round = 0

    def positions_needed(self, req: Request) -> int:
        """Cache positions a request may touch: prompt, new tokens, drafts of two rounds."""
        return len(req.prompt_ids) + req.max_new_tokens + 2 * self.num_draft_tokens

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def check_queue(self, of_the_run: dict) -> None:
        """Refuse a queue no round can be planned from (round 44: a bare KeyError, or a double
        free blamed on the learner): a request not of this run (``of_the_run``: its requests by
        id), a copy of one, one queued twice, or one admitted and freed before.  (One that ended
        while it waited is lab 2's mistake: its checker reads what planning it does.)
        First, each of the scheduler's own fields must still be of its kind (round 47:
        ``placed = None`` met a bare TypeError deep in the engine)."""
        for name, kind in _KINDS:
            if type(value := _field(self, name)) is not kind:
                raise RuntimeError(f"engine.scheduler.{name} was replaced by {shown(value)}: it "
                                   f"is the engine's own {kind.__name__}, which the engine "
                                   f"keeps up to date; read it, never replace it")
        seen = set()
        for req in [*self.waiting, *self.running]:
            if id(req) not in of_the_run:
                what = f"request {shown(req.id)}" if isinstance(req, Request) else shown(req)
                raise RuntimeError(f"{what} is not one of this run's requests: a run plans "
                                   f"only the requests its generate call was given; a new "
                                   f"prompt needs a generate call of its own, not a place in "
                                   f"engine.scheduler's queues")
            if id(req) in seen:
                raise RuntimeError(f"request {req.id} is queued twice: generate queues each "
                                   f"request once, and engine.schedule() plans them")
            seen.add(id(req))
        for req in self.waiting:
            if req.id in self.freed:
                raise RuntimeError(f"request {req.id} was admitted and freed already: the toy "
                                   f"admits a request once (it has no preemption to start one "
                                   f"over)")

    def check_pool(self, rows: int, blocks: int, who: str) -> None:
        """Refuse rows or KV blocks that are not where the engine put them (``rows`` and
        ``blocks``: the engine's counts, from its config).  Round 46: free rows written as
        ``[0, 0]`` put two requests in one row, and their text went wrong silently, in that run
        and the next; a block out of range failed deep in a kernel.  Round 47: two running
        requests in one row (``placed`` cleared first), or holding one block, or a running one
        listed as freed, did the same.  Each row and block is a whole number in range, held by
        one running request or free, once; a running request's place is in ``placed``."""
        self._check_places(who)
        held_rows = [req.row for req in self.running]
        held_blocks = [b for req in self.running if not req.finished for b in req.blocks]
        for name, ids, count in (("free_rows", self.free_rows, rows),
                                 ("blocks.free_ids", self.blocks.free_ids, blocks)):
            held = held_rows if name == "free_rows" else held_blocks
            every = [*ids, *held]  # free, then held by the running requests (checked above)
            if {type(x) for x in ids} - {int}:
                why = "each must be an int"
            elif min(every, default=0) < 0 or max(every, default=0) >= count:
                why = f"each must be between 0 and {count - 1}"
            elif len(set(every)) != len(every):
                twice = sorted(x for x in every if every.count(x) > 1)[0]
                how = "listed twice" if ids.count(twice) > 1 else "held twice, or free and held"
                why = f"each must be free once or held by one running request ({twice} is {how})"
            else:
                continue
            self._refuse(name, ids, who, why)

    def _check_places(self, who: str) -> None:
        """Each running request where the engine put it, as ``placed`` says, and not freed
        (round 47: two swapped, ``placed`` rewritten to match, wrote each one's tokens with the
        other's state; round 48: a finished one's blocks made an int met a bare TypeError); the
        race checker's callbacks the engine's (round 48: ``on_alloc`` replaced blamed a free)."""
        for name in ("on_alloc", "on_free"):
            if getattr(self.blocks, name) is not self.blocks.callbacks[name]:
                self._refuse(f"blocks.{name}", getattr(self.blocks, name), who, "it is the "
                             "engine's: it tells the race checker which blocks are in use")
        for req in self.running:
            if id(req) not in self._admitted:
                raise RuntimeError(f"request {req.id} was admitted outside engine.schedule() "
                                   f"(engine.scheduler.plan_round() called by hand?): a round "
                                   f"is planned by plan = engine.schedule()")
            row, blocks = self._admitted[id(req)]
            listed = type(req.blocks) is list and not {type(b) for b in req.blocks} - {int}
            # a finished one's blocks may be given back by hand: lesson 5 judges how (as
            # check_fields leaves them), so only its row is compared
            if type(req.row) is not int or req.row != row or not listed or (
                    not req.finished and tuple(req.blocks) != blocks):
                raise RuntimeError(f"prompt {req.index}'s place was changed {who}: the engine "
                                   f"put it in row {row} with KV blocks {list(blocks)}, and it "
                                   f"now says row {shown(req.row)}, blocks {shown(req.blocks)}. "
                                   f"A request's row and blocks are the engine's: read them, "
                                   f"never write them")
        for req in self.running:  # then the scheduler's own record of them
            row, blocks = self._admitted[id(req)]
            if self.placed.get(id(req)) != (row, list(blocks)):
                self._refuse("placed", self.placed, who, f"it must hold each running request's "
                             f"row and blocks (prompt {req.index}'s: row {row}, blocks "
                             f"{list(blocks)})")
            if req.id in self.freed:
                self._refuse("freed", self.freed, who, f"a running request is never in it "
                             f"(request {req.id} is)")

    def _refuse(self, name: str, value, who: str, why: str) -> None:
        raise RuntimeError(f"engine.scheduler.{name} was changed "
                           f"{who}: it holds {shown(value)}, but {why}. Rows and KV blocks are "
                           f"the engine's to hand out, and engine.scheduler.free(req) gives a "
                           f"finished request's back: read them, never write them")

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> None:
        """Refused: a round is planned by ``engine.schedule()``, at the engine's round boundary
        (queued aborts applied, ``on_round`` called), which this would skip silently."""
        raise RuntimeError("engine.scheduler.schedule() plans a round behind the engine's back: "
                           "engine.schedule() plans it at the round boundary, where aborts from "
                           "other threads are applied and on_round plug-ins (plugins.aborts, "
                           "per_request) run. Call plan = engine.schedule() in your loop")

    def plan_round(self) -> Plan | None:
        """The next round's plan (``engine.schedule()`` calls it), or None when nothing can run
        until results land (or nothing is left); telling those apart is the run's business."""
        admitted = []
        while self.waiting and self.free_rows:
            req = self.waiting[0]
            n = self.blocks.blocks_needed(self.positions_needed(req))
            if not self.blocks.can_allocate(n):
                break
            self.waiting.popleft()
            req.blocks, req.row = self.blocks.allocate(n), self.free_rows.pop(0)
            self.placed[id(req)] = (req.row, list(req.blocks))
            admitted.append(req)
        self.running += admitted
        if admitted:
            plan = Plan(self.round, True, admitted)
        else:
            decodes = [r for r in self.running if r.wants_more()]
            if not decodes:
                return None
            plan = Plan(self.round, False, decodes)
        for req in plan.requests:
            req.num_inflight += 1
        self.round += 1
        return plan

    def note_admitted(self, plan: Plan | None) -> Plan | None:
        """``plan``, once the engine's own copy of where a prefill put its requests is kept
        (``check_pool`` compares: ``placed`` is the learner's to read, and can be written)."""
        if plan is not None and plan.is_prefill:
            self._admitted.update((id(r), (r.row, tuple(r.blocks))) for r in plan.requests)
        return plan

    def abort(self, req: Request) -> None:
        """End ``req`` as aborted (a finished one keeps its reason): a waiting one never starts, a
        running one is freed once no launched round can touch its cache."""
        if not req.finished:
            req.finish_reason = "abort"
            if req in self.waiting:
                self.waiting.remove(req)
            self.release_if_done(req)

    def release_if_done(self, req: Request) -> None:
        """Free a finished request once no launched round can touch its cache, if it still holds
        it: called again (a second abort), it frees nothing, where ``free`` refuses."""
        if req.finished and req.num_inflight == 0 and req in self.running:
            self.free(req)

    def free(self, req: Request) -> None:
        """Give a request's row and KV blocks back (the race checker sees the blocks go).  A
        second free of a request is refused (RaceError "double_free"): a pool that took its
        blocks back twice would hand them to two requests.  One never admitted holds nothing."""
        if req.id in self.freed:
            self.blocks.refuse_second_free(self.freed[req.id], req.index)
        if req in self.running:
            blocks = req.blocks
            self.blocks.free(blocks, req.index)  # may raise RaceError: change nothing before
            self.running.remove(req)
            self.free_rows.append(req.row)
            self.free_rows.sort()
            req.blocks, req.row = [], -1
            self.placed.pop(id(req), None)
            self._admitted.pop(id(req), None)
            self.freed[req.id] = blocks



def whole(s, fresh: Scheduler) -> bool:
    """Whether ``s`` can start a run as ``fresh`` (a new scheduler, the engine's) would: its own
    classes and containers, its settings and the race checker's callbacks, nothing queued or
    placed, every row and KV block free once.  A loop that set ``engine.scheduler.waiting = ()``
    or the scheduler to None left the next generate failing (round 45); one that wrote
    ``free_rows = [0, 0]`` or replaced ``on_free`` after its work left every later run's text
    wrong (round 46): the engine then starts the next run on a new one.  A method set on the
    instance stays (notebook 05 spies on ``free`` so)."""
    b, new = getattr(s, "blocks", None), fresh.blocks
    if type(s) is not Scheduler or any(type(_field(s, name)) is not kind for name, kind in _KINDS):
        return False
    same = [(s.num_draft_tokens, fresh.num_draft_tokens), (b.block_size, new.block_size),
            (b.on_alloc, new.on_alloc), (b.on_free, new.on_free)]
    return (all(type(x) is type(y) and x == y for x, y in same)
            and not s.waiting and not s.running and not s.placed
            and not {type(x) for x in [*s.free_rows, *b.free_ids]} - {int}
            and s.free_rows == fresh.free_rows and sorted(b.free_ids) == [*new.free_ids])


# The scheduler's containers, each of its kind (``check_queue``, ``whole``)
_KINDS = (("waiting", deque), ("running", list), ("free_rows", list), ("placed", dict),
          ("freed", dict), ("blocks", BlockManager), ("blocks.free_ids", deque))


def _field(s, name: str):
    """A scheduler's field by its dotted name (``blocks`` is checked before ``blocks.free_ids``)."""
    owner, _, attr = name.rpartition(".")
    return getattr(getattr(s, owner) if owner else s, attr, None)
