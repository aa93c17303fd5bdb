"""The trainer: rollouts with exact tokens, the local GRPO trainer on Ray, the veRL plugin, evaluation."""
