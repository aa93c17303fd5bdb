"""Verification: a proposal becomes a task only if its reference really works.

The reference is replayed in a fresh instance of the seed task, started with the proposal's own
query (as the trainer will start it). It is kept only when every action runs without an error
and, where the environment has a state, the state changed (and, for hindsight and multi-call proposals,
reached the goal the synthesizer saw; a multi-call task's reads must also still select what its query
describes). The replay's end state is stored for grading. A lookup (a question answered in text) is
checked by `lookups.verify_lookup` instead: same answer, unchanged state.
"""

from __future__ import annotations

from task_manager.envs import EnvAccess
from task_manager.lookups import verify_lookup
from task_manager.models import Proposal, Reference, canonical_hash
from task_manager.multicall import selection_kept
from task_manager.replay import replay


async def verify(access: EnvAccess, proposal: Proposal) -> tuple[Reference | None, str]:
    """(the verified reference, "ok") or (None, why it was rejected)."""
    if not proposal.actions:
        return None, "empty_reference"
    if proposal.lookup is not None:
        return await verify_lookup(access, proposal)
    result = await replay(access, proposal.env_type, proposal.seed_task_id, proposal.actions, query=proposal.query,
                          recorded_initial_state=proposal.recorded_initial_state,
                          recorded_observations=proposal.observations)
    if not result.ok:
        return None, "replay_error"
    end_state = None
    if result.end_state is not None:
        end_state = access.comparable(result.end_state)
        if end_state == access.comparable(result.initial_state):
            return None, "no_state_change"
        if proposal.goal_state is not None and end_state != proposal.goal_state:
            return None, "goal_not_reached"
    if proposal.selections and not selection_kept(proposal, result.observations):
        return None, "selection_changed"  # a multi-call task's query no longer describes what its reference does
    reference = Reference(actions=result.executed, calls=proposal.calls, observations=result.observations,
                          initial_state=result.initial_state, end_state=end_state,
                          end_state_hash=canonical_hash(end_state) if end_state is not None else None)
    return reference, "ok"
