"""The course's figures of engine timelines, and of when overlap pays: ``from overlap_course import figures``.

* ``scale``    -- the to-scale view (:func:`timeline_figure`, :func:`compare_figure`);
* ``order``    -- the order view (:func:`order_figure`, :func:`issued_order`);
* ``explorer`` -- :class:`TimelineExplorer`, a live engine in widgets;
* ``payoff``   -- when overlap pays: the ideal speed-up against the host's share of a round, with
  published numbers and the learner's own (:func:`payoff_figure`, :class:`PayoffExplorer`);
* ``palette``  -- stage colours and patterns; ``layout`` what the views share;
  ``rounds`` which rounds a figure shows; ``config`` Plotly's configuration and HTML files.

The timeline figures only read a :class:`~toy_engine.timeline.Timeline`, so they work the same for a
run recorded a second ago, a shipped trace (:func:`load_trace`) or a hand-made timeline.
"""

from overlap_course.traces.recorded import available_traces, load_trace

from .config import configure_renderers, save_html
from .explorer import TimelineExplorer
from .order import issued_order, order_figure
from .palette import STAGE_COLORS
from .payoff import PayoffExplorer, payoff_figure
from .rounds import default_first_round
from .scale import compare_figure, timeline_figure

__all__ = ["STAGE_COLORS", "timeline_figure", "compare_figure", "order_figure", "issued_order",
           "save_html", "load_trace", "available_traces", "default_first_round", "TimelineExplorer",
           "payoff_figure", "PayoffExplorer"]

configure_renderers()  # no cloud-share button in any figure, and notebooks store figure data only
