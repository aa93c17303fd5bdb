"""Settings of the studio (flags of `python -m studio`; the launcher passes its `launcher.studio` section)."""

from __future__ import annotations

from pydantic import Field

from common.service import ServiceSettings


class StudioSettings(ServiceSettings):
    port: int = Field(default=8090, ge=0, le=65535)
    runs: str = Field(default="runs", description="the folder holding run folders (or one run folder)")
    page_size: int = Field(default=50, ge=1, le=1000, description="rows per page of every list")
    refresh_s: float = Field(default=5.0, gt=0, description="how often a live run page polls for new data")
