"""Supervise the run's children: start in dependency order, wait for /healthz, restart, tear down.

Every child gets its own session (so its own process group) and a log file. Readiness is an HTTP
200 from the child's health URL, never a log line. A child that exits is restarted with doubling
backoff, up to `max_restarts` restarts within the last `window_s` seconds (crash-loop back-off, as
supervisors do: crashes spread over a long run are all restarted); one more crash inside the window
(or a child that cannot become healthy) stops the run and prints the last lines of that child's log.
Stopping sends SIGTERM to each group in reverse start order (a Ray head in Ray's own order: raylet
first, gcs_server last), then SIGKILL to what is left after the grace period; last, whatever still
carries this launch's marker in its environment (a Ray worker that left its group). Only processes this supervisor started, or their descendants, are ever
signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx

from common.processes import process_alive, signal_on_parent_death
from evolver_launcher.leftovers import MARKER, marked_processes, stop_ray_processes, terminate
from evolver_launcher.plan import ChildSpec
from evolver_launcher.ray_services import PlacedService, disconnect, placed_host
from evolver_launcher.run_files import tail
from evolver_launcher.settings import SERVICE_MODULES, RestartPolicy

WAITING, STARTING, READY, BACKOFF, DONE, FAILED, STOPPED = (
    "waiting", "starting", "ready", "backoff", "done", "failed", "stopped")
POLL_S = 0.2
HEALTH_EVERY_S = 0.5
# A service whose /healthz names a dependency that does not answer (a remote env server) for this long
# fails the run with that reason: restarting the service cannot bring the dependency back.
UNAVAILABLE_LIMIT_S = 45.0
CONFIG_ERROR_EXIT = 2  # argparse/config errors: restarting cannot help
GAVE_UP_EXIT = 3  # the trainer waited out its outage budget for a peer (or its steps stayed empty): it said why
COLLAPSED_EXIT = 4  # the trainer stopped a collapsed run (trainer.collapse): the launcher exits with it too
DISK_FULL_EXIT = 5  # the trainer found the disk full: a restart would find it full too
NO_RESTART_EXITS = {CONFIG_ERROR_EXIT: " (a configuration error)", GAVE_UP_EXIT: " (it gave up on a peer or on empty steps)",
                    COLLAPSED_EXIT: " (the run collapsed: its summary.json names the signal)",
                    DISK_FULL_EXIT: " (the disk is full: free space, then run again with launcher.resume: true)"}
# A foreground child's exit code the launcher exits with (others: 1): the trainer's own verdicts.
PASSED_ON_EXITS = {GAVE_UP_EXIT, COLLAPSED_EXIT, DISK_FULL_EXIT}


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the launcher itself dies (a backstop; Linux only)."""
    signal_on_parent_death(signal.SIGTERM)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return members


@dataclass
class Child:
    spec: ChildSpec
    state: str = WAITING
    proc: subprocess.Popen | None = None
    pgid: int | None = None
    restarts: int = 0  # over the whole run
    recent_crashes: deque[float] = field(default_factory=deque)  # monotonic times of crashes inside the window
    started_at: float = 0.0
    next_start: float = 0.0
    last_health_check: float = 0.0
    ready_s: float | None = None
    exit_codes: list[int] = field(default_factory=list)
    echo_offset: int = 0
    unavailable: str | None = None  # the reason the last /healthz gave for not being ready
    unavailable_since: float | None = None
    placed: PlacedService | None = None  # a service run as a Ray actor (spec.placement)
    actor_pid: int | None = None  # the placed service's actor process Ray last reported

    @property
    def name(self) -> str:
        return self.spec.name


class RunFailed(Exception):
    def __init__(self, child: str, reason: str, log_path: Path, log_tail: str, exit_code: int = 1) -> None:
        super().__init__(f"{child}: {reason}")
        self.child, self.reason, self.log_path, self.log_tail = child, reason, log_path, log_tail
        self.exit_code = exit_code  # the launcher's


