"""The outage policy of the service client base, against real HTTP servers on real sockets.

A peer that is down (nothing listens on its port) or starting (503) is waited for on /healthz and
the call sent again once it is back, within the outage budget; past it the error names the peer
and its log. The judge and experience peers degrade as documented when their service stays down.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from common.http import PeerUnavailable, ServiceCallError, ServiceClient
from common.schemas import ChatMessage, Step, Trajectory
from common.service import ServiceError, create_app
from tests.helpers import InProcessServer, free_port
from trainer.peers import JudgePeer, OutagePolicy, TaskPeer


def counting_service(ready: dict[str, bool] | None = None):
    """POST /v1/count applies once per request that reaches it; 503 while `ready['ok']` is False."""
    ready = ready if ready is not None else {"ok": True}
    app = create_app("counter", ready=lambda: ready["ok"])
    state = {"n": 0}

    @app.post("/v1/count")
    async def count():
        if not ready["ok"]:
            raise ServiceError(503, "starting", "not ready yet")
        state["n"] += 1
        return {"n": state["n"]}

    return app, state


async def test_calls_wait_for_a_peer_that_is_down_and_are_sent_once_it_is_back():
    port = free_port()
    app, state = counting_service()
    client = ServiceClient(f"http://127.0.0.1:{port}", peer="counter", outage_budget_s=60, backoff=0.01)
    # Five calls, none idempotent: refused connections were never sent, so each is sent again once.
    calls = [asyncio.create_task(client.post("/v1/count", json={})) for _ in range(5)]
    await asyncio.sleep(1.0)
    assert not any(c.done() for c in calls), "the calls wait while the peer is down"
    server = await asyncio.to_thread(InProcessServer(app, port=port).__enter__)
    try:
        results = await asyncio.wait_for(asyncio.gather(*calls), 30)
    finally:
        server.__exit__()
        await client.aclose()
    assert sorted(r["n"] for r in results) == [1, 2, 3, 4, 5] and state["n"] == 5, "each applied exactly once"
    c = client.outage_counters
    assert (c.outages, c.survived, c.retried_calls, c.gave_up) == (1, 1, 5, 0), "one outage, shared by five calls"
    assert c.waited_s >= 1.0


async def test_a_peer_still_down_after_the_budget_fails_naming_it_and_its_log():
    client = ServiceClient(f"http://127.0.0.1:{free_port()}", peer="task_manager", outage_budget_s=0.5,
                           log_hint="runs/x/logs/task_manager.log")
    with pytest.raises(PeerUnavailable) as err:
        await client.post("/v1/feedback", json={})
    await client.aclose()
    message = str(err.value)
    assert "task_manager" in message and "runs/x/logs/task_manager.log" in message and "outage budget" in message
    assert (client.outage_counters.outages, client.outage_counters.gave_up, client.outage_counters.survived) == (1, 1, 0)


async def test_a_starting_peer_answering_503_is_waited_for_without_a_budget_it_is_an_error():
    ready = {"ok": False}
    app, state = counting_service(ready)
    with InProcessServer(app) as server:
        plain = ServiceClient(server.url)
        with pytest.raises(ServiceCallError) as err:
            await plain.post("/v1/count", json={})
        assert err.value.status == 503 and plain.outage_counters.outages == 0
        await plain.aclose()
        patient = ServiceClient(server.url, peer="counter", outage_budget_s=60, backoff=0.01)
        call = asyncio.create_task(patient.post("/v1/count", json={}))
        await asyncio.sleep(0.8)
        assert not call.done() and state["n"] == 0
        ready["ok"] = True
        assert (await asyncio.wait_for(call, 30)) == {"n": 1}
        assert patient.outage_counters.survived == 1
        await patient.aclose()


def _trajectory(outcome: float, steps: int) -> Trajectory:
    return Trajectory(task_id="t", outcome=outcome, steps=[
        Step(index=i, action=ChatMessage(role="assistant", content=f"a{i}")) for i in range(steps)])


async def test_the_judge_down_past_its_wait_labels_by_the_outcome_sign_flagged_and_listed():
    judge = JudgePeer(f"http://127.0.0.1:{free_port()}",
                      outage=OutagePolicy(budget_s=120, judge_fallback_after_s=0.3, logs_dir="runs/x/logs"))
    won, lost, empty = _trajectory(1.0, 3), _trajectory(0.0, 2), _trajectory(1.0, 0)
    judgments = await judge.label([won, lost, empty])
    await judge.aclose()
    got_won, got_lost = judgments[won.trajectory_id], judgments[lost.trajectory_id]
    assert [x.label for x in got_won.labels] == ["GOOD"] * 3 and [x.label for x in got_lost.labels] == ["BAD"] * 2
    assert empty.trajectory_id not in judgments, "a rollout without steps has nothing to label"
    assert got_won.fallback and got_lost.fallback
    assert won.labels is None and not won.metadata, "the judge returns labels, the trajectories stay as they were"
    c = judge.counters
    assert (c.unreachable_batches, c.unreachable_trajectories, c.fallbacks, c.good, c.bad) == (1, 2, 2, 3, 2)
    assert c.labels_by_source == {"outcome": 5} and got_won.source == "outcome"
    assert judge.client.outage_counters.gave_up == 1
    [line] = judge.degradations()
    assert "judge" in line and "2 trajectories" in line and "outcome's sign" in line


async def test_task_feedback_cut_off_mid_call_is_not_sent_twice_and_is_listed():
    """A peer that takes the request and drops the connection: not idempotent, so not sent again."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    received = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            received.append(conn.recv(65536))
            conn.close()  # like a SIGKILL while handling it

    threading.Thread(target=serve, daemon=True).start()
    peer = TaskPeer(f"http://127.0.0.1:{listener.getsockname()[1]}", outage=OutagePolicy(budget_s=5))
    await peer.feedback([Trajectory(task_id="t1", outcome=1.0)], "flights")
    await peer.aclose()
    listener.close()
    assert len(received) == 1 and b"/v1/feedback" in received[0], "sent once, never again"
    assert peer.counters.feedback_uncertain == 1 and peer.counters.feedback_tasks == 0
    [line] = peer.degradations()
    assert "pass-rate feedback cut off mid-call" in line
