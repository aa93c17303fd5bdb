"""A plan that spans hosts: each service's peers get the address it advertises, a head others can join, and one
bearer token per run. 127.0.0.2 and 127.0.0.3 stand for two hosts; nothing is started and nothing is sent."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from common.config import ConfigError, compose
from evolver_launcher.plan import build_plan
from evolver_launcher.ray_services import fill_address
from launcher import describe_plan
from tests.helpers import REPO

QUICKSTART = REPO / "examples" / "quickstart.yaml"
HOST_A, HOST_B = "127.0.0.2", "127.0.0.3"


def urls_in(node: Any, path: str = "") -> dict[str, str]:
    """Every URL-valued setting of the resolved config, by key path."""
    found: dict[str, str] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            found.update(urls_in(value, f"{path}.{key}" if path else str(key)))
    elif isinstance(node, str) and re.match(r"https?://", node):
        found[path] = node
    return found


def quickstart_on_two_hosts(**launcher: Any) -> dict[str, Any]:
    raw = compose(QUICKSTART)
    raw["launcher"].update({
        "runs_dir": "/tmp/evolver-multinode-plan", "studio": {"enabled": True},
        "hosts": {"llm_server": HOST_A, "env_service": HOST_A, "task_manager": HOST_B,
                  "experience_manager": HOST_B, "judge": HOST_B, "studio": HOST_B},
        **launcher})
    raw["launcher"]["ray"] = {**raw["launcher"]["ray"], "node_address": HOST_A, "dashboard_port": "auto",
                              "labels": {"evolver/role": "head"}, "resources": {"trainer_node": 1}}
    raw["trainer"]["policy"] = {"kind": "endpoint", "url": "llm_server"}  # the policy served by llm_server
    return raw


def test_every_peer_url_uses_the_address_its_service_binds_never_127_0_0_1():
    plan = build_plan(quickstart_on_two_hosts(), QUICKSTART)
    urls = urls_in(plan.data)
    expected = {"trainer.services.env_url": HOST_A, "trainer.services.task_url": HOST_B,
                "trainer.services.experience_url": HOST_B, "trainer.services.judge_url": HOST_B,
                "trainer.policy.url": HOST_A, "task_manager.env_url": HOST_A, "judge.task_manager_url": HOST_B}
    for key, host in expected.items():
        assert urls[key].startswith(f"http://{host}:"), (key, urls[key])
    roles = {k: v for k, v in urls.items() if k.endswith("base_url")}
    assert roles and all(v.startswith(f"http://{HOST_A}:") for v in roles.values()), roles  # the bundled server
    assert not [k for k, v in urls.items() if "127.0.0.1" in v], urls
    for child in plan.children:
        if child.name not in ("ray", "trainer"):
            bind = child.argv[child.argv.index("--host") + 1]
            assert bind in (HOST_A, HOST_B) and child.health_url.startswith(f"http://{bind}:")
    assert plan.studio_url.startswith(f"http://{HOST_B}:")
    # The head listens where other nodes reach it; the trainer and the workers join it there.
    ray = plan.child("ray").argv
    assert ray[ray.index("--node-ip-address") + 1] == HOST_A
    assert ray[ray.index("--labels") + 1] == "evolver/role=head"
    assert json.loads(ray[ray.index("--resources") + 1]) == {"trainer_node": 1}
    assert plan.ray.address.startswith(f"{HOST_A}:") and plan.data["trainer"]["ray"]["address"] == plan.ray.address
    assert f"ray start --address={plan.ray.address}" in describe_plan(plan)
    assert plan.token is None  # loopback only: the token stays optional
    # One machine: the server loads the trainer's weights file by its path.
    assert plan.data["llm_server"]["weights_dir"] == plan.data["trainer"]["output_dir"] + "/weights"


def test_a_wildcard_bind_advertises_the_node_address_and_the_run_gets_one_token():
    raw = quickstart_on_two_hosts(host="0.0.0.0", hosts={}, node_address=HOST_B,
                                  advertise={"judge": "judge.internal", "llm_server": "llm.internal"})
    plan = build_plan(raw, QUICKSTART, environ={})
    urls = urls_in(plan.data)
    assert urls["trainer.services.env_url"].startswith(f"http://{HOST_B}:")
    assert urls["trainer.services.judge_url"].startswith("http://judge.internal:")
    assert not [k for k, v in urls.items() if "127.0.0.1" in v or "0.0.0.0" in v], urls
    assert plan.child("env_service").health_url.startswith("http://127.0.0.1:")  # the launcher's own probe
    # Off loopback a token is required: one is made for the run and every child gets the same one.
    assert plan.token is not None and plan.token.source == "generated" and len(plan.token.value) >= 32
    assert {c.env.get("EVOLVER_API_TOKEN") for c in plan.children} == {plan.token.value}
    assert plan.token.value not in repr(plan.data) and plan.token.value not in describe_plan(plan)
    # Roles on the bundled server and the trainer's policy send it.
    assert plan.data["judge"]["llm"]["api_key_env"] == "EVOLVER_API_TOKEN"
    assert plan.data["trainer"]["policy"]["api_key_env"] == "EVOLVER_API_TOKEN"
    # The policy server is off loopback: weights travel as the upload's body, through no shared folder.
    assert plan.data["trainer"]["policy"]["url"].startswith("http://llm.internal:")
    assert not plan.data["llm_server"]["weights_dir"].startswith(plan.data["trainer"]["output_dir"])
    again = build_plan(quickstart_on_two_hosts(host="0.0.0.0", hosts={}, node_address=HOST_B), QUICKSTART,
                       environ={"EVOLVER_API_TOKEN": "from-the-user"})
    assert again.token.source == "environment" and again.child("judge").env["EVOLVER_API_TOKEN"] == "from-the-user"


def test_a_misnamed_host_key_is_refused_with_its_path():
    raw = quickstart_on_two_hosts()
    raw["launcher"]["hosts"]["trainr"] = HOST_A
    with pytest.raises(ConfigError, match=r"launcher\.hosts\.trainr"):
        build_plan(raw, QUICKSTART)


def test_a_placed_service_waits_for_its_node_address_and_keeps_its_store_there():
    raw = quickstart_on_two_hosts(hosts={}, placement={
        "task_manager": {"node_labels": {"evolver/role": "services"}},
        "judge": {"resources": {"judge_node": 1}, "store_root": "/srv/evolver"}})
    plan = build_plan(raw, QUICKSTART, environ={})
    urls = urls_in(plan.data)
    # Peers' URLs for a placed service name a placeholder that the launcher fills in once Ray placed it.
    assert urls["trainer.services.task_url"].startswith("http://task_manager.ray-placed.invalid:")
    assert urls["judge.task_manager_url"].startswith("http://task_manager.ray-placed.invalid:")
    assert urls["trainer.services.judge_url"].startswith("http://judge.ray-placed.invalid:")
    # Its state paths resolve on its node; a service that reads a placed peer's URL starts after it.
    assert plan.data["task_manager"]["store_dir"] == "<node store>/task_manager"
    assert plan.data["judge"]["audit_log"] == "<node store>/judge/audit.jsonl"
    assert "task_manager" in plan.child("judge").depends_on
    assert plan.child("judge").placement.resources == {"judge_node": 1}
    assert plan.child("experience_manager").placement is None
    assert plan.token is not None  # a placed service binds an address the plan cannot know: guarded
    text = describe_plan(plan)
    assert "runs in a Ray actor on a node with {'evolver/role': 'services'}" in text


def test_a_placed_llm_server_gets_the_weights_by_upload_into_a_folder_on_its_node():
    raw = quickstart_on_two_hosts(hosts={}, placement={"llm_server": {"node_labels": {"evolver/role": "gpu"}},
                                                       "task_manager": {"node_labels": {"evolver/role": "services"}}})
    raw["task_manager"]["llm"] = {"synthesizer": {"base_url": "llm_server"}}
    plan = build_plan(raw, QUICKSTART, environ={})
    placeholder = "http://llm_server.ray-placed.invalid:"
    policy, judge_llm = plan.data["trainer"]["policy"], plan.data["judge"]["llm"]
    synthesizer = plan.data["task_manager"]["llm"]["synthesizer"]
    for url in (policy["url"], judge_llm["base_url"], synthesizer["base_url"]):
        assert url.startswith(placeholder), url
    # The token goes with every call to it; the weights go as the upload's body, whatever address the node has.
    assert policy["api_key_env"] == judge_llm["api_key_env"] == synthesizer["api_key_env"] == "EVOLVER_API_TOKEN"
    assert plan.token is not None and plan.child("llm_server").env["EVOLVER_API_TOKEN"] == plan.token.value
    assert policy["weights_transfer"] == "http"
    assert plan.data["llm_server"]["weights_dir"] == "<node store>/weights"
    # Its callers start once Ray placed it, and read its node's address then (what the launcher does on placement).
    assert {"llm_server"} <= set(plan.child("judge").depends_on) & set(plan.child("task_manager").depends_on)
    placed = urls_in(fill_address(plan.data, "llm_server", HOST_B))
    assert not [k for k, v in placed.items() if "llm_server.ray-placed" in v], placed
    assert placed["trainer.policy.url"].startswith(f"http://{HOST_B}:")
    raw = quickstart_on_two_hosts(hosts={}, placement={"llm_server": {"node_labels": {"evolver/role": "gpu"}}})
    raw["trainer"]["policy"]["weights_transfer"] = "path"
    with pytest.raises(ConfigError, match=r"trainer\.policy\.weights_transfer: `path` needs a folder that the "
                                          r"trainer and llm_server share"):
        build_plan(raw, QUICKSTART, environ={})


@pytest.mark.parametrize(("placement", "message"), [
    ({"judge": {}}, r"launcher\.placement\.judge.*give node_labels or resources"),
    ({"judge": {"node_labels": {"a": "b"}, "max_restart": 1}}, r"launcher\.placement\.judge\.max_restart"),
    ({"studio": {"node_labels": {"a": "b"}}}, r"launcher\.placement\.studio.*'llm_server', 'env_service'"),
    ({"judge": {"node_labels": {"a": "b"}}, "task_manager": {"resources": {"x": 1}}}, None),
])
def test_placement_settings_are_checked_with_their_key_path(placement, message):
    raw = quickstart_on_two_hosts(hosts={}, placement=placement)
    if message is None:
        assert build_plan(raw, QUICKSTART, environ={}).child("task_manager").placement is not None
        return
    with pytest.raises(ConfigError, match=message):
        build_plan(raw, QUICKSTART, environ={})


def test_a_placed_service_must_run_and_binds_no_host_of_its_own():
    raw = quickstart_on_two_hosts(placement={"judge": {"node_labels": {"a": "b"}}})
    with pytest.raises(ConfigError, match=r"launcher\.placement: .*judge: a placed service binds the address of the node"):
        build_plan(raw, QUICKSTART, environ={})
    raw = quickstart_on_two_hosts(hosts={}, services=["env_service"], placement={"judge": {"node_labels": {"a": "b"}}})
    with pytest.raises(ConfigError, match=r"launcher\.placement: .*judge: judge is not in launcher\.services"):
        build_plan(raw, QUICKSTART, environ={})
