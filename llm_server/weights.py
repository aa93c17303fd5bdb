"""Reading weights for `POST /v1/weights`: an HF directory or a state-dict file."""

from __future__ import annotations

from pathlib import Path

import torch

from common.service import ServiceError


def allowed_path(requested: str, weights_dir: str) -> Path:
    """`requested` resolved (symlinks and `..` included) if it lies inside `weights_dir`, else a 403.

    The refusal is the same whether or not the file exists, so the route probes nothing outside.
    """
    root = Path(weights_dir).expanduser().resolve()
    try:
        path = Path(requested).expanduser()
        path = (path if path.is_absolute() else root / path).resolve()
    except (OSError, RuntimeError, ValueError):
        path = None
    if path is None or not path.is_relative_to(root):
        raise ServiceError(403, "weights_path_forbidden",
                           f"weights are loaded only from inside the server's weights_dir ({root}); "
                           "write them there, or set llm_server.weights_dir")
    return path


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Tensors from an HF directory (all *.safetensors in it) or one .safetensors/.pt/.bin file."""
    from safetensors.torch import load_file

    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ServiceError(400, "weights_not_found", f"{path} holds no *.safetensors files")
    elif path.is_file():
        files = [path]
    else:
        raise ServiceError(400, "weights_not_found", f"{path} does not exist")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                tensors.update(load_file(str(file), device="cpu"))
            else:
                loaded = torch.load(str(file), map_location="cpu", weights_only=True)
                if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
                    raise ServiceError(400, "weights_invalid", f"{file} is not a state dict of tensors")
                tensors.update(loaded)
        except ServiceError:
            raise
        except Exception as exc:
            raise ServiceError(400, "weights_invalid", f"cannot read {file}: {type(exc).__name__}: {exc}") from None
    return tensors


def read_state_dict_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Tensors from the bytes of one safetensors file (a `POST /v1/weights/upload` body)."""
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as exc:
        raise ServiceError(400, "weights_invalid", f"the body is not a safetensors file: {type(exc).__name__}: "
                           f"{exc}") from None
