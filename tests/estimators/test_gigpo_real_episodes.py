"""GiGPO on a batch built from real `flights` and `signal` episodes, against verl-agent's formula by hand.

verl-agent (mean_norm, its default): A_{i,t} = (R_i - mean_group R) + w * (G_{i,t} - mean_anchor G), where
G_{i,t} = sum_{k>=t} gamma^(k-t) r_{i,k} over the environment's own step rewards, a singleton anchor
group gets 0 and a task group of one keeps its raw score (mean 0, std 1). The environments put the
final score in the last step's reward, so the outcome must not be added on top of it.
"""

from __future__ import annotations

import pytest

from common.actions import ParsedCall
from common.schemas import ChatMessage, Step, Trajectory
from env_service.environments.base import EnvInstance, Environment
from env_service.environments.flights import FlightsEnvironment
from env_service.environments.flights.env import resolve_order_refs
from env_service.environments.signal import SignalEnvironment
from estimators import GigpoConfig, batch_from_trajectories, estimate

GAMMA = 0.9
CONFIG = GigpoConfig(gamma=GAMMA, step_weight=1.0, std="verl", normalize_by_std=False)


def play(env: Environment, task_id: str, actions, rollout: str, group: str) -> Trajectory:
    """Run one real episode; `actions(instance)` yields the assistant texts. Records what the trainer records."""
    instance: EnvInstance = env.create(task_id)
    instance.reset()
    steps = []
    for t, text in enumerate(actions(instance)):
        before = instance.state_hash()  # the state acted in (None where the environment has no state)
        result = instance.step(ChatMessage(role="assistant", content=text))
        steps.append(Step(index=t, action=ChatMessage(role="assistant", content=text), observation=result.observation,
                          reward=result.reward, done=result.done, state_hash=before))
    assert steps[-1].done
    outcome = instance.evaluate().score
    n = len(steps)
    return Trajectory(trajectory_id=rollout, task_id=task_id, group_id=group, steps=steps, outcome=outcome,
                      response_ids=list(range(2 * n)), loss_mask=[1, 1] * n,
                      step_ids=[t for t in range(n) for _ in (0, 1)])


@pytest.fixture(scope="module")
def episodes() -> list[Trajectory]:
    flights = FlightsEnvironment()
    task_id = next(t for t in flights.task_ids("train") if flights.task(t).kind == "book_cheapest")
    task = flights.task(task_id)

    def reference(instance):
        for name, arguments in task.reference:
            yield ParsedCall(name, resolve_order_refs(instance.desk, arguments)).to_python()
        yield "All done."

    def wrong_flight(instance):
        for name, arguments in task.reference:
            if name == "book_ticket":
                arguments = {**arguments, "flight_id": "NO-SUCH-FLIGHT"}
            yield ParsedCall(name, arguments).to_python()
        yield "All done."

    signal = SignalEnvironment()
    first, second = signal.task_ids("train")[:2]

    def answer(right: bool):
        def actions(instance):
            yield "Show me."
            yield instance.signal if right else next(o for o in instance.config.options if o != instance.signal)
        return actions

    return [
        play(flights, task_id, reference, "f-right", "flights"),
        play(flights, task_id, wrong_flight, "f-wrong", "flights"),
        play(signal, first, answer(True), "s-right-1", "signal"),
        play(signal, first, answer(False), "s-wrong", "signal"),
        play(signal, first, answer(True), "s-right-2", "signal"),
        play(signal, second, answer(True), "alone", "signal-alone"),
    ]


def test_the_environments_put_the_final_score_in_the_last_step_reward(episodes):
    assert [[s.reward for s in t.steps] for t in episodes] == [
        [0, 0, 0, 1], [0, 0, 0, 0], [0, 1], [0, 0], [0, 1], [0, 1]]
    assert [t.outcome for t in episodes] == [1, 0, 1, 0, 1, 1]


def test_gigpo_matches_verl_agents_formula_by_hand(episodes):
    result = estimate("gigpo", batch_from_trajectories(episodes), CONFIG)

    # flights: reads and a failed booking leave the state as it was, so steps 0-2 of the right rollout and
    # all 4 of the wrong one act in the initial state; the right one's last step acts after its booking
    # (a singleton: 0). Returns: right [.729, .81, .9, 1], wrong [0, 0, 0, 0]; anchor mean 2.439 / 7.
    h0 = (0.729 + 0.81 + 0.9) / 7
    f_right = [0.5 + 0.729 - h0, 0.5 + 0.81 - h0, 0.5 + 0.9 - h0, 0.5]
    f_wrong = [-0.5 - h0] * 4
    # signal: outcome mean 2/3; step 0 anchor (initial) returns {.9, 0, .9} mean .6; step 1 anchor (the
    # same cue) returns {1, 0, 1} mean 2/3.
    s_right = [1 / 3 + 0.9 - 0.6, 1 / 3 + 1 - 2 / 3]
    s_wrong = [-2 / 3 - 0.6, -2 / 3 - 2 / 3]
    # A task group of one keeps its raw score (verl-agent's mean 0, std 1); its anchors are singletons.
    alone = [1.0, 1.0]
    want = [f_right, f_wrong, s_right, s_wrong, s_right, alone]
    for got, expected in zip(result.step_advantages, want, strict=True):
        assert got == pytest.approx(expected, abs=1e-6)
