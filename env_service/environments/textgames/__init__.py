"""What the suite adapters and text worlds share: seeded splits, the free-text action parser,
per-episode mapped/invalid counters, and the check that the suite's package is installed."""

from env_service.environments.textgames.base import SuiteEnvironment, TaskSplits, TextGameInstance, Turn
from env_service.environments.textgames.packages import require_package
from env_service.environments.textgames.parse import Parsed, extract_wrapped, match_choice

__all__ = ["Parsed", "SuiteEnvironment", "TaskSplits", "TextGameInstance", "Turn", "extract_wrapped",
           "match_choice", "require_package"]
