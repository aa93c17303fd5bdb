"""How long does the warm start's fine-tuning take with a batch's common opening computed once
(`warm_start.share_opening`), against one forward per sample, on the same data from the same weights?

    .venv/bin/python benchmarks/speed/warm_start_speed.py [--tasks 32] [--epochs 1] [--repeats 2] [--threads 2]
        [--out benchmarks/results/warm-start-speed.json]

The data: the first `--tasks` train tasks of flights v2 tier 1 (the v2 protocol's environment) solved by their
references, rendered by the protocol's rollout template (`examples/ablation/flights_v2.yaml`); the synthetic
references the quickstart trains on open with the same system prompt and tool list. SmolLM2 is reloaded
for every run, and the two modes alternate (A B A B) so that drift in the machine hits both. Per run: wall
seconds, the tokens the forwards computed, the loss curve; and the largest difference between the two modes'
final weights. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, load_avg  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import yaml  # noqa: E402

from engine.models import load_model  # noqa: E402
from env_service.environments.flights import FlightsEnvironment  # noqa: E402
from trainer.settings import RolloutConfig, WarmStartConfig  # noqa: E402
from trainer.warm_start import fine_tune, from_messages, opening_groups, tokens_computed, training_data  # noqa: E402

PROTOCOL = REPO / "examples" / "ablation" / "flights_v2.yaml"


def computed_tokens(samples: list[Any], settings: WarmStartConfig, order: list[int]) -> int:
    """Tokens the forwards run over one epoch in `order`: padded group rows plus each group's opening."""
    total = 0
    for start in range(0, len(order), settings.batch_size):
        batch = [samples[i] for i in order[start:start + settings.batch_size]]
        total += tokens_computed(*opening_groups(batch)) if settings.share_opening else tokens_computed(0, [batch])
    return total


def one_run(samples: list[Any], share: bool, epochs: int, seed: int) -> tuple[dict[str, Any], torch.Tensor]:
    model, _ = load_model("smollm2")
    settings = WarmStartConfig(enabled=True, epochs=epochs, share_opening=share)
    started = time.perf_counter()
    trained = fine_tune(model, samples, settings, torch.device("cpu"), seed)
    wall = time.perf_counter() - started
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"share_opening": share, "wall_s": round(wall, 1), "loss_curve": [round(x, 5) for x in trained["loss_curve"]],
            "load_average": load_avg()}, weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32, help="train references (the protocol's max_tasks)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, alternated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = yaml.safe_load(PROTOCOL.read_text())["run"]
    rollout = RolloutConfig.model_validate(run["trainer"]["rollout"])
    env = FlightsEnvironment(run["env_service"]["environments"]["flights"])
    _, tokenizer = load_model("smollm2")
    solved = [from_messages(t, env.reference_episode(t)) for t in env.task_ids("train")[:args.tasks]]
    samples, data = training_data(solved, tokenizer, rollout)
    order = list(range(len(samples)))
    random.Random(args.seed).shuffle(order)  # fine_tune's first epoch order
    runs, finals = [], {}
    for _ in range(args.repeats):
        for share in (False, True):
            result, weights = one_run(samples, share, args.epochs, args.seed)
            result["computed_tokens_epoch1"] = computed_tokens(
                samples, WarmStartConfig(enabled=True, share_opening=share), order)
            runs.append(result)
            finals.setdefault(share, weights)
            print(json.dumps(result), file=sys.stderr, flush=True)
    mean = {share: sum(r["wall_s"] for r in runs if r["share_opening"] == share) / args.repeats
            for share in (False, True)}
    out = {"benchmark": "warm_start_speed", "env": "flights v2 tier 1, train references", "model": "smollm2",
           "samples": data["samples"], "tokens": data["tokens"], "assistant_tokens": data["assistant_tokens"],
           "epochs": args.epochs, "batch_size": WarmStartConfig().batch_size, "threads": args.threads,
           "runs": runs, "mean_wall_s": {"per_sample": round(mean[False], 1), "shared_opening": round(mean[True], 1)},
           "speedup": round(mean[False] / mean[True], 3),
           "max_abs_weight_difference": float((finals[True] - finals[False]).abs().max()),
           "max_abs_weight": float(finals[False].abs().max())}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
