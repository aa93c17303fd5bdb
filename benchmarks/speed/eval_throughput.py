"""The quickstart's held-out evaluation and one warm-start epoch, before and after a change, in one run,
each against this CPU's limit.

    .venv/bin/python benchmarks/speed/eval_throughput.py [--before ae400f3] [--parts warm_start,eval]
        [--repeats 2] [--tasks 32] [--k 4] [--split validation] [--greedy] [--out FILE]

`--before` names a commit: its tree is extracted into a temporary folder (`git archive`), and every
measurement runs in a child process of this script with that tree, or this one, first on the path, the two
alternating (B A B A ...) so that drift in a shared machine hits both. The workloads are the quickstart's
(`examples/quickstart.yaml`):

- warm start: one epoch of `trainer.warm_start.fine_tune` from SmolLM2 with the quickstart's settings (batch 4,
  lr 3e-5) on the first 32 train references of flights v2 tier 1, rendered by the quickstart's rollout
  template (the quickstart trains on synthetic lookups of the same environment, same template and length);
- evaluation: `trainer.rollout.evaluate_policy` on a 128-row bf16 engine (the quickstart's `eval.max_batch`,
  the trainer's `policy.dtype: auto` on a CPU with native bf16) with 128 episodes in flight, against a real
  env_service, 32 tasks x 4 at the rollout temperature (or greedy), from the weights the first warm start of
  the after side trained (a policy that makes calls, as the quickstart's second and third evaluations do).

Per run: wall seconds, tokens computed per second, the load average, and the share of a bound: the FLOPs of
the model's weight matmuls for the tokens the work needs (attention over the context left out, so the bound
is optimistic for us) at the matrix-multiply throughput measured here first (`matmul_gflops`: bf16 for the
engine, fp32 for the fine-tuning); for the evaluation also `decode_padding_share`, the share of the decode
attention's key/value reads that were padding (`EngineStats.attended_columns`). Outcomes: per task avg@k of
before and after, the tasks that agree, and the difference of the means. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

THIS_REPO = Path(__file__).resolve().parents[2]
DEFAULT_BEFORE = "ae400f3"  # the branch point of the evaluation and warm-start speed work


# ---------------------------------------------------------------------------------------------- worker side
def _quickstart() -> dict[str, Any]:
    import yaml

    return yaml.safe_load((THIS_REPO / "examples" / "quickstart.yaml").read_text())


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def warm_start_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine.models import load_model
    from env_service.environments.flights import FlightsEnvironment
    from trainer.settings import RolloutConfig, WarmStartConfig
    from trainer.warm_start import fine_tune, from_messages, training_data

    torch.set_num_threads(args.threads)
    quick = _quickstart()
    rollout = RolloutConfig.model_validate(quick["trainer"]["rollout"])
    settings = WarmStartConfig.model_validate({**quick["trainer"]["warm_start"], "epochs": 1,
                                               **({"max_tasks": args.warm_tasks} if args.warm_tasks else {}),
                                               **({"dtype": args.warm_dtype} if args.warm_dtype else {})})
    env = FlightsEnvironment(quick["env_service"]["environments"]["flights"])
    model, tokenizer = load_model("smollm2")
    solved = [from_messages(t, env.reference_episode(t)) for t in env.task_ids("train")[:settings.max_tasks]]
    samples, data = training_data(solved, tokenizer, rollout)
    load = _load_average()
    started = time.perf_counter()
    trained = fine_tune(model, samples, settings, torch.device("cpu"), args.seed)
    wall = time.perf_counter() - started
    if args.weights_out:
        torch.save(model.state_dict(), args.weights_out)
    return {"wall_s": round(wall, 2), "load_average": [load, _load_average()], "samples": data["samples"],
            "tokens": data["tokens"], "trained_tokens": data["assistant_tokens"],
            "needed_tokens": needed_tokens(samples, settings, args.seed),
            "loss_curve": [round(x, 5) for x in trained["loss_curve"]]}


def needed_tokens(samples: list[Any], settings: Any, seed: int) -> int:
    """Tokens an epoch cannot avoid computing: per batch (fine_tune's first-epoch order) the common opening once
    and each sample's remainder, no padding."""
    import random

    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    total = 0
    for start in range(0, len(order), settings.batch_size):
        batch = [samples[i].prompt_ids + samples[i].response_ids for i in order[start:start + settings.batch_size]]
        common = len(batch[0])
        for other in batch[1:]:
            common = next((i for i in range(min(common, len(other))) if other[i] != batch[0][i]),
                          min(common, len(other)))
        total += common + sum(len(s) - common for s in batch) if len(batch) > 1 else len(batch[0])
    return total


async def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import yaml

    from common.schemas import Task
    from engine.models import load_model
    from tests.helpers import run_service
    from trainer.peers import EnvPeer
    from trainer.policy import InProcessPolicy, engine_usage
    from trainer.rollout import evaluate_policy
    from trainer.settings import RolloutConfig

    quick = _quickstart()
    model, tokenizer = load_model("smollm2")
    if args.weights_in:
        model.load_state_dict(torch.load(args.weights_in, weights_only=True))
    rows = quick["trainer"]["eval"]["max_batch"]
    rollout = RolloutConfig.model_validate(quick["trainer"]["rollout"]).model_copy(update={"concurrency": rows})
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "env.yaml"
        conf.write_text(yaml.safe_dump({"env_service": quick["env_service"]}))
        with run_service("env_service", ["--conf", str(conf), "--log-level", "WARNING"], timeout=300) as service:
            env = EnvPeer(service.url)
            policy = InProcessPolicy(model, tokenizer, max_batch=rows, threads=args.threads, dtype=torch.bfloat16,
                                     prefix_cache_mb=1024)
            try:
                ids = (await env.task_ids("flights", args.split))[:args.tasks]
                tasks = [Task(task_id=t, env_type="flights", split=args.split) for t in ids]
                load = _load_average()
                started = time.perf_counter()
                summary = await evaluate_policy(tasks, env, policy.generate, tokenizer, rollout, k=args.k,
                                                greedy=args.greedy, seed=args.seed + 17)
                wall = time.perf_counter() - started
            finally:
                await policy.aclose()
                await env.aclose()
    stats = policy.stats
    steps = summary.per_task_steps
    return {"wall_s": round(wall, 2), "load_average": [load, _load_average()], **engine_usage(stats),
            "turns_per_episode": round(sum(sum(v) for v in steps.values()) / (len(tasks) * args.k), 3),
            f"avg@{args.k}": round(summary.avg_at_k, 4), "per_task": summary.per_task,
            "invalid_action_rate": round(summary.invalid_action_rate, 4)}


def eval_worker(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_evaluate(args))


# ---------------------------------------------------------------------------------------------- the bound
def matmul_gflops(dtype_name: str, threads: int, seconds: float = 3.0) -> float:
    """The best GFLOP/s of a [512, 576] x [576, 1536] product (SmolLM2's MLP at a prefill's row count) in `dtype`,
    on `threads` threads, over about `seconds`."""
    import torch

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(512, 576).to(dtype), torch.randn(576, 1536).to(dtype)
    flops = 2 * 512 * 576 * 1536
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        began = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        best = max(best, 10 * flops / (time.perf_counter() - began) / 1e9)
    return round(best, 1)


def weight_params() -> dict[str, int]:
    """SmolLM2's matmul weights: the decoder layers' (every token) and the vocabulary projection's."""
    from engine.models import load_model

    model, _ = load_model("smollm2")
    layers = sum(p.numel() for name, p in model.model.layers.named_parameters() if p.dim() == 2)
    return {"layers": layers, "lm_head": model.get_output_embeddings().weight.numel()}


def eval_bound_s(run: dict[str, Any], params: dict[str, int], gflops: float) -> float:
    """Seconds at `gflops` for the prompt tokens no cache could hold (first turns' distinct prompts counted
    once) and the generated tokens: the layers for each, the vocabulary for each generated token."""
    tokens = run["prefill_tokens"] + run["generated_tokens"]
    flops = 2 * params["layers"] * tokens + 2 * params["lm_head"] * run["generated_tokens"]
    return flops / (gflops * 1e9)


def warm_start_bound_s(run: dict[str, Any], params: dict[str, int], gflops: float) -> float:
    """Seconds at `gflops` for forward and backward (3x the forward) of the tokens an epoch needs, the
    vocabulary only at the trained positions."""
    flops = 6 * params["layers"] * run["needed_tokens"] + 6 * params["lm_head"] * run["trained_tokens"]
    return flops / (gflops * 1e9)


# ---------------------------------------------------------------------------------------------- parent side
def extract_tree(commit: str, into: Path) -> Path:
    archive = into / "before.tar"
    subprocess.run(["git", "-C", str(THIS_REPO), "archive", "--format=tar", "-o", str(archive), commit], check=True)
    root = into / "before"
    root.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root


def run_worker(part: str, root: Path, args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", part, "--code-root", str(root),
               "--tasks", str(args.tasks), "--k", str(args.k), "--split", args.split, "--seed", str(args.seed),
               "--threads", str(args.threads), "--warm-tasks", str(args.warm_tasks),
               *(["--greedy"] if args.greedy else []), *extra]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{part} worker ({root}) failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps({"part": part, "tree": str(root), **{k: v for k, v in result.items() if k != "per_task"}}),
          file=sys.stderr, flush=True)
    return result


