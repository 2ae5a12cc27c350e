"""asyncrl: a single-machine, high-throughput asynchronous APPO engine."""
from .appo import APPO
from .config import Config, ConfigError
from .multiagent import SelfPlay
from .runner import WorkerError
from .vtrace import VTraceReturns, vtrace

__all__ = ["APPO", "Config", "ConfigError", "SelfPlay", "WorkerError", "VTraceReturns", "vtrace"]
__version__ = "0.1.0"
