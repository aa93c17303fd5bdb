"""Peak resident memory of the rollout engine's batch and of a trainer step, each part in a fresh process.

    python benchmarks/speed/memory.py [--parts engine,trainer] [--model smollm2] [--steps 2]

`engine`: the trainer's in-process engine (fp32 weights, max_batch 32) runs 32 rows at once: 31 rows of the
rollout benchmark's ~330-token chat prompts (8 prompts x 4 rollouts, a GRPO batch) and one ~1,530-token
prompt, `--max-tokens` new tokens each: the long row makes every row's slot as wide as its context, the
32 x 1,536-column fp32 cache of the trainer's worst case. Reported: RSS after the model loaded, the peak
during the batch, RSS once the batch finished, and the engine's own KV accounting where it has one.
`trainer`: `LocalTrainer` on `signal` (two turns, 8 tasks x 4 rollouts, 32 new tokens, `checkpoint.every: 1`),
`--steps` steps: RSS after setup and the peak over the steps (rollouts, update, optimizer state, weight sync).
`--shape quickstart`: instead, the quickstart's batch on `flights` (2 tasks x 4 rollouts, up to 4 turns of 64
new tokens, 1,536-token context, lr 1e-5); SmolLM2's flights outcomes are all 0, so the update is forced to run
(`optim.skip_zero_advantage: false` where that option exists) to measure its memory. Besides the peak, each
step reports the RSS after the step, when only what the trainer keeps between steps is left.
RSS is sampled every 10 ms from /proc/self/statm in a background thread, so a peak shorter than that can be
missed; `ru_maxrss` (the kernel's exact peak, including the model load) is reported beside it.
Prints one JSON line with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, load_avg  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 2**20


class PeakSampler:
    """The highest RSS seen since the last `reset`, sampled every `period` seconds."""

    def __init__(self, period: float = 0.01) -> None:
        self.period, self.peak = period, rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, rss_mb())

    def reset(self) -> float:
        self.peak = rss_mb()
        return self.peak

    def close(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_mb())


def engine_part(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from benchmarks.speed.rollout import build_prompts
    from engine.generation import Engine, SamplingParams
    from engine.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    engine = Engine(model, tokenizer, max_batch=32, threads=args.threads)
    sampler = PeakSampler()
    try:
        loaded = sampler.reset()
        prompts = build_prompts(tokenizer, 32, 4, 1)
        futures = [engine.submit(p, SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=i,
                                                   ignore_eos=True)) for i, p in enumerate(prompts)]
        tokens = sum(len(f.result().completions[0].token_ids) for f in futures)
        time.sleep(0.2)  # the worker frees the cache right after it resolves the last future
        after = rss_mb()
        peak = sampler.close()
        stats = engine.stats
        return {"rss_loaded_mb": round(loaded), "rss_peak_mb": round(peak), "rss_after_batch_mb": round(after),
                "batch_peak_over_loaded_mb": round(peak - loaded), "tokens": tokens,
                "prompt_tokens": sum(len(p) for p in prompts),
                "kv_peak_mb": round(getattr(stats, "kv_peak_bytes", 0) / 2**20) or None,
                "kv_reallocations": getattr(stats, "kv_reallocations", None)}
    finally:
        engine.close()


def _shape(name: str) -> tuple[str, dict[str, Any]]:
    """(environment, the trainer config's shape keys) of `--shape`."""
    if name == "signal":
        return "signal", {"tasks_per_step": 8,
                          "rollout": {"env": "signal", "n": 4, "max_turns": 2, "max_new_tokens": 32,
                                      "max_context": 1024},
                          "optim": {"lr": 1e-6, "minibatches": 2, "micro_batch_size": 4}}
    from trainer.settings import OptimConfig

    optim: dict[str, Any] = {"lr": 1e-5, "minibatches": 2, "micro_batch_size": 4}
    if "skip_zero_advantage" in OptimConfig.model_fields:  # absent on code before the skip (the "before" run)
        optim["skip_zero_advantage"] = False
    return "flights", {"tasks_per_step": 2,
                       "rollout": {"env": "flights", "template": "linear", "n": 4, "max_turns": 4,
                                   "max_new_tokens": 64, "max_context": 1536, "temperature": 1.0},
                       "optim": optim}


def trainer_part(args: argparse.Namespace) -> dict[str, Any]:
    from tests.helpers import run_service
    from trainer.config import TrainerConfig
    from trainer.local import LocalTrainer

    env, shape = _shape(args.shape)
    conf = Path(tempfile.mkdtemp()) / "env.yaml"
    conf.write_text(f"env_service:\n  environments:\n    {env}: {{}}\n")
    with run_service("env_service", ["--conf", str(conf)]) as service:
        config = TrainerConfig.model_validate({
            "model": args.model, "steps": args.steps, "seed": 0, **shape,
            "output_dir": tempfile.mkdtemp(prefix="bench-memory-"), "progress": False, "tensorboard": False,
            "plot": False, "torch_threads": args.threads, "checkpoint": {"every": 1},
            "services": {"env_url": service.url}, "eval": {"before": False, "after": False},
            "ray": {"enabled": False}})
        trainer = LocalTrainer(config)
        sampler = PeakSampler()

        async def run() -> dict[str, Any]:
            await trainer.setup()
            ready = sampler.reset()
            steps = []
            try:
                for _ in range(args.steps):
                    sampler.reset()
                    metrics = await trainer.train_step()
                    steps.append({"peak_mb": round(sampler.peak), "after_mb": round(rss_mb()),
                                  "step_s": round(metrics["time/step_s"], 1),
                                  "optimizer_steps": metrics.get("update/optimizer_steps"),
                                  "params_with_grad": sum(p.grad is not None for p in trainer.model.parameters())})
            finally:
                await trainer.close()
            stats = trainer.policy.stats if trainer.policy is not None else None
            return {"rss_after_setup_mb": round(ready), "steps": steps,
                    "rss_peak_mb": round(max(s["peak_mb"] for s in steps)),
                    "kv_peak_mb": round(getattr(stats, "kv_peak_bytes", 0) / 2**20) or None,
                    "kv_reallocations": getattr(stats, "kv_reallocations", None)}

        out = asyncio.run(run())
        sampler.close()
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="engine,trainer")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--shape", choices=["signal", "quickstart"], default="signal", help="the trainer part's batch")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one part in this process
    args = parser.parse_args()
    if args.one:
        out = {"engine": engine_part, "trainer": trainer_part}[args.one](args)
        out["ru_maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps(out))
        return
    result: dict[str, Any] = {"benchmark": "memory", "model": args.model, "threads": args.threads, "shape": args.shape,
                              "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                                    capture_output=True, text=True).stdout.strip() or None,
                              "loadavg_start": load_avg()}
    for part in args.parts.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", part, "--model", args.model, "--steps",
                               str(args.steps), "--max-tokens", str(args.max_tokens), "--threads", str(args.threads),
                               "--shape", args.shape],
                              capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode:
            raise SystemExit(f"part {part} failed:\n{proc.stderr[-3000:]}")
        result[part] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(part, result[part], file=sys.stderr, flush=True)
        result[f"loadavg_after_{part}"] = load_avg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