def agreement(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, Any]:
    """Per task avg@k of the two runs: how many tasks agree, and the difference of the means."""
    means = {side: {t: sum(v) / len(v) for t, v in runs.items()} for side, runs in (("b", before), ("a", after))}
    tasks = sorted(means["b"])
    return {"tasks": len(tasks), "tasks_equal": sum(means["b"][t] == means["a"][t] for t in tasks),
            "avg_difference": round(sum(means["a"][t] - means["b"][t] for t in tasks) / len(tasks), 4),
            "largest_task_difference": round(max(abs(means["a"][t] - means["b"][t]) for t in tasks), 4)}


def summarize(runs: list[dict[str, Any]], bound_s: float, tokens_key: str) -> dict[str, Any]:
    walls = [r["wall_s"] for r in runs]
    best = min(walls)
    tokens = runs[0][tokens_key]
    return {"wall_s": walls, "wall_min_s": best, "wall_median_s": round(statistics.median(walls), 2),
            "load_average": [r["load_average"] for r in runs], "tokens": tokens,
            "tokens_per_s": round(tokens / best, 1), "bound_s": round(bound_s, 2),
            "share_of_bound": round(bound_s / best, 4)}


def parent(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "eval_throughput", "before": args.before, "after": "working tree",
                           "threads": args.threads, "repeats": args.repeats, "load_average_start": _load_average(),
                           "matmul_gflops": {"bfloat16": matmul_gflops("bfloat16", args.threads),
                                             "float32": matmul_gflops("float32", args.threads)},
                           "weight_params": weight_params()}
    gflops, params = out["matmul_gflops"], out["weight_params"]
    sides = {"warm_start": ["before", "after"] + ([f"after_{args.warm_dtype}"] if args.warm_dtype else []),
             "eval": ["before", "after"]}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": extract_tree(args.before, Path(tmp)), "after": THIS_REPO}
        weights = Path(args.weights or Path(tmp) / "warm.pt")
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {s: [] for s in sides[p]} for p in args.parts}
        for part in args.parts:
            for repeat in range(args.repeats):
                for side in sides[part]:
                    extra = (["--weights-out", str(weights)] if part == "warm_start" and side == "after" and repeat == 0
                             and not args.weights else
                             ["--weights-in", str(weights)] if part == "eval" and weights.exists() else [])
                    if side.startswith("after_"):
                        extra += ["--warm-dtype", args.warm_dtype]
                    runs[part][side].append(run_worker(part, trees[side.split("_")[0]], args, *extra))
    if "warm_start" in runs:
        ws = runs["warm_start"]
        out["warm_start"] = {side: summarize(ws[side], warm_start_bound_s(
            ws[side][0], params, gflops["bfloat16" if side == "after_bfloat16" else "float32"]), "tokens")
            for side in sides["warm_start"]}
        out["warm_start"]["needed_tokens"] = ws["after"][0]["needed_tokens"]
        out["warm_start"]["same_loss_curve_within_1e-3"] = all(
            abs(a - b) <= 1e-3 for a, b in zip(ws["before"][0]["loss_curve"], ws["after"][0]["loss_curve"], strict=True))
        out["warm_start"]["loss_curves"] = {side: ws[side][0]["loss_curve"] for side in sides["warm_start"]}
        for side in sides["warm_start"][1:]:
            out["warm_start"][f"ratio_min_{side}"] = round(out["warm_start"][side]["wall_min_s"]
                                                           / out["warm_start"]["before"]["wall_min_s"], 3)
    if "eval" in runs:
        ev = runs["eval"]
        out["eval"] = {side: {**summarize(ev[side], eval_bound_s(ev[side][0], params, gflops["bfloat16"]),
                                          "generated_tokens"),
                              **{k: ev[side][0][k] for k in ("prefill_tokens", "prompt_tokens", "resumed_rows",
                                                              "prefill_s", "decode_s", "turns_per_episode",
                                                              f"avg@{args.k}", "invalid_action_rate")},
                              # None on a tree whose engine_usage does not report them
                              "decode_padding_share": ev[side][0].get("decode_padding_share"),
                              "kv_reallocations": ev[side][0].get("kv_reallocations")}
                       for side in ("before", "after")}
        out["eval"]["outcomes"] = agreement(ev["before"][0]["per_task"], ev["after"][0]["per_task"])
        out["eval"]["ratio_min"] = round(out["eval"]["after"]["wall_min_s"] / out["eval"]["before"]["wall_min_s"], 3)
    out["load_average_end"] = _load_average()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="the commit whose code is 'before'")
    parser.add_argument("--parts", default="warm_start,eval", help="warm_start, eval or both (comma-separated)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side and part, alternated")
    parser.add_argument("--tasks", type=int, default=32, help="evaluation tasks")
    parser.add_argument("--warm-tasks", type=int, default=0, help="warm-start references (0: the quickstart's 32)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--greedy", action="store_true", help="greedy evaluation (default: the rollout temperature)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the quickstart's trainer has 2)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--weights", default=None,
                        help="a state dict (torch.save) to evaluate instead of the first warm start's weights")
    parser.add_argument("--warm-dtype", default=None, choices=["float32", "bfloat16"],
                        help="also time the after side's warm start with this warm_start.dtype (after_dtype)")
    parser.add_argument("--worker", choices=["warm_start", "eval"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--code-root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--weights-in", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--weights-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.path.insert(0, args.code_root)
        result = (warm_start_worker if args.worker == "warm_start" else eval_worker)(args)
        print(json.dumps(result))
        return
    sys.path.insert(0, str(THIS_REPO))
    args.parts = [p for p in ("warm_start", "eval") if p in args.parts.split(",")]
    result = parent(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
