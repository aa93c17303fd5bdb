"""Checkpoints: model, optimizer and schedule, step, RNG states and the data cursor, in one file.

`step_<N>.pt` is written to a temporary name and renamed, and `latest` names the newest, so a run
killed mid-save resumes from the previous complete checkpoint.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.faults import check_disk


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:06d}.pt"
    tmp = path.with_suffix(".tmp")
    try:
        check_disk(tmp)
        torch.save({"step": step, "rng": rng_state(), **payload}, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written file on a full disk: give its space back
        raise
    os.replace(tmp, path)
    (directory / "latest.tmp").write_text(path.name)
    os.replace(directory / "latest.tmp", directory / "latest")
    for old in sorted(directory.glob("step_*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return path


def latest_checkpoint(directory: str | Path) -> Path | None:
    directory = Path(directory)
    marker = directory / "latest"
    if marker.is_file():
        path = directory / marker.read_text().strip()
        if path.is_file():
            return path
    found = sorted(directory.glob("step_*.pt"))
    return found[-1] if found else None


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    # Our own files: optimizer state and RNG tuples need full unpickling.
    return torch.load(path, map_location="cpu", weights_only=False)
