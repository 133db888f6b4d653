"""Lesson 07's labs' workloads: the runs each lab judges a learner's fix on, as data (the prompts,
limits, stop strings, aborts, drafts and loop depths), and why each is there.  ``lab_runs`` runs
them on the shared engines (``pool``)."""

from __future__ import annotations

from dataclasses import dataclass

from toy_engine.config import MAX_SLOTS

from . import pool

# Prompts whose stories end (EOS) within a dozen tokens with the shipped model: after 11, 8, 12.
STORY_ENDS = ("nd they all lived happily ", " all lived happily eve", "so they lived happily")


@dataclass(frozen=True)
class PolicyRun:
    """Lab 1: one run a policy is judged on.  ``held``: the rounds its loop keeps in flight (0 the
    serial loop, 1 ZOS, more ``plugins.keep_in_flight`` on a ring one slot larger); ``drafts``:
    the speculative engine's draft tokens (0: none)."""

    max_new: int
    stop: tuple = ()
    held: int = 1
    prompts: tuple = tuple(pool.PROMPTS)
    drafts: int = 0
    aborts: tuple = ()  # (round, prompt): the engine's own abort just before that round's schedule

    @property
    def setting(self) -> str:
        """The run without its prompts, as a PASSED message lists every run (with their prompts,
        lab 1's six runs took most of a message's 800 characters)."""
        loop = {0: "the serial loop", 1: "ZOS"}.get(self.held, f"a loop holding {self.held} rounds")
        return (loop + (f" with {self.drafts} drafts" if self.drafts else "")
                + f", limit {self.max_new}"
                + (f", stop strings {list(self.stop)}" if self.stop else "")
                + (f", aborts (round, prompt) {list(self.aborts)}" if self.aborts else ""))

    def __str__(self) -> str:
        return self.setting + ("" if self.prompts == tuple(pool.PROMPTS)
                               else f", prompts {list(self.prompts)}")


# lab 1: the notebook's run; stop strings, stories that end (EOS) and an abort (prompt 1, a round
# in flight); a limit reached right after the prefill; a larger limit under the serial loop; three
# rounds in flight (a policy that assumes one, or caps them at two, fails there); drafts, whose
# runs end on the limit inside a round's accepted run
_ENDING = (*pool.PROMPTS[:2], *STORY_ENDS)
_ONE_BATCH = tuple(pool.PROMPTS[:3])
POLICY_RUNS = (PolicyRun(12), PolicyRun(12, (" the",), prompts=_ENDING, aborts=((5, 1),)),
               PolicyRun(2), PolicyRun(15, held=0, prompts=_ONE_BATCH),
               PolicyRun(12, held=3, prompts=_ONE_BATCH),
               PolicyRun(12, (" the",), prompts=(*pool.PROMPTS, *STORY_ENDS), drafts=3))


@dataclass(frozen=True)
class AbortRun:
    """Lab 2: one ZOS run with aborts, ``(round, prompt)`` each, made just before that round is
    scheduled (``drafts``: the engine's draft tokens, 0 for none)."""

    prompts: tuple
    aborts: tuple
    max_new: int = 12
    stop: tuple = (" the",)
    drafts: int = 0

    def __str__(self) -> str:
        return (f"ZOS {f'with {self.drafts} drafts' if self.drafts else 'without drafts'}, limit "
                f"{self.max_new}, stop strings {list(self.stop)}, aborts (round, prompt) "
                f"{list(self.aborts)}")


# lab 2. Without drafts: a waiting request; one in flight; the same again; one just prefilled; one
# its stop string finished, a round still in flight; a story that ends (EOS) after the aborts. With
# drafts: a waiting one; one EOS finished, its extra round in flight; one in flight; one its limit
# finished
ABORT_RUNS = (AbortRun((*pool.PROMPTS, "A little cat", STORY_ENDS[1]),
                       ((1, 4), (3, 1), (4, 1), (5, 3), (8, 0))),
              AbortRun((STORY_ENDS[1], "There was a fox", "One day, the little", STORY_ENDS[0],
                        "A little cat", "The bird said"), ((1, 5), (4, 0), (7, 3), (8, 2)),
                       drafts=pool.DRAFTS))
# lab 3: rounds a loop keeps in flight: every depth a ring of at most MAX_SLOTS serves, so that a
# rule wrong at one depth never passes, and one answer gets one verdict on every run
DEPTHS = tuple(range(1, MAX_SLOTS))
# a loop holding MAX_SLOTS - 1 rounds reaches round MAX_SLOTS, where a ring that size races; with
# drafts one limit falls inside a round's accepted run, one at its end
RING_NEW = MAX_SLOTS + 4
# lab 3's prompts: one ends on EOS, two on the limit, one on its stop string
RING_PROMPTS = (STORY_ENDS[1], "There was a fox", "One day, the little", "Once upon a time")
RING_STOP = ("re",)


@dataclass(frozen=True)
class CommitRun:
    """Lab 4: one ZOS run a commit is judged on (``drafts``: the engine's draft tokens, 0 for
    none)."""

    prompts: tuple
    max_new: int
    stop: tuple
    drafts: int = pool.DRAFTS

    def __str__(self) -> str:
        return (f"ZOS {f'with {self.drafts} drafts' if self.drafts else 'without drafts'}, limit "
                f"{self.max_new}, stop strings {list(self.stop)}")


# lab 4, with 3 drafts: stops inside a run and across two, limits inside a run and at a run's end;
# EOS inside a run, a stop on the limit's token; a stop string that a token past the limit, in the
# limit's own run, would complete (prompt 0: serial 12 tokens and "length"). Without drafts: one
# token a round, so every limit falls at a round's end; stops and stories that end
COMMIT_RUNS = (CommitRun(tuple(pool.PROMPTS), 30, (" was", ".")),
               CommitRun((*STORY_ENDS[:2], "One day, the little"), 28, (" the",)),
               CommitRun(tuple(pool.PROMPTS), 12, (" a",)),
               CommitRun((*pool.PROMPTS[:2], *STORY_ENDS), 12, (" the",), drafts=0),
               # round 16: the second stop string ends prompt 0 (", there was"), and " a" completes
               # in the same accepted run: checking stop[0] only, or cutting at the first stop in
               # list order, keeps " was"; " the" ends "The sun" at " came the", which
               # str.rstrip(" the") cuts to " cam" (characters, not the string)
               CommitRun((pool.PROMPTS[0], "Tom was happy"), 30, (" a", " was")),
               CommitRun(("The sun",), 30, (" the",)),
               # round 17: two stop strings end on one token, one the other's suffix. The engine
               # (`Request.commit`, one token at a time) cuts the first in the list: "as" before
               # " was" leaves prompt 0 ", there w" (a cut that takes the longest keeps ", there"),
               # " frog" before "og" leaves prompt 1 "" (one that takes the shortest keeps " fr");
               # "called" follows a space, which prompt 2 keeps (" "): a commit that strips it too
               CommitRun(tuple(pool.PROMPTS[:3]), 30, ("as", " was", " frog", "og", "called")))
