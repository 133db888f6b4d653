"""The labs of notebook 07 ("bugs that shipped"): overlap bugs that real engines shipped, brought
back through the toy's own plug-in points, so that each symptom comes from the engine's mechanics
(its outputs against the serial run's, its discarded rounds, its race checker), never from a print.

``shipped``: each bug as it shipped, the code a lab's learner cell starts from; ``plugins``: how a
learner's function goes into a run (a request's method, aborts before chosen rounds, a loop that
holds more rounds in flight, a ring of host slots of a chosen size).
"""

from . import plugins, plugins_2026, shipped, shipped_2026

__all__ = ["plugins", "plugins_2026", "shipped", "shipped_2026"]
