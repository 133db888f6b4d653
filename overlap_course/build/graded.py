"""What is graded, and how: each exercise's checks and their points, the cell that calls each
check on the learner's answer, and the arguments that are not the answer.  Apart from
:mod:`overlap_course.build.grading` (nbgrader's course) so that a judge process
(:mod:`~overlap_course.build.judge_process`) reads them without importing what that module
needs: ``nbformat`` imports ``jsonschema``, whose format checkers build a grammar when imported
(2.4 s at a load of 4 and 5.0 s at 9 on the 2-core machine this course is built on, measured
2026-12-05), paid before every judged check."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Points per check: the exercise's graded checker cells, by the check each calls.
POINTS = {
    "02_serial_loop": {"check_serial_loop": 3, "check_idle_fraction": 2},
    "03_zos_loop": {"check_zos_loop": 4, "check_three_rounds": 2},
    "04_seqlen_correction": {"check_correction": 4, "check_metadata_answer": 2},
    "05_lifetime": {"check_process_outputs": 4},
}
# The graded cell of a check: the one that calls it on the learner's own answer (not a demo
# such as ``forgetful_loop``, nor the summary cell at the end).
GRADED_CALLS = {
    "check_serial_loop": "checks.check_serial_loop(serial_loop)",
    "check_idle_fraction": "checks.check_idle_fraction(idle_fraction, engine)",
    "check_zos_loop": "checks.check_zos_loop(zos_loop)",
    "check_three_rounds": "checks.check_three_rounds(order)",
    "check_correction": "checks.check_correction(correct_seqlens_qk)",
    "check_metadata_answer": "checks.check_metadata_answer(needs_correction)",
    "check_process_outputs": "checks.check_process_outputs(process_outputs)",
}
# Answers that are values, not code: the judge reads them out of the learner's cells in one
# process and checks them in another, so no line of the submission runs beside that checker.
VALUE_ANSWERS = {"order", "needs_correction"}
# Arguments of a graded call that are not the learner's answer, and the toy class each must be.
CONTEXT_TYPES = {"engine": "Engine"}
# The run each of them stands for, as its notebook's cell makes it.  The judge makes its own:
# the submission's cells could reshape their engine's timeline and stats until a wrong answer
# fits them.
CONTEXT_RUNS = {"engine": {"config": {"mode": "serial", "max_batch_size": 4},
                           "prompts": ["Once upon a time", "The bird said", "There was a fox"],
                           "max_new_tokens": 24}}
