"""Put our estimators, policy loss, trainer and agent loop into veRL's registries.

Each registration is attempted on its own and a failure is logged, never raised: this runs inside
`import verl` in every Ray process of a veRL job, and a broken plugin must not take veRL down
(the job then fails later, on the name it cannot find, with veRL's own message).
"""

from __future__ import annotations

from collections.abc import Callable

from loguru import logger

from trainer.verl_plugin.settings import VERL_AGENT_LOOP, VERL_POLICY_LOSS, VERL_TRAINER

# name -> error text of the registrations that failed in this process (for diagnostics and tests).
FAILED: dict[str, str] = {}
REGISTERED: list[str] = []


def _register_estimators() -> None:
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    from estimators import catalog
    from trainer.verl_plugin.estimators import make_verl_estimator

    # Every estimator in our catalog (built in, entry points, registered before `import verl`), by derived name.
    for ours, theirs in ((name, catalog.verl_name(name)) for name in catalog.names()):
        existing = ADV_ESTIMATOR_REGISTRY.get(theirs)
        if existing is not None and existing.__module__ == make_verl_estimator.__module__:
            continue  # already ours (a second load, e.g. entry point and VERL_USE_EXTERNAL_MODULES)
        _attempt(f"adv_estimator:{theirs}", lambda ours=ours, theirs=theirs:
                 register_adv_est(theirs)(make_verl_estimator(ours)))


def _register_policy_loss() -> None:
    from verl.trainer.ppo.core_algos import register_policy_loss

    from trainer.verl_plugin.loss import evolver_boosted

    register_policy_loss(VERL_POLICY_LOSS)(evolver_boosted)


def _register_trainer() -> None:
    import trainer.verl_plugin.trainer  # noqa: F401  (the module registers `evolver_sync` on import)


def _register_agent_loop() -> None:
    import trainer.verl_plugin.agent_loop  # noqa: F401  (registers `evolver_env_agent` on import)


def _attempt(name: str, register: Callable[[], object]) -> None:
    try:
        register()
    except Exception as exc:  # a plugin must never break `import verl`
        FAILED[name] = f"{type(exc).__name__}: {exc}"
        logger.warning("evolver veRL plugin: registering {} failed ({}); veRL continues without it", name,
                       FAILED[name])
    else:
        REGISTERED.append(name)


def register_all() -> None:
    """Every registration, each isolated from the others' failures."""
    _attempt("adv_estimators", _register_estimators)
    _attempt(f"policy_loss:{VERL_POLICY_LOSS}", _register_policy_loss)
    _attempt(f"trainer:{VERL_TRAINER}", _register_trainer)
    _attempt(f"agent_loop:{VERL_AGENT_LOOP}", _register_agent_loop)
