"""Regression gates: a candidate run against a reference record or its fingerprint's history, per arm and figure,
judged against tolerances and the measured noise (`spectrial gate`, docs/GATES.md)."""

from spectrial.gate.params import GateTolerances, load_tolerances
from spectrial.gate.run import run_gate

__all__ = ["GateTolerances", "load_tolerances", "run_gate"]
