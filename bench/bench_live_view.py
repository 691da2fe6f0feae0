"""The live run view: loop-to-DOM latency, 100 websocket viewers against the loop's
tick, and the run view's page load.

    .venv/bin/python bench/bench_live_view.py [--viewers 100] [--cycles 4] [--window-s 12]
                                              [--browser-s 40] [--loads 10] [--screenshots DIR]

What it measures (targets from issue 6):

1. **Latency**, p95 <= 500 ms: from the moment the balance loop observed the levels
   (``_measure`` returns) to the moment the run view in Chromium has updated its DOM
   with that tick (and, separately, to the next animation frame: painted). The driver
   runs in this process so each published snapshot can carry that observation time;
   the page logs when it rendered each snapshot. Same machine, same wall clock.
2. **Viewers**, tick p99 unchanged within 10%: the loop's tick duration (the driver's
   whole ``_tick``), the interval between ticks and the publish call (``group_send``,
   timed where the driver makes it) in windows without viewers and windows with
   ``--viewers`` websocket clients (a separate process, so they do not share this
   process's interpreter) connected to the run's websocket through the ASGI server,
   alternating on one run so that the run's drift and the machine's other load fall on
   both kinds of window alike.
3. **Page load**, < 1 s: the run view of a live run loaded ``--loads`` times:
   DOMContentLoaded, load, and the first snapshot rendered.

Starts its own embedded services under ``var/bench-live`` (or uses DATABASE_URL,
REDIS_URL, ZK_HOSTS), the ASGI server (daphne) and one Spark worker; the run is the
skewed reference pipeline of the browser tests (slow branches, small pools) over a
generated input large enough to outlast each phase. Results are printed and written to
``test-artifacts/bench/live_view.json``. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import psutil

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

TARGET_LATENCY_P95_MS = 500.0
TARGET_TICK_P99_RATIO = 1.10
TARGET_LOAD_S = 1.0
BATCH = 10  # viewers connecting at once
GENERATOR = "seed=11,volume_mb=48,dominance=0.85,skew_mean_s=1000"
CHROMIUM = os.environ.get("BPCONSOLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "bench"


def pct(samples: list[float], q: int) -> float:
    if len(samples) < 2:
        return samples[0] if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50": pct(samples, 50),
        "p95": pct(samples, 95),
        "p99": pct(samples, 99),
        "max": max(samples) if samples else float("nan"),
    }


def show(label: str, s: dict[str, float], unit: str = "ms") -> str:
    return (
        f"{label:<34} n={s['n']:<5} p50 {s['p50']:8.1f} {unit}  p95 {s['p95']:8.1f} {unit}  "
        f"p99 {s['p99']:8.1f} {unit}  max {s['max']:8.1f} {unit}"
    )


# -- the viewers' process ---------------------------------------------------------------


def viewer_process(url: str, cookie: str, origin: str, count: int) -> None:
    """Websocket clients on ``url``, steered by lines on stdin: ``connect`` opens
    ``count`` of them (answers ``connected N``), ``disconnect`` closes them all
    (``disconnected``), ``quit`` prints the per-window statistics as JSON and exits."""
    from autobahn.asyncio.websocket import WebSocketClientFactory, WebSocketClientProtocol

    window: dict[str, Any] = {}
    open_clients: set[Any] = set()

    class Viewer(WebSocketClientProtocol):
        def onOpen(self) -> None:  # autobahn's callback names
            self.messages = 0
            open_clients.add(self)

        def onMessage(self, payload: bytes, is_binary: bool) -> None:
            now_ms = time.time() * 1000
            message = json.loads(payload)
            self.messages += 1
            window["messages"] += 1
            bench = message.get("bench")
            if bench:
                window["latency_ms"].append(now_ms - bench["observed_ms"])

        def onClose(self, was_clean: bool, code: int | None, reason: str | None) -> None:
            if self in open_clients:
                open_clients.discard(self)
                window["closed_early"] += 0 if window.get("closing") else 1

    async def main() -> None:
        # autobahn ships a py.typed marker but leaves these two unannotated.
        factory = WebSocketClientFactory(  # type: ignore[no-untyped-call]
            url, origin=origin, headers={"Cookie": cookie}
        )
        factory.protocol = Viewer
        # A browser waits for a busy server; autobahn's default gives up after 5 s.
        factory.setProtocolOptions(  # type: ignore[no-untyped-call]
            openHandshakeTimeout=60, closeHandshakeTimeout=10
        )
        host, port = url.split("//")[1].split("/", maxsplit=1)[0].split(":")
        loop = asyncio.get_running_loop()
        windows = []
        while True:
            command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if command == "connect":
                window.clear()
                window.update(messages=0, latency_ms=[], closed_early=0)
                began = time.monotonic()
                # Viewers arrive in groups of BATCH, each group once the last is in.
                for first in range(0, count, BATCH):
                    wanted = min(count, first + BATCH)
                    for _ in range(first, wanted):
                        await loop.create_connection(factory, host, int(port))
                    deadline = time.monotonic() + 30
                    while len(open_clients) < wanted and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)
                seconds = time.monotonic() - began
                print(f"connected {len(open_clients)} in {seconds:.1f} s", flush=True)
            elif command == "disconnect":
                window["closing"] = True
                for client in list(open_clients):
                    client.sendClose()
                deadline = time.monotonic() + 30
                while open_clients and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                windows.append({k: v for k, v in window.items() if k != "closing"})
                print("disconnected", flush=True)
            else:
                print(json.dumps(windows), flush=True)
                return

    asyncio.run(main())


# -- the console under test --------------------------------------------------------------


@contextlib.contextmanager
def console(var_dir: Path) -> Iterator[dict[str, Any]]:
    from orchestrator.services.embedded import die_with_parent, free_port
    from orchestrator.services.launcher import Launcher

    with Launcher(var_dir) as endpoints:
        port = free_port()
        env = {
            **os.environ,
            **endpoints.as_env(),
            "DJANGO_SETTINGS_MODULE": "webapp.settings.local",
            "BPCONSOLE_VAR_DIR": str(var_dir),
            # The pages served on this port may open the run view's websocket to it.
            "BPCONSOLE_PORT": str(port),
        }
        os.environ.update(env)
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            env=env,
            cwd=PROJECT_ROOT,
            check=True,
        )
        logs = var_dir / "log"
        logs.mkdir(parents=True, exist_ok=True)
        children = []
        for name, args in (
            (
                "daphne",
                ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "webapp.asgi:application"],
            ),
            (
                "spark",
                [
                    "-m",
                    "celery",
                    "-A",
                    "orchestrator.celery",
                    "worker",
                    "-Q",
                    "spark",
                    "--concurrency",
                    "1",
                    "-n",
                    "spark@bench-live",
                    "--loglevel",
                    "WARNING",
                ],
            ),
        ):
            with (logs / f"{name}.log").open("ab") as log:
                children.append(
                    subprocess.Popen(
                        [sys.executable, *args],
                        env=env,
                        cwd=PROJECT_ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent(signal.SIGTERM),  # noqa: PLW1509
                    )
                )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/login/", timeout=2):  # noqa: S310
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"daphne did not come up; see {logs}") from None
                    time.sleep(0.2)
            yield {"url": url, "env": env, "logs": logs, "daphne": children[0].pid}
        finally:
            for child in children:
                child.terminate()
            for child in children:
                try:
                    child.wait(20)
                except subprocess.TimeoutExpired:
                    child.kill()


class Bench:
    def __init__(self, url: str, daphne_pid: int) -> None:
        import django

        django.setup()
        from celery import current_app
        from django.contrib.auth.models import Group, User
        from django.test import Client

        from orchestrator.celery import app
        from tests.orchestrator.run.scenarios import policy, skewed_reference
        from webapp.console.models import Policy
        from webapp.console.topology_io import save_document

        app.set_current()
        if current_app.main != "bpconsole":
            raise RuntimeError("the project's Celery app is not the current one")
        self.url = url
        self.daphne_pid = daphne_pid
        doc = skewed_reference()
        doc["description"] = (
            "The published reference topology with small buffers (512 KB) and two slow "
            "branches (task1, task2 at 2 Mb/s): the fast variant the browser tests run."
        )
        self.pipeline, _ = save_document(doc)
        self.doc = doc
        self.policy = policy()
        Policy.objects.update_or_create(name="fast-demo", defaults=self.policy)
        user, _ = User.objects.get_or_create(username="bench")
        user.groups.add(Group.objects.get(name="operator"))
        self.user = user
        client = Client()
        client.force_login(user)
        self.session = client.cookies["sessionid"].value

    # -- a run driven in this process, timed --------------------------------------------

    def start(self) -> Any:
        from orchestrator import service

        return service.create_run(
            topology=self.doc,
            policy=self.policy,
            pipeline_id=self.pipeline.pk,
            generator=GENERATOR,
            user=self.user,
        )

    def drive(self, run: Any) -> dict[str, Any]:
        """Drive ``run`` in a thread with a timed tick; returns the shared record."""
        from django.conf import settings
        from django.db import connection

        from orchestrator.run.driver import RunDriver
        from orchestrator.run.publisher import publish
        from orchestrator.tasks import _dispatch
        from orchestrator.zk.control_plane import ControlPlane

        # (monotonic time at the end, duration in ms) of every tick and every publish
        record: dict[str, Any] = {"ticks": [], "publishes": [], "first_tick": None}
        last_levels: dict[str, float] = {}

        class TimedDriver(RunDriver):
            def _measure(self, topology: Any) -> Any:
                measured = super()._measure(topology)
                self.observed_ms = time.time() * 1000
                return measured

            def _node_states(self, observation: Any, full_in: Any = None) -> Any:
                # Stamp each tick's states with the time its levels were observed: the
                # snapshot is built later (the driver publishes from a reporter thread).
                states = super()._node_states(observation, full_in)
                for state in states.values():
                    cast("dict[str, Any]", state)["bench_observed_ms"] = self.observed_ms
                return states

            def _tick(self) -> None:
                began = time.perf_counter()
                super()._tick()
                record["ticks"].append((time.monotonic(), (time.perf_counter() - began) * 1000))
                record["first_tick"] = record["first_tick"] or time.monotonic()

        def timed_publish(run_id: int, message: Mapping[str, object]) -> None:
            snapshot = cast("dict[str, Any]", message)
            levels = {n["name"]: n["state"].get("level") for n in snapshot["nodes"]}
            changed = levels != last_levels
            last_levels.clear()
            last_levels.update(levels)
            stamped = [n["state"].get("bench_observed_ms") for n in snapshot["nodes"]]
            observed = next((t for t in stamped if t), None)
            snapshot["bench"] = {
                "observed_ms": observed or getattr(driver, "observed_ms", time.time() * 1000),
                "level_changed": changed,
            }
            began = time.perf_counter()
            publish(run_id, snapshot)
            record["publishes"].append((time.monotonic(), (time.perf_counter() - began) * 1000))

        driver: Any = None

        def target() -> None:
            try:
                with ControlPlane.connect(settings.ZK_HOSTS) as control:
                    nonlocal driver
                    driver = TimedDriver(
                        run.pk,
                        control,
                        f"bench:{os.getpid()}",
                        dispatch=_dispatch,
                        publish=timed_publish,
                    )
                    record["outcome"] = driver.drive()
            finally:
                # Celery result handles must go while the broker is still up.
                if driver is not None:
                    driver.batches.in_flight.clear()
                connection.close()

        thread = threading.Thread(target=target, name=f"driver-{run.pk}", daemon=True)
        record["thread"] = thread
        thread.start()
        return record

    def stop(self, run: Any, record: dict[str, Any]) -> None:
        from orchestrator import service

        with contextlib.suppress(service.RunError):
            service.set_status(run.pk, "cancelled", reason="benchmark phase over")
        record["thread"].join(60)

    def wait_ticks(self, record: dict[str, Any], seconds: float) -> None:
        deadline = time.monotonic() + 60
        while record["first_tick"] is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the driver never ticked")
            time.sleep(0.05)
        time.sleep(seconds)

    # -- phases ----------------------------------------------------------------------

    def ticks_with_viewers(self, viewers: int, cycles: int, window_s: float) -> dict[str, Any]:
        """One run; windows of ``window_s`` without viewers and with ``viewers`` clients
        alternate ``cycles`` times. Ticks are compared between the two kinds of window,
        so the run's own drift and the machine's other load fall on both alike."""
        run = self.start()
        ws = self.url.replace("http://", "ws://") + f"/ws/runs/{run.pk}/"
        process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--viewer-process",
                ws,
                f"sessionid={self.session}",
                self.url,
                str(viewers),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=PROJECT_ROOT,
        )

        def ask(command: str) -> str:
            process.stdin.write(command + "\n")  # type: ignore[union-attr]
            process.stdin.flush()  # type: ignore[union-attr]
            return process.stdout.readline().strip()  # type: ignore[union-attr]

        record = self.drive(run)
        self.wait_ticks(record, 2)
        spans: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        processes = {
            "driver (this process)": psutil.Process(),
            "daphne": psutil.Process(self.daphne_pid),
            "viewers": psutil.Process(process.pid),
        }
        cpu: dict[str, dict[str, float]] = {"off": {}, "on": {}}

        def window(kind: str) -> None:
            before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
            began = time.monotonic()
            time.sleep(window_s)
            spans[kind].append((began, time.monotonic()))
            for name, p in processes.items():
                used = sum(p.cpu_times()[:2]) - before[name]
                cpu[kind][name] = cpu[kind].get(name, 0.0) + used

        connected = []
        for cycle in range(cycles):
            window("off")
            answer = ask("connect")
            connected.append(answer)
            window("on")
            ask("disconnect")
            print(f"  cycle {cycle + 1}/{cycles}: {answer}")
        self.stop(run, record)
        windows = json.loads(ask("quit"))
        process.wait(30)

        def within(kind: str, samples: list[tuple[float, float]]) -> list[float]:
            return [d for t, d in samples if any(a <= t <= b for a, b in spans[kind])]

        def intervals(kind: str) -> list[float]:
            ends = [t for t, _ in record["ticks"]]
            return [
                (b - a) * 1000
                for a, b in itertools.pairwise(ends)
                if any(s <= a and b <= e for s, e in spans[kind])
            ]

        seconds = cycles * window_s

        latencies = [x for w in windows for x in w["latency_ms"]]
        return {
            "viewers": viewers,
            "run": run.pk,
            "cycles": cycles,
            "window_s": window_s,
            "connected": connected,
            "tick_ms": {k: summary(within(k, record["ticks"])) for k in ("off", "on")},
            "tick_interval_ms": {k: summary(intervals(k)) for k in ("off", "on")},
            "cpu_percent": {
                k: {name: round(100 * used / seconds, 1) for name, used in cpu[k].items()}
                for k in ("off", "on")
            },
            "publish_ms": {k: summary(within(k, record["publishes"])) for k in ("off", "on")},
            "viewer_latency_ms": summary(latencies),
            "viewer_messages": sum(w["messages"] for w in windows),
            "viewers_closed_early": sum(w["closed_early"] for w in windows),
        }

    def browser(self, seconds: float, loads: int, shots: Path | None) -> dict[str, Any]:
        from playwright.sync_api import sync_playwright

        run = self.start()
        record = self.drive(run)
        self.wait_ticks(record, 0)
        view = f"{self.url}/runs/{run.pk}/"
        out: dict[str, Any] = {"run": run.pk}
        # Playwright's sync API keeps an asyncio loop running in this thread; the ORM
        # calls below (stopping the run) are plain sync calls between its steps.
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1366, "height": 768})
            context.add_cookies([{"name": "sessionid", "value": self.session, "url": self.url}])
            page = context.new_page()
            page.goto(view)
            page.wait_for_selector("#connection[data-state=live]")
            page.click('g.node[data-node="task1"]')
            began = time.monotonic()
            shot_at = began + seconds * 0.75
            while time.monotonic() - began < seconds:
                if shots is not None and shot_at and time.monotonic() >= shot_at:
                    page.screenshot(path=str(shots / "run-1366x768.png"))
                    page.screenshot(path=str(shots / "run-1366x768-full.png"), full_page=True)
                    page.set_viewport_size({"width": 1920, "height": 1080})
                    page.wait_for_timeout(600)
                    page.screenshot(path=str(shots / "run-1920x1080.png"))
                    page.set_viewport_size({"width": 1366, "height": 768})
                    shot_at = 0
                page.wait_for_timeout(250)
            log = page.evaluate("() => bpConsole.state.renderLog")
            timed = [e for e in log if e.get("bench")]
            changed = [e for e in timed if e["bench"]["level_changed"]]
            out["dom_latency_ms"] = summary(
                [e["dom_ms"] - e["bench"]["observed_ms"] for e in changed]
            )
            out["paint_latency_ms"] = summary(
                [e["paint_ms"] - e["bench"]["observed_ms"] for e in changed if "paint_ms" in e]
            )
            out["snapshots_rendered"] = len(timed)
            loads_out = []
            for _ in range(loads):
                page.goto(view)
                page.wait_for_function("() => bpConsole.state.renderLog.length > 0")
                loads_out.append(
                    page.evaluate("""() => {
                    const nav = performance.getEntriesByType('navigation')[0];
                    const first = bpConsole.state.renderLog[0].dom_ms - performance.timeOrigin;
                    return {ttfb: nav.responseStart, dcl: nav.domContentLoadedEventEnd,
                            load: nav.loadEventEnd, first_snapshot: first};
                }""")
                )
            out["page_load_ms"] = {
                key: summary([x[key] for x in loads_out])
                for key in ("ttfb", "dcl", "load", "first_snapshot")
            }
            if shots is not None:
                page.goto(f"{self.url}/")
                page.screenshot(path=str(shots / "pipelines.png"))
                page.goto(f"{self.url}/pipelines/{self.pipeline.name}/")
                page.screenshot(path=str(shots / "pipeline.png"), full_page=True)
            browser.close()
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        self.stop(run, record)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--viewers", type=int, default=100)
    parser.add_argument("--cycles", type=int, default=4, help="without/with viewer windows")
    parser.add_argument("--window-s", type=float, default=12.0, help="seconds per window")
    parser.add_argument("--browser-s", type=float, default=40.0, help="seconds in Chromium")
    parser.add_argument("--loads", type=int, default=10, help="page loads of the run view")
    parser.add_argument("--screenshots", type=Path, default=None, help="save screenshots here")
    parser.add_argument(
        "--var-dir",
        type=Path,
        default=PROJECT_ROOT / "var" / "bench-live",
        help="scratch state folder (emptied first)",
    )
    parser.add_argument("--viewer-process", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.viewer_process:
        url, cookie, origin, count = args.viewer_process
        viewer_process(url, cookie, origin, int(count))
        return 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"generator": GENERATOR}
    # A scratch state folder: every run of the benchmark starts from empty services.
    shutil.rmtree(args.var_dir, ignore_errors=True)
    with console(args.var_dir) as up:
        bench = Bench(up["url"], up["daphne"])
        print(
            f"viewers: {args.cycles} x ({args.window_s:.0f} s without, "
            f"{args.window_s:.0f} s with {args.viewers} viewers) on one run"
        )
        results["viewers"] = bench.ticks_with_viewers(args.viewers, args.cycles, args.window_s)
        print(f"browser: {args.browser_s:.0f} s of latency, then {args.loads} page loads")
        results["browser"] = bench.browser(args.browser_s, args.loads, args.screenshots)
    (ARTIFACTS / "live_view.json").write_text(json.dumps(results, indent=2))
    v = results["viewers"]
    print()
    print(show("tick, no viewer", v["tick_ms"]["off"]))
    print(show(f"tick, {args.viewers} viewers", v["tick_ms"]["on"]))
    print(show("  tick interval, no viewer", v["tick_interval_ms"]["off"]))
    print(show(f"  tick interval, {args.viewers} viewers", v["tick_interval_ms"]["on"]))
    print(show("  publish, no viewer", v["publish_ms"]["off"]))
    print(show(f"  publish, {args.viewers} viewers", v["publish_ms"]["on"]))
    print(show("  loop -> viewer's socket", v["viewer_latency_ms"]))
    print(f"  CPU % of one core, no viewer: {v['cpu_percent']['off']}")
    print(f"  CPU % of one core, {args.viewers} viewers: {v['cpu_percent']['on']}")
    print(
        f"  messages received: {v['viewer_messages']}, viewers dropped: {v['viewers_closed_early']}"
    )
    b = results["browser"]
    print(show("loop -> DOM updated (level change)", b["dom_latency_ms"]))
    print(show("loop -> painted (level change)", b["paint_latency_ms"]))
    for key, s in b["page_load_ms"].items():
        print(show(f"run view load: {key}", s))
    ratio = v["tick_ms"]["on"]["p99"] / v["tick_ms"]["off"]["p99"]
    ok_latency = b["dom_latency_ms"]["p95"] <= TARGET_LATENCY_P95_MS
    ok_ticks = ratio <= TARGET_TICK_P99_RATIO
    ok_load = b["page_load_ms"]["load"]["p95"] / 1000 < TARGET_LOAD_S
    print(
        f"\nlatency p95 {b['dom_latency_ms']['p95']:.0f} ms (target <= 500): "
        f"{'ok' if ok_latency else 'MISSED'}"
    )
    print(
        f"tick p99 with {args.viewers} viewers / without: {ratio:.2f} (target <= 1.10): "
        f"{'ok' if ok_ticks else 'MISSED'}"
    )
    print(
        f"run view load p95 {b['page_load_ms']['load']['p95']:.0f} ms (target < 1000): "
        f"{'ok' if ok_load else 'MISSED'}"
    )
    return 0 if ok_latency and ok_ticks and ok_load else 1


if __name__ == "__main__":
    sys.exit(main())
