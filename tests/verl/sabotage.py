"""Loaded before the plugin (VERL_USE_EXTERNAL_MODULES=tests.verl.sabotage,trainer.verl_plugin) to break
two of its registrations on purpose: `evolver_grpo` is already taken by another function, and the
agent-loop module cannot be imported. The plugin must log both and register everything else."""

import sys

from verl.trainer.ppo.core_algos import register_adv_est


@register_adv_est("evolver_grpo")
def someone_elses_grpo(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    raise AssertionError("never called")


sys.modules["trainer.verl_plugin.agent_loop"] = None  # importing it now raises ImportError
