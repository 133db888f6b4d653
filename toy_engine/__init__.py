"""toy_engine: a small LLM inference engine that teaches overlapped scheduling.

    import toy_engine as te
    engine = te.Engine(te.EngineConfig(mode="zos"))
    print(engine.generate(["Once"], max_new_tokens=40)[0].text)

Start reading at ``loops.py`` (the serial and the overlapped loop), then ``stages.py``.
"""

from . import loops
from .config import EngineConfig
from .data import CharTokenizer
from .device import DeviceError
from .engine import Engine
from .model import GPTConfig, TinyGPT, load_model
from .races import RaceError
from .run import EngineStalled, StepState
from .runinfo import RunStats, TimelineMeta, Workload
from .sequence import Completion
from .timeline import Span, Stage, Timeline, owner_name

__all__ = ["CharTokenizer", "Completion", "DeviceError", "Engine", "EngineConfig", "EngineStalled", "GPTConfig",
           "RaceError", "RunStats", "Span", "Stage", "StepState", "Timeline", "TimelineMeta", "TinyGPT", "Workload",
           "load_model", "loops", "owner_name"]
