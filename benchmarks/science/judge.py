"""Judge benchmark: agreement of a judge LLM's step labels with ground truth, next to three baselines.

    python benchmarks/science/judge.py [--model smollm2] [--llm-url URL --llm-model NAME [--api-key-env VAR]]
                                       [--split test] [--trajectories N] [--structured auto|on|off] [--out FILE]
                                       [--judge KEY=VALUE ...] [--repeat-steps N] [--rollouts RUN/trainer/rollouts]

Starts `llm_server` (unless --llm-url is given: any OpenAI-compatible endpoint, e.g. vLLM or a hosted API)
and the judge service on free 127.0.0.1 ports, judges the ground-truth fixture's trajectories
(benchmarks/fixtures/judge_step_labels_v1.jsonl, made by benchmarks/science/judge_labels.py; the `test` half
unless told) and prints one JSON line: for the judge and for the baselines "outcome sign", "always GOOD"
and "random" (a fair coin, seeded), balanced accuracy and Cohen's kappa with 95% bootstrap intervals
(resampling tasks), per-class recall; for the judge also its raw parse rate, share of filled labels,
budget cuts and seconds per trajectory, and parse rate and budget cuts per trajectory length (`by_steps`).

Reference-guided attribution (`--references`, for the fixture's `flights_v2` part): each task's verified
reference (the environment's own reference call and answer) is planted in a task manager's store as a
synthetic task's, a flights v2 env service and that task manager are started, and the judge fetches the
references by task id as in training. `--judge labeller=reference_rule --no-llm` is the rule alone;
`--judge reference=true` the LLM given the reference. `by_fixture_source` gives each labeller's step accuracy
per kind of episode.

`--rescore AUDIT.jsonl [AUDIT.jsonl ...]` scores judge audit logs again, without judging: only the
trajectories every log judged (no fallback), so a run whose LLM went away midway still gives the agreement
of the labels it did get (on the fixture trajectories of --fixture/--split/--env/--stride).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.harness import emit  # noqa: E402
from judge.agreement import DEFAULT_FIXTURE, baselines, fixture_summary, load_fixture, report  # noqa: E402
from judge.client import JudgeClient, JudgeStep, JudgeTrajectory  # noqa: E402
from tests.helpers import run_service  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@contextmanager
def service(module: str, args: list[str], work: Path, timeout: float = 600) -> Iterator[str]:
    """`python -m module` on a free port, offline, logging into `work`; yields its URL once healthy."""
    with run_service(module, args, env=OFFLINE, timeout=timeout, log_dir=work) as running:
        yield running.url


def plant_references(store_dir: Path, task_ids: list[str]) -> None:
    """The flights v2 tasks' reference calls and answers, stored as verified synthetic tasks of those ids."""
    from benchmarks.science.judge_labels import flights_v2_env
    from common.schemas import Task
    from task_manager.models import Call, Reference, StoredTask
    from task_manager.store import TaskStore

    env = flights_v2_env()
    store = TaskStore(store_dir / "tasks.sqlite")
    for task_id in task_ids:
        task = env.task(task_id)
        calls = [Call(name=name, arguments=arguments) for name, arguments in task.reference]
        reference = Reference(actions=[c.render() for c in calls], calls=calls, answer=task.answer,
                              wrong_answers=list(task.wrong_answers))
        stored = Task(task_id=task_id, env_type="flights", split="train", synthetic=True, query=task.query)
        store.add_task(StoredTask(task=stored, reference=reference, signature=task_id, synthesizer="fixture"),
                       goal_key=task_id)
    store.close()


def reference_services(stack: ExitStack, work: Path, task_ids: list[str]) -> str:
    """A flights v2 env service and a task manager holding the planted references; returns its URL."""
    plant_references(work / "tasks", task_ids)
    env_conf = work / "env.yaml"
    env_conf.write_text(json.dumps({"env_service": {"environments": {"flights": {"version": 2, "tiers": {"1": 1}}}}}))
    env_url = stack.enter_context(service("env_service", ["--conf", str(env_conf)], work))
    tm_conf = work / "tm.yaml"
    tm_conf.write_text(json.dumps({"task_manager": {"env_url": env_url, "store_dir": str(work / "tasks"),
                                                    "environments": ["flights"]}}))
    return stack.enter_context(service("task_manager", ["--conf", str(tm_conf)], work))


