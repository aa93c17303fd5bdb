"""One command for the whole self-evolving loop.

    python launcher.py --conf examples/quickstart.yaml [key.path=value ...] [--with-reme] [--with-bfcl]
                       [--with-appworld] [--dry-run]
    python launcher.py doctor [--conf examples/quickstart.yaml]

Reads `.env`, composes and validates the run YAML (every section, so a typo fails before anything
starts), resolves ports, starts or joins Ray, starts each enabled service as a supervised child
(own process group, log under runs/<experiment>/logs/, ready on /healthz), runs the trainer, and
stops everything it started on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

from common.config import ConfigError, compose, load_dotenv_file

REPO_ROOT = Path(__file__).resolve().parent


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python launcher.py",
        description="Start the services and the trainer of one run from its YAML; `python launcher.py doctor` "
                    "checks the installation.")
    parser.add_argument("--conf", required=True, help="run YAML, e.g. examples/quickstart.yaml")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. trainer.steps=5")
    parser.add_argument("--with-reme", action="store_true", help="also start the experience manager")
    parser.add_argument("--with-bfcl", action="store_true", help="also serve the BFCL environment")
    parser.add_argument("--with-appworld", action="store_true", help="also serve AppWorld (needs its data)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (processes, ports, commands); start nothing")
    parser.add_argument("--env-file", default=None, help="dotenv file to read (default ./.env)")
    return parser


def load_plan(args: argparse.Namespace, *, check_ports: bool = True):
    from evolver_launcher.plan import build_plan
    from evolver_launcher.settings import apply_companion_flags

    raw = compose(args.conf, args.overrides)
    raw = apply_companion_flags(raw, with_reme=args.with_reme, with_bfcl=args.with_bfcl,
                                with_appworld=args.with_appworld)
    return build_plan(raw, args.conf, check_ports=check_ports)


def describe_plan(plan) -> str:
    launcher = plan.launcher
    lines = [f"plan for experiment {plan.experiment!r} (run folder {plan.run_dir})",
             f"  resolved config: {plan.config_path}"]
    if plan.ray.mode == "start":
        lines.append(f"  ray: start a head, GCS {plan.ray.address}, dashboard {plan.ray.dashboard_url or 'off'}"
                     f" (RAY_AUTH_MODE=disabled)")
        lines.append(f"  ray: other nodes join with: {plan.ray.join_command()}")
    elif plan.ray.mode == "join":
        lines.append(f"  ray: join {plan.ray.address}")
    else:
        lines.append("  ray: off")
    if plan.token is not None:
        where = ("EVOLVER_API_TOKEN from the environment" if plan.token.source == "environment" else
                 f"generated for this run (a service listens off loopback), saved to {plan.run_dir / TOKEN_FILE}")
        lines.append(f"  bearer token: {where}; every child gets it as EVOLVER_API_TOKEN")
    lines.append(f"  restarts: up to {launcher.restart.max_restarts} per child within {launcher.restart.window_s:.0f}s, "
                 f"backoff from {launcher.restart.backoff_s}s; health timeout {launcher.health_timeout_s:.0f}s")
    lines.append("  processes, in start order:")
    for i, child in enumerate(plan.children, 1):
        ready = (f"GET {child.health_url} -> 200" if child.health_url else
                 f"tcp {child.health_tcp[0]}:{child.health_tcp[1]}" if child.health_tcp else "when running")
        port = f"port {child.port}" if child.port else "no port"
        threads = f"{child.threads} threads" if child.threads else "threads: Ray's"
        after = ", ".join(child.depends_on) or "-"
        if child.gate_note:
            after += f", then {child.gate_note}"
        lines += [f"  {i}. {child.name}: {port}, {threads}, starts after: {after}, ready: {ready}",
                  f"     $ {' '.join(child.argv)}",
                  f"     log: {child.log_path}"]
        if child.placement is not None:
            wanted = {**child.placement.node_labels, **{k: f"{v:g}" for k, v in child.placement.resources.items()}}
            lines.append(f"     runs in a Ray actor on a node with {wanted}, restarted by Ray up to "
                         f"{child.placement.max_restarts} times; binds and advertises that node's address, log and "
                         f"store on that node")
    if not launcher.trainer:
        lines.append("  no trainer (launcher.trainer=false): services run until Ctrl-C")
    return "\n".join(lines)


def _lock_run_dir(plan):
    """Hold an exclusive lock on the run folder for the launcher's lifetime (released when it dies)."""
    import fcntl

    plan.run_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = (plan.run_dir.parent / f".{plan.run_dir.name}.lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise ConfigError(f"launcher.experiment: another launcher (pid {holder}) is running {plan.run_dir}; "
                          f"wait for it, or pick another launcher.experiment") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def _prepare_run_dir(plan) -> None:
    from evolver_launcher.run_files import move_aside

    run_dir: Path = plan.run_dir
    aside = None if plan.launcher.resume else move_aside(run_dir)
    if aside is not None:
        print(f"[launcher] moved the previous run to {aside} (launcher.resume=true reuses it instead)")
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    _write_config(plan)


