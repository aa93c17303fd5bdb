"""The soak's own arithmetic (`benchmarks/services/soak.py`): its kill schedule, its restart window and its
resource growth. The soak itself runs for an hour on quiet cores, never in CI."""

from __future__ import annotations

from benchmarks.services.soak import TARGETS, kill_schedule, resource_growth, restart_window


def test_every_target_is_killed_once_in_each_part_of_the_run_and_the_schedule_follows_the_seed():
    schedule = kill_schedule(seed=7, kills=3, start_s=120, end_s=2520)  # parts of 800 s
    assert schedule == sorted(schedule) and schedule == kill_schedule(seed=7, kills=3, start_s=120, end_s=2520)
    assert schedule != kill_schedule(seed=8, kills=3, start_s=120, end_s=2520)
    for target in TARGETS:
        times = [t for t, name in schedule if name == target]
        assert [int((t - 120) // 800) for t in times] == [0, 1, 2], target
    # Three kills of one target never fall within one default window: two parts apart is over 800 s.
    assert restart_window(3, 120, 2520) == 600
    assert restart_window(1, 36, 192) == 140.4  # a short run scales the window to 90% of a part


def test_growth_is_measured_from_the_baseline_sample_to_the_last():
    def sample(t, rss, fds):
        return {"t": t, "processes": {"judge": {"rss_mb": rss, "fds": fds, "processes": 1, "pid": 41}}}

    samples = [sample(0, 50.0, 10), sample(600, 100.0, 20), sample(1200, 104.0, 20), sample(2700, 112.0, 23)]
    assert resource_growth(samples, 600) == {"judge": {
        "rss_mb_baseline": 100.0, "rss_mb_end": 112.0, "fds_baseline": 20, "fds_end": 23,
        "rss_growth_pct": 12.0, "fds_growth_pct": 15.0, "same_process": True,
        "rss_growth_within_a_process_max_pct": 12.0}}  # from its second sample (100 MiB) to its last
    restarted = [*samples[:3], {"t": 1800, "processes": {"judge": {"rss_mb": 60.0, "fds": 12, "pid": 42}}},
                 {"t": 2400, "processes": {"judge": {"rss_mb": 70.0, "fds": 12, "pid": 42}}},
                 {"t": 2700, "processes": {"judge": {"rss_mb": 77.0, "fds": 12, "pid": 42}}}]
    growth = resource_growth(restarted, 600)["judge"]
    assert growth["same_process"] is False and growth["rss_growth_pct"] == -23.0
    assert growth["rss_growth_within_a_process_max_pct"] == 10.0  # pid 42: 70 -> 77; pid 41: 100 -> 104 (4%)
    assert resource_growth(samples[:2], 600) == {}, "one sample after the baseline measures nothing"