def by_fixture_source(fixture: list, predicted: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Per kind of episode (the fixture's `source`): steps, and the share labelled as the ground truth says."""
    out: dict[str, dict[str, float]] = {}
    for traj in fixture:
        row = out.setdefault(traj.source, {"steps": 0, "right": 0})
        row["steps"] += len(traj.labels)
        row["right"] += sum(t == p for t, p in zip(traj.labels, predicted[traj.trajectory_id], strict=True))
    return {source: {"steps": row["steps"], "accuracy": round(row["right"] / row["steps"], 4)}
            for source, row in sorted(out.items())}


def items(fixture: list, repeat: int = 1) -> list[JudgeTrajectory]:
    """The fixture's trajectories as judge inputs; `repeat` > 1 plays each one's steps that many times over
    (an agent repeating itself: longer trajectories for the output budget, with no ground truth)."""
    return [JudgeTrajectory(trajectory_id=t.trajectory_id, task_id=t.task_id, query=t.query, outcome=t.outcome,
                            steps=[JudgeStep(action=s.action, observation=s.observation) for s in t.steps] * repeat)
            for t in fixture]


async def judge_all(url: str, trajs: list[JudgeTrajectory], timeout: float):
    async with JudgeClient(url, timeout=timeout) as client:
        response = await client.judge(trajs)
        return response, await client.stats()


def rollout_items(folder: Path, repeat: int = 1) -> list[JudgeTrajectory]:
    """A trainer run's recorded rollouts (`<run>/trainer/rollouts`), as the trainer hands them to the judge."""
    from common.schemas import Trajectory
    from judge.client import to_judge_trajectory

    out = []
    for shard in sorted(folder.glob("shard-*.jsonl")):
        for line in shard.read_text().splitlines():
            record = json.loads(line)
            traj = to_judge_trajectory(Trajectory.model_validate({k: v for k, v in record.items()
                                                                  if k in Trajectory.model_fields}))
            out.append(traj.model_copy(update={"steps": traj.steps * repeat}))
    return out


def _setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--judge {text!r}: expected KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def by_steps(trajs: list[JudgeTrajectory], response) -> dict[str, dict[str, float]]:
    """Per trajectory length: trajectories, steps, labels parsed from the answer, answers cut by the budget."""
    out: dict[str, dict[str, float]] = {}
    for traj, judgment in zip(trajs, response.judgments, strict=True):
        row = out.setdefault(str(len(traj.steps)), {"trajectories": 0, "steps": 0, "parsed": 0, "budget_cut": 0})
        row["trajectories"] += 1
        row["steps"] += len(traj.steps)
        row["parsed"] += judgment.parsed_labels
        row["budget_cut"] += int(judgment.budget_cut)
    for row in out.values():
        row["parse_rate"] = round(row["parsed"] / row["steps"], 4) if row["steps"] else 0.0
    return dict(sorted(out.items(), key=lambda item: int(item[0])))


def rescore(fixture: list, audits: list[Path], bootstrap: int) -> dict:
    """Agreement of each audit log's non-fallback labels, on the trajectories that every log judged."""
    judged = []
    for path in audits:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        judged.append({r["trajectory_id"]: [lab["label"] for lab in r["labels"]] for r in rows if not r["fallback"]})
    common = set.intersection(*(set(j) for j in judged))
    subset = [t for t in fixture if t.trajectory_id in common]
    out = {"benchmark": "judge_rescore", "audits": [str(p) for p in audits], "data": fixture_summary(subset),
           "trajectory_ids": sorted(common), "bootstrap": f"{bootstrap} resamples of tasks",
           "judges": {str(path): report(subset, {t: j[t] for t in common}, bootstrap) for path, j in zip(audits, judged, strict=True)},
           "baselines": {name: report(subset, labels, bootstrap) for name, labels in baselines(subset).items()}}
    out["by_fixture_source"] = {str(path): by_fixture_source(subset, j) for path, j in zip(audits, judged, strict=True)}
    out["by_fixture_source"].update({name: by_fixture_source(subset, labels) for name, labels in baselines(subset).items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="llm_server model (smollm2 or tiny)")
    parser.add_argument("--llm-url", default=None, help="use a running OpenAI-compatible server (…/v1)")
    parser.add_argument("--llm-model", default=None, help="model name at --llm-url (default: --model)")
    parser.add_argument("--api-key-env", default=None, help="environment variable holding --llm-url's key")
    parser.add_argument("--structured", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    parser.add_argument("--split", choices=["dev", "test", "all"], default="test")
    parser.add_argument("--trajectories", type=int, default=None, help="judge only the first N (default: all)")
    parser.add_argument("--stride", type=int, default=1,
                        help="judge every k-th trajectory of the half (a spread subset when CPU time is short)")
    parser.add_argument("--rollouts", type=Path, default=None, help=(
        "judge a trainer run's recorded rollouts (its trainer/rollouts folder, every --stride-th) instead of the "
        "fixture: parse rate and budget cuts only"))
    parser.add_argument("--repeat-steps", type=int, default=1, help=(
        "play each trajectory's steps N times over: longer trajectories for the output budget (parse rate and "
        "budget cuts only: no ground truth)"))
    parser.add_argument("--judge", action="append", default=[], metavar="KEY=VALUE",
                        help="a judge setting (value read as JSON, else a string), e.g. max_analysis_chars=60; "
                             "repeatable. Default: the service's defaults, as a run gets them")
    parser.add_argument("--env", default=None, help="judge only the fixture's trajectories of this env (flights_v2)")
    parser.add_argument("--references", action="store_true", help=(
        "serve the flights_v2 tasks' references from a task manager and point the judge at it"))
    parser.add_argument("--no-llm", action="store_true", help="no judge LLM (with --judge labeller=reference_rule)")
    parser.add_argument("--rescore", type=Path, nargs="+", default=None, metavar="AUDIT",
                        help="score these judge audit logs again (no judging), on the trajectories all of them judged")
    parser.add_argument("--skip-judged", type=Path, nargs="+", default=None, metavar="AUDIT",
                        help="leave out the trajectories these audit logs judged (no fallback): finish a cut-off run")
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one LLM call may take")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the CIs")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args()
    # A SIGTERM unwinds through the `finally` blocks, so the services started here are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    overrides = dict(_setting(text) for text in args.judge)
    judged = {json.loads(line)["trajectory_id"] for path in args.skip_judged or [] for line in
              path.read_text().splitlines() if line.strip() and not json.loads(line)["fallback"]}
    fixture = [t for t in load_fixture(args.fixture, None if args.split == "all" else args.split)
               if args.env in (None, t.env)][::args.stride]
    fixture = [t for t in fixture if t.trajectory_id not in judged][:args.trajectories]
    if args.rescore:
        emit(rescore(fixture, args.rescore, args.bootstrap), args.out)
        return
    model = args.llm_model or args.model
    work = Path(tempfile.mkdtemp(prefix="judge-bench-"))
    with ExitStack() as stack:
        if args.references:
            overrides.setdefault("task_manager_url", reference_services(stack, work, sorted({t.task_id for t in fixture})))
        llm = None
        if not args.no_llm:
            llm_url = args.llm_url or stack.enter_context(
                service("llm_server", ["--model", args.model], work)) + "/v1"
            llm = {"base_url": llm_url, "model": model, "max_retries": 0, "timeout": args.timeout,
                   "structured": args.structured, "api_key_env": args.api_key_env}
        conf = work / "run.yaml"
        conf.write_text(json.dumps({"judge": {
            "llm": llm, "max_concurrency": args.max_concurrency, "audit_log": str(work / "audit.jsonl"), **overrides}}))
        judge_url = stack.enter_context(service("judge", ["--conf", str(conf)], work))
        trajs = rollout_items(args.rollouts, args.repeat_steps)[::args.stride] if args.rollouts \
            else items(fixture, args.repeat_steps)
        start = time.perf_counter()
        response, stats = asyncio.run(judge_all(judge_url, trajs, 3 * args.timeout))
        wall = time.perf_counter() - start

    predicted = {j.trajectory_id: [lab.label for lab in j.labels] for j in response.judgments}
    # Repeated steps and recorded rollouts have no ground truth: parse statistics only.
    labelled = args.repeat_steps == 1 and not args.rollouts
    judge = report(fixture, predicted, args.bootstrap) if labelled else {}
    judge.update({
        "raw_parse_rate": round(stats.raw_parse_rate, 4), "filled_rate": round(stats.filled_rate, 4),
        "fallback_rate": round(stats.fallback_rate, 4), "budget_cut_calls": stats.budget_cut_calls,
        "structured_calls": stats.structured_calls, "llm_calls": stats.llm_calls,
        "prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.completion_tokens,
        "seconds_per_trajectory": round(wall / len(trajs), 2), "labels_by_source": stats.labels_by_source,
        "reference_lookup_failures": stats.reference_lookup_failures,
        "good_rate_successful": round(stats.successful.good_rate, 4),
        "good_rate_failed": round(stats.failed.good_rate, 4)})
    line = {
        "benchmark": "judge", "model": None if args.no_llm else model, "endpoint": "llm_server" if not args.llm_url else args.llm_url,
        "structured": args.structured, "fixture": args.fixture.name, "split": args.split, "stride": args.stride,
        "data": fixture_summary(fixture), "bootstrap": f"{args.bootstrap} resamples of tasks",
        "judge_settings": overrides, "wall_s": round(wall, 1),
        "judge": judge, "by_steps": by_steps(trajs, response), "env": args.env, "references": args.references,
        "by_fixture_source": {"judge": by_fixture_source(fixture, predicted),
                              **{name: by_fixture_source(fixture, labels) for name, labels in baselines(fixture).items()}}
        if labelled else None,
        "repeat_steps": args.repeat_steps, "rollouts": str(args.rollouts) if args.rollouts else None,
        "baselines": {name: report(fixture, labels, args.bootstrap) for name, labels in baselines(fixture).items()}
        if labelled else None,
        "audit_log": str(work / "audit.jsonl"),
    }
    emit(line, args.out)


if __name__ == "__main__":
    main()
