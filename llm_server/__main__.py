"""`python -m llm_server --port PORT --model smollm2|tiny|<HF dir>`: serve one model, OpenAI-compatible."""

from __future__ import annotations

import os

# Before torch loads OpenMP: spinning worker threads make a shared, oversubscribed CPU crawl
# (measured: SmolLM2 at 2 tok/s instead of 18 with 2 threads while other processes ran).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from local files only, never a hub
# oneDNN keeps each compiled bf16 matmul kernel (one per shape, ~0.7 MB) in two caches of 1024 entries, which a
# long run's ever-new prompt lengths fill (~0.7 GB). Capped, a decode step's kernels stay (in use every step,
# least recently used goes first), and a prompt's one-off shapes were compiled anyway.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")
os.environ.setdefault("LRU_CACHE_CAPACITY", "256")

import argparse  # noqa: E402
import sys  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from loguru import logger  # noqa: E402

from common.service import run_app, service_cli  # noqa: E402
from llm_server.settings import LLMServerSettings  # noqa: E402

if TYPE_CHECKING:
    from engine.generation import Engine
    from engine.grammar import GrammarCompiler


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="smollm2 (default), tiny, or a local HF model directory")
    parser.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model)")
    parser.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, or auto (cuda when present)")
    parser.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16"],
                        help="auto (default): bfloat16 where the CPU has native bf16, else float32")
    parser.add_argument("--max-batch", type=int, default=None, help="sequences decoded together at most (32)")
    parser.add_argument("--batch-window-ms", type=float, default=None,
                        help="how long an idle server waits to batch arriving requests (10)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--default-max-tokens", type=int, default=None)
    parser.add_argument("--max-request-tokens", type=int, default=None)
    parser.add_argument("--weights-dir", default=None,
                        help="POST /v1/weights loads only from inside this directory (default: $TMPDIR/evolver-weights)")
    parser.add_argument("--grammar-cache-size", type=int, default=None, help="compiled grammars kept (256)")
    parser.add_argument("--grammar-timeout-s", type=float, default=None,
                        help="a structured-output constraint that compiles longer gets a 400 (10)")


def main(argv: list[str] | None = None) -> None:
    settings, _ = service_cli("llm_server", LLMServerSettings, "llm_server",
                              "OpenAI-compatible model server (transformers, CPU or GPU) with token ids and logprobs",
                              add_arguments=_arguments, argv=argv)
    assert isinstance(settings, LLMServerSettings)
    from engine.models import ModelLoadError, load_from_directory, resolve_model_dir

    try:
        model_dir = resolve_model_dir(settings.model)  # a bad spec fails here, before torch loads
    except ModelLoadError as exc:
        sys.exit(f"llm_server: {exc}")
    import torch

    from engine.device import DeviceUnavailable, describe, resolve_device

    try:
        device = resolve_device(settings.device, "llm_server.device")  # before the engine and the app load
    except DeviceUnavailable as exc:
        sys.exit(f"llm_server: {exc}")
    from engine.generation import Engine
    from llm_server.app import ServedModel, build_app

    threads = settings.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    try:
        model, tokenizer = load_from_directory(model_dir, dtype=_torch_dtype(settings.dtype, device))
        model.to(device)
        engine = Engine(model, tokenizer, max_batch=settings.max_batch,
                        batch_window_s=settings.batch_window_ms / 1000, threads=threads,
                        prefix_cache_bytes=settings.prefix_cache_mb << 20)
    except (ModelLoadError, ValueError) as exc:
        sys.exit(f"llm_server: {exc}")
    name = settings.served_model_name or settings.model
    logger.info("llm_server: serving {!r} ({} parameters, {}, {}, context {}, max batch {}, {} threads)", name,
                f"{model.num_parameters():,}", model.dtype, describe(device), engine.context_length,
                settings.max_batch, threads)
    grammars = _grammar_compiler(tokenizer, engine, settings)
    app = build_app(ServedModel(engine, tokenizer, name, settings, grammars))
    try:
        run_app(app, settings.host, settings.port, settings.log_level,
            tls_certfile=settings.tls_certfile, tls_keyfile=settings.tls_keyfile)
    finally:
        engine.close()
        if grammars is not None:
            grammars.close()


def _torch_dtype(name: str, device: Any) -> Any:
    """The weights' dtype; `auto` takes bf16 on a GPU, and on a CPU only where it has bf16 instructions (emulated
    bf16 is slower)."""
    import torch

    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16
    from engine.models import native_bf16

    return torch.bfloat16 if native_bf16() else torch.float32


def _grammar_compiler(tokenizer: Any, engine: Engine, settings: LLMServerSettings) -> GrammarCompiler | None:
    """Structured outputs for this tokenizer, or None (logged) when the grammar engine cannot read it."""
    from engine.grammar import GrammarCompiler

    try:
        return GrammarCompiler(tokenizer, engine.eos_ids, cache_size=settings.grammar_cache_size,
                               timeout_s=settings.grammar_timeout_s)
    except (ValueError, TypeError, AttributeError) as exc:  # a slow tokenizer, or one llguidance decodes differently
        logger.warning("llm_server: structured outputs disabled for this model: {}", exc)
        return None


if __name__ == "__main__":
    main()