class Supervisor:
    def __init__(self, specs: list[ChildSpec], *, restart: RestartPolicy, health_timeout_s: float,
                 stop_timeout_s: float, tail_lines: int = 40, cwd: Path | None = None,
                 out: TextIO | None = None, on_all_ready: Callable[[], None] | None = None,
                 launch_id: str | None = None, cleanup_files: list[Path] | None = None,
                 ray_address: str | None = None, experiment: str = "run",
                 placed_config: Callable[[], dict] | None = None,
                 on_placed: Callable[[str, str], None] | None = None) -> None:
        self.children = [Child(spec) for spec in specs]
        self.restart, self.health_timeout_s, self.stop_timeout_s = restart, health_timeout_s, stop_timeout_s
        self.tail_lines, self.cwd = tail_lines, cwd
        self.out = out or sys.stdout
        self.on_all_ready = on_all_ready
        self.stop_signal: int | None = None
        self._started_order: list[Child] = []
        self._announced_ready = False
        # Never through a proxy: these are local. Unverified: a child serving HTTPS (tls_certfile) may use a
        # self-signed certificate, and the probe reads only the open /healthz of a process this launcher started.
        self._http = httpx.Client(timeout=2.0, trust_env=False, verify=False)
        self.launch_id = launch_id
        self.cleanup_files = cleanup_files or []
        # Placed services (ChildSpec.placement): the cluster their actors join, the run's config at their start
        # (peers' addresses filled in so far), and who learns the address Ray gave each.
        self.ray_address, self.experiment = ray_address, experiment
        self.placed_config = placed_config or (lambda: {})
        self.on_placed = on_placed
        self._handlers_installed = False

    # ------------------------------------------------------------------ messages

    def say(self, message: str) -> None:
        print(f"[launcher] {message}", file=self.out, flush=True)

    # ------------------------------------------------------------------ signals

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            if self.stop_signal is not None:  # a second Ctrl-C: do not wait for the grace period
                self.stop_timeout_s = 0.5
            self.stop_signal = signum

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        self._handler = handler
        self._handlers_installed = True

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        """Run until the foreground child finishes, a child fails for good, or a stop signal arrives."""
        try:
            return self._loop()
        except RunFailed as failure:
            self.say(f"{failure.child} failed: {failure.reason}")
            self.say(f"last lines of {failure.log_path}:")
            print(failure.log_tail, file=self.out, flush=True)
            return failure.exit_code
        finally:
            self.stop_all()
            self._http.close()

    def _loop(self) -> int:
        while True:
            if self.stop_signal is not None:
                self.say(f"got {signal.Signals(self.stop_signal).name}: stopping everything this launcher started")
                return 128 + self.stop_signal
            services = [c for c in self.children if not c.spec.foreground]
            if not self._announced_ready and all(c.state == READY for c in services):
                self._announced_ready = True  # before the foreground child's gate or start speaks
                if self.on_all_ready:
                    self.on_all_ready()
            now = time.monotonic()
            for child in self.children:
                self._advance(child, now)
                if child.spec.foreground:
                    self._echo(child)
            foreground = [c for c in self.children if c.spec.foreground]
            if foreground and all(c.state == DONE for c in foreground):
                return 0
            time.sleep(POLL_S)

    def _advance(self, child: Child, now: float) -> None:
        if child.state == WAITING and self._deps_ready(child) and self._announced(child) and self._gate_open(child):
            self._start(child)
        elif child.state == BACKOFF and now >= child.next_start:
            self._start(child)
        elif child.state in (STARTING, READY) and child.placed is not None:
            self._watch_placed(child, now)
        elif child.state in (STARTING, READY):
            assert child.proc is not None
            code = child.proc.poll()
            if code is not None:
                self._exited(child, code)
            elif child.state == STARTING:
                self._check_health(child, now)

    def _announced(self, child: Child) -> bool:
        """The foreground child starts after "all services healthy" was said (the next loop turn)."""
        return self._announced_ready or not child.spec.foreground

    def _gate_open(self, child: Child) -> bool:
        gate = child.spec.gate
        if gate is None:
            return True
        try:
            return gate()
        except Exception as exc:  # the gate's own failure ends the run like a child's
            owner = next((c for c in self.children if c.name == child.spec.gate_owner), child)
            raise RunFailed(owner.name, f"before {child.name} could start: {exc}", owner.spec.log_path,
                            tail(owner.spec.log_path, self.tail_lines)) from exc

    def _deps_ready(self, child: Child) -> bool:
        states = {c.name: c.state for c in self.children}
        return all(states.get(dep) in (READY, DONE) for dep in child.spec.depends_on)

    # ------------------------------------------------------------------ start / health / exit

    def _start(self, child: Child) -> None:
        spec = child.spec
        if spec.placement is not None:
            self._start_placed(child)
            return
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = list(spec.argv) + (spec.restart_argv_extra if child.restarts else [])
        with spec.log_path.open("ab") as log:
            in_window, in_all = len(child.recent_crashes), child.restarts
            earlier = f", {in_all} in all" if in_all > in_window else ""
            attempt = f" (restart {in_window}/{self.restart.max_restarts}{earlier})" if in_all else ""
            log.write(f"\n===== launcher: starting {spec.name}{attempt} at {time.strftime('%F %T')}: "
                      f"{' '.join(argv)}\n".encode())
            log.flush()
            child.echo_offset = log.tell() if not child.restarts else child.echo_offset
            env = {**os.environ, **spec.env, **({MARKER: self.launch_id} if self.launch_id else {})}
            child.proc = subprocess.Popen(argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=_die_with_parent)
        child.pgid = child.proc.pid  # start_new_session: the child leads its own group
        child.started_at = time.monotonic()
        child.last_health_check = 0.0
        child.unavailable = child.unavailable_since = None
        if child not in self._started_order:
            self._started_order.append(child)
        where = f" on port {spec.port}" if spec.port else ""
        self.say(f"started {spec.name}{where} (pid {child.proc.pid}, log {spec.log_path})")
        if spec.health_url is None and spec.health_tcp is None:
            self._mark_ready(child)
        else:
            child.state = STARTING

    # ------------------------------------------------------------------ placed services (Ray actors)

    def _start_placed(self, child: Child) -> None:
        spec = child.spec
        assert spec.placement is not None and spec.port is not None
        child.placed = PlacedService(spec.name, SERVICE_MODULES[spec.name], spec.port, spec.placement,
                                     self.ray_address, self.experiment)
        try:
            child.placed.start(self.placed_config(), dict(spec.env))
        except Exception as exc:  # Ray unreachable, a bad option: the run stops with Ray's reason
            child.state = FAILED
            raise RunFailed(spec.name, f"could not create its Ray actor: {exc}", spec.log_path,
                            "(no log: nothing started)") from exc
        if self._handlers_installed:  # ray.init, the first time, installs its own SIGTERM handler
            signal.signal(signal.SIGINT, self._handler)
            signal.signal(signal.SIGTERM, self._handler)
        child.started_at, child.last_health_check, child.state = time.monotonic(), 0.0, STARTING
        self._started_order.append(child)
        self.say(f"started {spec.name} as {child.placed.describe()} on port {spec.port}")

    def _watch_placed(self, child: Child, now: float) -> None:
        """Through Ray: the actor's state and where it runs; then /healthz at its node's address."""
        if now - child.last_health_check < HEALTH_EVERY_S:
            return
        child.last_health_check = now
        assert child.placed is not None
        seen = child.placed.poll()
        if seen.state == "dead":
            child.state = FAILED
            raise RunFailed(child.name, f"its Ray actor is gone and Ray will not restart it: {seen.error}",
                            child.spec.log_path, self._placed_log_tail(child))
        if seen.state == "restarting":
            if child.state == READY:
                self.say(f"{child.name}: its Ray actor died ({seen.error}); Ray is restarting it")
                child.state, child.started_at = STARTING, now
            return
        if seen.state != "up" or seen.where is None:  # no fresh answer yet: readiness waits for one
            if child.state == STARTING:
                self._placed_timeout(child, now)
            return
        where = seen.where
        if child.actor_pid != where["actor_pid"]:
            self._placed_at(child, where)
        if child.state == READY:
            return
        if self._healthy(child):
            self._mark_ready(child)
        else:
            self._placed_timeout(child, now)

    def _placed_at(self, child: Child, where: dict) -> None:
        """The actor's first report, or its first after Ray restarted it."""
        spec = child.spec
        if child.actor_pid is not None:
            child.restarts += 1
            self.say(f"{child.name}: Ray restarted its actor (restart {child.restarts}) on node "
                     f"{where['node_id'][:12]} ({where['node_ip']}), pid {where['actor_pid']}")
            if child.state == READY:
                child.state, child.started_at = STARTING, time.monotonic()
        else:
            self.say(f"{child.name} placed by Ray on node {where['node_id'][:12]} ({where['node_ip']}), actor pid "
                     f"{where['actor_pid']}, store {where['store']}, log {where['log']}")
        address = where["node_ip"]
        if spec.health_url is not None and placed_host(spec.name) in spec.health_url:
            spec.health_url = spec.health_url.replace(placed_host(spec.name), address)
            spec.log_path = Path(where["log"])  # on that node: readable here when it is this machine
            if self.on_placed:
                self.on_placed(spec.name, address)
        elif spec.health_url is not None and f"//{address}:" not in spec.health_url:
            self.say(f"{child.name}: now on {address}, but its peers were given {spec.health_url}; pin it to one "
                     f"node (launcher.placement.{child.name}.node_labels) so a restart keeps its address")
        child.actor_pid = where["actor_pid"]

    def _placed_timeout(self, child: Child, now: float) -> None:
        if now - child.started_at <= self.health_timeout_s:
            return
        child.state = FAILED
        placed = child.placed
        assert placed is not None
        if placed.where is None:
            raise RunFailed(child.name, f"Ray placed its actor on no node within {self.health_timeout_s:.0f}s: no "
                            f"node has {placed.wanted()} with {placed.placement.num_cpus:g} CPU free (`ray status` "
                            f"lists the nodes; a node's labels are the --labels of its `ray start`)",
                            child.spec.log_path, "(no log: the service never started)")
        raise RunFailed(child.name, f"not healthy after {self.health_timeout_s:.0f}s on node {placed.where['node_ip']} "
                        f"({self._health_target(child)})", child.spec.log_path, self._placed_log_tail(child))

    def _placed_log_tail(self, child: Child) -> str:
        """The service's log on its node: read here when that node is this machine, else asked of its actor."""
        if child.spec.log_path.is_file():
            return tail(child.spec.log_path, self.tail_lines)
        assert child.placed is not None
        return child.placed.log_tail(self.tail_lines)

    def _check_health(self, child: Child, now: float) -> None:
        if now - child.last_health_check < HEALTH_EVERY_S:
            return
        child.last_health_check = now
        if self._healthy(child):
            self._mark_ready(child)
        elif child.unavailable_since is not None and now - child.unavailable_since > UNAVAILABLE_LIMIT_S:
            self._kill_group(child, signal.SIGKILL)
            self._crashed(child, f"not ready for {UNAVAILABLE_LIMIT_S:.0f}s: {child.unavailable}", retry=False)
        elif now - child.started_at > self.health_timeout_s:
            self._kill_group(child, signal.SIGKILL)
            why = f": {child.unavailable}" if child.unavailable else ""
            self._crashed(child, f"not healthy after {self.health_timeout_s:.0f}s ({self._health_target(child)}){why}")

    def _healthy(self, child: Child) -> bool:
        spec = child.spec
        if spec.health_url:
            try:
                response = self._http.get(spec.health_url)
            except httpx.HTTPError:
                return False
            self._note_unavailable(child, response)
            return response.status_code == 200
        assert spec.health_tcp is not None
        try:
            with socket.create_connection(spec.health_tcp, timeout=1):
                return True
        except OSError:
            return False

    @staticmethod
    def _note_unavailable(child: Child, response: httpx.Response) -> None:
        """Remember the reason a 503 /healthz gives (`{"status": "unavailable", "reason"}`), and since when."""
        reason = None
        if response.status_code == 503:
            try:
                body = response.json()
            except ValueError:
                body = None
            if isinstance(body, dict) and body.get("status") == "unavailable":
                reason = str(body.get("reason") or "unavailable")
        if reason is None:
            child.unavailable = child.unavailable_since = None
        elif child.unavailable_since is None:
            child.unavailable, child.unavailable_since = reason, time.monotonic()
        else:
            child.unavailable = reason

    @staticmethod
    def _health_target(child: Child) -> str:
        spec = child.spec
        if spec.health_url:
            return spec.health_url
        return f"tcp {spec.health_tcp[0]}:{spec.health_tcp[1]}" if spec.health_tcp else "-"

    def _mark_ready(self, child: Child) -> None:
        child.state = READY
        child.ready_s = time.monotonic() - child.started_at
        if child.spec.health_url or child.spec.health_tcp:
            self.say(f"{child.name} is healthy ({child.ready_s:.1f}s)")

    def _exited(self, child: Child, code: int) -> None:
        child.exit_codes.append(code)
        self._kill_group(child, signal.SIGKILL)  # what it left behind must not hold its port
        if child.spec.foreground and code == 0:
            self._echo(child)
            child.state = DONE
            self.say(f"{child.name} finished")
            return
        self._crashed(child, f"exited with code {code}" + NO_RESTART_EXITS.get(code, ""),
                      retry=code not in NO_RESTART_EXITS,
                      exit_code=code if child.spec.foreground and code in PASSED_ON_EXITS else 1)

    def _crashed(self, child: Child, reason: str, retry: bool = True, exit_code: int = 1) -> None:
        if child.spec.foreground:
            self._echo(child)
        policy, now = self.restart, time.monotonic()
        while child.recent_crashes and now - child.recent_crashes[0] > policy.window_s:
            child.recent_crashes.popleft()
        if retry and child.spec.restartable and len(child.recent_crashes) < policy.max_restarts:
            child.recent_crashes.append(now)
            child.restarts += 1
            in_window = len(child.recent_crashes)
            delay = min(policy.backoff_s * 2 ** (in_window - 1), policy.backoff_max_s)
            child.state, child.next_start = BACKOFF, now + delay
            earlier = f" ({child.restarts} in all)" if child.restarts > in_window else ""
            self.say(f"{child.name} {reason}; restart {in_window}/{policy.max_restarts} in {delay:.1f}s{earlier}")
            return
        child.state = FAILED
        gave_up = ""
        if retry and child.spec.restartable and policy.max_restarts:
            gave_up = (f" after {len(child.recent_crashes)} restart(s) within {policy.window_s:.0f}s: a crash loop "
                       f"(the budget is launcher.restart.max_restarts={policy.max_restarts} per "
                       f"launcher.restart.window_s={policy.window_s:.0f}s)")
        elif child.restarts:
            gave_up = f" after {child.restarts} restart(s)"
        raise RunFailed(child.name, reason + gave_up, child.spec.log_path, tail(child.spec.log_path, self.tail_lines),
                        exit_code=exit_code)

    def _echo(self, child: Child) -> None:
        """Copy what the foreground child wrote since last time to our stdout."""
        path = child.spec.log_path
        if not path.is_file():
            return
        with path.open("rb") as f:
            f.seek(child.echo_offset)
            chunk = f.read()
        if chunk:
            child.echo_offset += len(chunk)
            self.out.write(chunk.decode(errors="replace"))
            self.out.flush()

    # ------------------------------------------------------------------ teardown

    def _kill_group(self, child: Child, sig: int) -> None:
        if child.pgid is not None and process_alive(child.pgid, group=True):
            try:
                os.killpg(child.pgid, sig)
            except ProcessLookupError:
                pass

    def stop_all(self) -> None:
        """SIGTERM each started group in reverse start order, wait, SIGKILL the rest; reap everything."""
        for child in reversed(self._started_order):
            if child.placed is not None:
                self.say(f"stopping {child.name} (its Ray actor)")
                child.placed.stop(min(self.stop_timeout_s, child.spec.stop_timeout_s or self.stop_timeout_s))
                if child.state not in (DONE, FAILED):
                    child.state = STOPPED
                continue
            if child.spec.ray_head:
                disconnect()  # the launcher's own Ray driver, if placed services made one, before its head stops
            if child.pgid is None or not process_alive(child.pgid, group=True):
                self._reap(child)
                continue
            self.say(f"stopping {child.name}")
            grace = min(self.stop_timeout_s, child.spec.stop_timeout_s or self.stop_timeout_s)
            if child.spec.ray_head:
                stubborn = stop_ray_processes(_group_members(child.pgid), grace, reap=lambda c=child: self._reap(c))
                if stubborn:
                    self.say(f"{child.name}: {len(stubborn)} Ray process(es) ignored SIGTERM for their share "
                             f"of {grace:.0f}s: SIGKILL")
            self._kill_group(child, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self._reap(child)
                if not process_alive(child.pgid, group=True):
                    break
                time.sleep(0.1)
            if process_alive(child.pgid, group=True):
                self.say(f"{child.name} did not stop within {grace:.0f}s of SIGTERM: SIGKILL")
                self._kill_group(child, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while process_alive(child.pgid, group=True) and time.monotonic() < deadline:
                    self._reap(child)
                    time.sleep(0.05)
            self._reap(child)
            if child.state not in (DONE, FAILED):
                child.state = STOPPED
        disconnect()
        if self.launch_id:
            strays = marked_processes(self.launch_id)
            if strays:
                self.say(f"stopping {len(strays)} process(es) the children started outside their groups")
                terminate(strays, min(self.stop_timeout_s, 5.0))
        for path in self.cleanup_files:
            path.unlink(missing_ok=True)

    @staticmethod
    def _reap(child: Child) -> None:
        if child.proc is not None and child.proc.poll() is None:
            try:
                child.proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass

    def status(self) -> list[dict]:
        return [{"name": c.name, "state": c.state, "restarts": c.restarts, "exit_codes": c.exit_codes,
                 "ready_s": c.ready_s, "pid": c.proc.pid if c.proc else None,
                 **({"ray_actor": c.placed.where} if c.placed else {})} for c in self.children]
