"""asyncrl: a single-machine, high-throughput asynchronous APPO engine."""
from .fork_server import start_early

start_early()  # before torch is imported here: the fork server imports it meanwhile

from .appo import APPO  # noqa: E402
from .config import Config, ConfigError  # noqa: E402
from .multiagent import SelfPlay  # noqa: E402
from .runner import WorkerError  # noqa: E402
from .vtrace import VTraceReturns, vtrace  # noqa: E402

__all__ = ["APPO", "Config", "ConfigError", "SelfPlay", "WorkerError", "VTraceReturns", "vtrace"]
__version__ = "0.1.0"
