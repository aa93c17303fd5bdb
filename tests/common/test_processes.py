"""`process_alive` on real processes: one process, and a process group that outlives its first member."""

from __future__ import annotations

import os
import subprocess

from common.processes import process_alive


def _sleeper(group: int = 0) -> subprocess.Popen:
    """`sleep` in process group `group` (0: a new group led by itself), in this session, so the test reaps it."""
    return subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.setpgid(0, group))


def test_a_process_is_alive_until_it_ends() -> None:
    proc = _sleeper()
    try:
        assert process_alive(proc.pid) and process_alive(proc.pid, group=True)
    finally:
        proc.kill()
        proc.wait()
    assert not process_alive(proc.pid)
    assert not process_alive(proc.pid, group=True)


def test_a_group_is_alive_while_any_member_is() -> None:
    leader = _sleeper()
    member = _sleeper(group=leader.pid)
    try:
        leader.kill()
        leader.wait()
        assert not process_alive(leader.pid)  # the process is gone ...
        assert process_alive(leader.pid, group=True)  # ... its group is not
        assert process_alive(member.pid) and not process_alive(member.pid, group=True)  # no group has its id
    finally:
        member.kill()
        member.wait()
    assert not process_alive(leader.pid, group=True)


def test_ids_that_name_no_single_process_are_not_alive() -> None:
    # os.kill(0, 0) would signal this very process group and succeed: the helper must not say "alive".
    assert os.getpgrp() > 0 and not process_alive(0) and not process_alive(0, group=True)
    assert not process_alive(-os.getpgrp())
    assert not process_alive(2**40) and not process_alive(2**40, group=True)  # e.g. a corrupt lock file's number


def test_the_running_process_is_alive() -> None:
    assert process_alive(os.getpid()) and process_alive(os.getpgrp(), group=True)
