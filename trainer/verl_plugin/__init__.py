"""The evolver plugin for veRL 0.9.1: our estimators, loss, trainer and agent loop in veRL's registries.

veRL imports this module on `import verl` in every process, through the entry point
`[project.entry-points."verl.plugins"] evolver = "trainer.verl_plugin"` (or
`VERL_USE_EXTERNAL_MODULES=trainer.verl_plugin`). Names it registers:
- advantage estimators `evolver_<name>` for every estimator in our catalog (`evolver_grpo`,
  `evolver_adca_grpo`, `evolver_gigpo`, and any registered from outside) (`algorithm.adv_estimator`);
- policy loss `evolver_boosted` (`actor_rollout_ref.actor.policy_loss.loss_mode`);
- trainer `evolver_sync` (`trainer.v1.trainer_mode`);
- agent loop `evolver_env_agent` (`actor_rollout_ref.rollout.agent.default_agent_loop`).
`python -m trainer.verl_plugin overrides --conf RUN.yaml` prints the Hydra overrides of a run.
"""

from trainer.verl_plugin.registration import register_all

register_all()
