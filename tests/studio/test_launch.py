"""The launcher's `studio` section: a child over runs_dir with its own port, the URL in the plan; off: none."""

from __future__ import annotations

from tests.launcher.test_config import plan_for, small_config


def test_the_studio_is_a_child_of_the_run_when_enabled(tmp_path):
    plan = plan_for(small_config(tmp_path), ["launcher.studio.enabled=true", "launcher.studio.port=auto"])
    studio = plan.child("studio")
    assert studio.argv[1:5] == ["-m", "studio", "--runs", str(plan.run_dir.parent)]
    assert studio.port and studio.port not in {c.port for c in plan.children if c.name != "studio"}
    assert plan.studio_url == f"http://127.0.0.1:{studio.port}/runs/unit"
    assert studio.health_url == f"http://127.0.0.1:{studio.port}/healthz"
    assert "studio" not in plan.child("trainer").depends_on  # training never waits for the web view


def test_no_studio_unless_enabled(tmp_path):
    plan = plan_for(small_config(tmp_path))
    assert plan.studio_url is None and all(c.name != "studio" for c in plan.children)
