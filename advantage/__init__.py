"""Self-attributing: advantage estimators and the LLM-judge service.

- `advantage.estimators`: GRPO, ADCA-GRPO and GiGPO as pure torch/numpy functions behind a
  registry (`compute_advantages(name, batch, config)`), shared by the local trainer and the
  veRL plugin.
- `advantage.judge`: the step-labelling service (`python -m advantage.judge --port PORT`).
- `advantage.client`: the typed client other packages use to call the judge.

This module imports nothing heavy so the judge service starts without torch.
"""
