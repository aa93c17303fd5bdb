"""The conformance kit: `python -m env_service.conformance --url URL --env NAME [--episodes N]`.

Checks any env server (ours, AgentEvolver's, or a user's) for one environment: protocol shapes
of both APIs where offered, random-agent episodes, concurrent instances, release and leaks,
timeouts and error shapes. See `kit.py` for the list of checks.
"""

from .kit import CheckResult, ConformanceKit, Report, run_conformance

__all__ = ["CheckResult", "ConformanceKit", "Report", "run_conformance"]
