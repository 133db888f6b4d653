"""toy_engine: a small LLM inference engine that teaches asynchronous scheduling.

    import toy_engine as te
    engine = te.Engine(te.EngineConfig(mode="zos"))
    print(engine.generate(["Once"], max_new_tokens=40)[0].text)
"""

from .data import CharTokenizer
from .device import DeviceError
from .engine import Engine, EngineConfig, EngineStalled, StepState
from .model import GPTConfig, TinyGPT, load_model
from .races import RaceError
from .sequence import Completion
from .timeline import Span, Timeline

__all__ = ["CharTokenizer", "Completion", "DeviceError", "Engine", "EngineConfig", "EngineStalled",
           "GPTConfig", "RaceError", "Span", "StepState", "Timeline", "TinyGPT", "load_model"]
