"""An OpenAI-compatible simulated LLM server for tests, demos and benchmarks.

It speaks ``POST /v1/chat/completions`` on loopback, injects the faults real providers
have (429 with retry headers, 5xx, hangs, broken JSON, chatty answers, quota
exhaustion, context overflow), enforces sliding-window RPM/TPM limits per API key
(optionally over a shorter window than the headers advertise, as providers do),
and counts every request so tests can prove that nothing was lost and how many LLM
calls were duplicated. Answers are deterministic and follow the labelling rules written
in the prompt, so a better prompt really scores better in a release gate.
See ``docs/simulator.md``.
"""

from lockgate.simulator.config import LatencyConfig, SimulatorConfig, load_config
from lockgate.simulator.runner import SimulatorHandle, serve, start
from lockgate.simulator.server import Simulator, build_app

__all__ = [
    "LatencyConfig",
    "Simulator",
    "SimulatorConfig",
    "SimulatorHandle",
    "build_app",
    "load_config",
    "serve",
    "start",
]
