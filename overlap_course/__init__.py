"""overlap_course: the course built on ``toy_engine`` -- checks, figures, measurement, building.

The engine never imports this package.  Where things live:

* ``checks``   -- every ``check_...`` a notebook or exercise calls, and the verdicts they return;
* ``figures``  -- the timelines (to scale, in issue order), the explorer widget;
* ``measure``  -- the bench, the machine report and the contention meter;
* ``traces``   -- recorded quiet-machine runs, real PyTorch-profiler traces (Kineto) in and out;
* ``build``    -- exercises from ``source/``, notebook execution, slides, handout, nbgrader;
* ``progress`` -- each learner's verdicts on disk, and the hub service that collects them;
* ``explorer_app`` -- the kernels of the explorer app (``./run.sh explorer``).

Importing this package imports nothing else (the hub's progress service runs without torch);
``overlap_course.measure`` installs the contention meter's watch on engine runs, and
``checks`` and ``figures`` import it.
"""
