"""The scenario simulator: whole verl runs (logs, GPU and host telemetry, truth) on demand.

``SimRun`` (engine.py) plans a run; ``LiveSim`` (live.py) plays one into a log file in real
time; ``SCENARIOS``/``list_scenarios`` (scenarios.py) name what can be injected.
"""

from monitor.sim.engine import SimRun, SimStep
from monitor.sim.scenarios import SCENARIOS, SCRIPTS, list_scenarios

__all__ = ["SCENARIOS", "SCRIPTS", "SimRun", "SimStep", "list_scenarios"]
