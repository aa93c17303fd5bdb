"""Whether an address stays on this machine: the line between a service that may run without the run's token
and one that must not. Kept apart from `common.service` so that settings models (the trainer's, imported on a
GPU machine without the service stack) can ask it."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost). A wildcard
    (0.0.0.0, ::, "") or any other name or address is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