def _write_config(plan) -> None:
    plan.config_path.write_text(
        "# Resolved by launcher.py: every default filled in, ports and URLs chosen. Each child reads its section.\n"
        + yaml.safe_dump(plan.data, sort_keys=False))


def _placed_callback(plan):
    """What the launcher does once Ray has put a placed service on a node: every peer's URL for it names that
    node's address, in the config the children not yet started read and in the launcher's own calls."""
    from evolver_launcher.ray_services import fill_address, placed_host

    def on_placed(name: str, address: str) -> None:
        plan.data = fill_address(plan.data, name, address)
        _write_config(plan)
        for child in plan.children:
            gate = child.gate
            for attribute in ("url", "experience_url"):
                value = getattr(gate, attribute, None)
                if isinstance(value, str):
                    setattr(gate, attribute, value.replace(placed_host(name), address))

    return on_placed


TOKEN_FILE = "api_token"


def _share_token(plan) -> None:
    """The run's token for this process's own calls (synthesis, the manifest) and, when generated, in a file
    only this user can read: what a peer on another node or a browser on the studio's login needs."""
    if plan.token is None:
        return
    os.environ["EVOLVER_API_TOKEN"] = plan.token.value
    if plan.token.source == "generated":
        path = plan.run_dir / TOKEN_FILE
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(plan.token.value + "\n")


def run(args: argparse.Namespace) -> int:
    try:
        plan = load_plan(args)
    except ConfigError as exc:
        print(f"launcher: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(describe_plan(plan))
        problems = _plugin_problems(plan)
        for problem in problems:
            print(f"launcher: {problem}", file=sys.stderr)
        print("dry run: nothing was started")
        return 2 if problems else 0
    problems = _preflight(plan)
    if problems:
        for problem in problems:
            print(f"launcher: {problem}", file=sys.stderr)
        print("launcher: nothing was started", file=sys.stderr)
        return 2

    from evolver_launcher.leftovers import new_launch_id, reap_abandoned, registry_path, write_registry
    from evolver_launcher.manifest import build_manifest, served_environments, write_manifest
    from evolver_launcher.supervisor import Supervisor

    try:
        lock = _lock_run_dir(plan)
    except ConfigError as exc:
        print(f"launcher: {exc}", file=sys.stderr)
        return 2
    launch_id = new_launch_id()
    reap_abandoned(plan.run_dir.parent, registry_path(plan.run_dir), lambda m: print(f"[launcher] {m}", flush=True))
    cleanup = [plan.ray.address_file] if plan.ray.address_file else []
    registry = write_registry(plan.run_dir, launch_id, cleanup)
    _prepare_run_dir(plan)
    _share_token(plan)
    manifest_path = plan.run_dir / "manifest.json"
    manifest = build_manifest(plan, sys.argv)
    write_manifest(manifest_path, manifest)
    print(describe_plan(plan))
    launcher = plan.launcher

    def on_all_ready() -> None:
        if "env_service" in launcher.services:
            manifest["environments"]["served"] = served_environments(
                plan.child("env_service").health_url.removesuffix("/healthz"))
            write_manifest(manifest_path, manifest)
        if plan.ray.dashboard_url:
            print(f"[launcher] Ray dashboard (jobs, actors, logs): {plan.ray.dashboard_url}", flush=True)
        if plan.studio_url:
            print(f"[launcher] studio (curves, tasks, trajectories, experiences): {plan.studio_url}", flush=True)
        if launcher.trainer:
            print(f"[launcher] all services healthy; training curves: tensorboard --logdir "
                  f"{_tensorboard_dir(plan)}", flush=True)
        else:
            print("[launcher] all services healthy; Ctrl-C stops them", flush=True)

    _attach_synthesis(plan)
    supervisor = Supervisor(plan.children, restart=launcher.restart, health_timeout_s=launcher.health_timeout_s,
                            stop_timeout_s=launcher.stop_timeout_s, tail_lines=launcher.log_tail_lines,
                            cwd=REPO_ROOT, on_all_ready=on_all_ready, launch_id=launch_id, cleanup_files=cleanup,
                            ray_address=plan.ray.address, experiment=plan.experiment,
                            placed_config=lambda: plan.data, on_placed=_placed_callback(plan))
    supervisor.install_signal_handlers()
    started = time.monotonic()
    code = supervisor.run()
    manifest["result"] = {"exit_code": code, "wall_s": round(time.monotonic() - started, 1),
                          "children": supervisor.status()}
    write_manifest(manifest_path, manifest)
    _final_words(plan, code, time.monotonic() - started)
    registry.unlink(missing_ok=True)
    lock.close()
    return code


def _plugin_problems(plan) -> list[str]:
    """Plugins whose module, class or settings would stop the env service (a dry run checks these too)."""
    if "env_service" not in plan.launcher.services:
        return []
    from evolver_launcher.preflight import check_plugins

    return check_plugins(plan.config.env_service, plan.child("env_service").env, REPO_ROOT)


def _preflight(plan) -> list[str]:
    """Plugins that do not import and remotes that do not answer, found before any process starts."""
    if "env_service" not in plan.launcher.services:
        return []
    from evolver_launcher.preflight import check_reachable

    return check_reachable(plan.config.env_service, plan.child("env_service").env, REPO_ROOT)


def _attach_synthesis(plan) -> None:
    """Self-questioning before training: the trainer waits for the task manager's synthesis jobs."""
    trainer = next((c for c in plan.children if c.name == "trainer" and c.gate_note), None)
    if trainer is None:
        return
    from evolver_launcher.synthesis import SynthesisGate

    settings = plan.launcher.synthesis
    workspace = ((plan.data.get("trainer") or {}).get("experience") or {}).get("workspace", "default")
    trainer.gate = SynthesisGate(plan.child("task_manager").health_url.removesuffix("/healthz"),
                                 plan.data["task_manager"]["environments"], settings.episodes, settings.timeout_s,
                                 say=lambda message: print(f"[launcher] {message}", flush=True),
                                 seed_experience=settings.seed_experience, experience_url=_experience_url(plan),
                                 workspace=workspace, run_name=plan.experiment,
                                 allow_no_tasks=settings.allow_no_tasks)


def _experience_url(plan) -> str | None:
    """The experience manager's base URL when the launcher runs one (a resumed run checks its pool)."""
    if not any(c.name == "experience_manager" for c in plan.children):
        return None
    return plan.child("experience_manager").health_url.removesuffix("/healthz")


def _tensorboard_dir(plan) -> Path:
    return Path(plan.data["trainer"]["output_dir"]) / "tensorboard"


def _final_words(plan, code: int, seconds: float) -> None:
    verdict = "finished" if code == 0 else f"stopped (exit code {code})"
    print(f"[launcher] run {plan.experiment!r} {verdict} after {seconds / 60:.1f} min; everything it started is "
          f"stopped", flush=True)
    print(f"[launcher] run folder: {plan.run_dir} (config.yaml, manifest.json, logs/)")
    print(f"[launcher] browse it: {sys.executable} -m studio --runs {plan.run_dir.parent}")
    if plan.launcher.trainer:
        out = Path(plan.data["trainer"]["output_dir"])
        print(f"[launcher] TensorBoard: tensorboard --logdir {_tensorboard_dir(plan)}")
        for png in sorted(out.glob("*.png")):
            print(f"[launcher] plot: {png}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        from evolver_launcher.doctor import main as doctor_main

        return doctor_main(argv[1:])
    args = _run_parser().parse_args(argv)
    if args.env_file and not Path(args.env_file).is_file():
        print(f"launcher: --env-file {args.env_file}: no such file", file=sys.stderr)
        return 2
    load_dotenv_file(args.env_file)
    if shutil.which("git") is None:
        print("[launcher] note: git is not installed; the manifest will have no commit", file=sys.stderr)
    try:
        return run(args)
    except KeyboardInterrupt:  # before the supervisor took over the signals: nothing was started yet
        print("launcher: interrupted before anything started", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
