"""Hosting commands: `worker` (runs leased Attempts; another process cycles) and
`serve` (cycles plus local workers)."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from qlflow import event_log
from qlflow import retention_policy as policies
from qlflow.cli import logs
from qlflow.cli.app import RUN_AND_HOST, app
from qlflow.cli.executors import default_log_dir, default_worker_id, local_executor
from qlflow.cli.exits import EXIT_INTERRUPTED, CliError
from qlflow.cli.opening import opened, redact
from qlflow.cli.options import (
    LOG_FORMATS,
    DrainOption,
    KillAfterOption,
    LogDirOption,
    LogFormatOption,
    MetricsHostOption,
    MetricsPortOption,
    PackageDirOption,
    TracesOption,
    TtlOption,
    at_least,
    check_ttl,
    package_folder,
    split_list,
)
from qlflow.cli.output import stderr_console, stdout_console
from qlflow.cli.signals import SignalRelay
from qlflow.driver import DEFAULT_SERVE_INTERVAL_MS, Driver
from qlflow.executor import DEFAULT_KILL_AFTER_S, PublishedTasks
from qlflow.executor.local import remove_local_logs
from qlflow.runtime import Runtime

log = logging.getLogger("qlflow.cli")
SlotTracker = Callable[[int, Callable[[], int]], None]


@contextlib.contextmanager
def traced(rt: Runtime, wanted: bool) -> Iterator[None]:
    """While hosting with --traces: a trace of every Run that ends (`qlflow.tracing`)."""
    if not wanted:
        yield
        return
    try:
        from qlflow import tracing
    except ImportError as error:
        raise CliError(
            f"--traces needs the otel extra: pip install 'qlflow[otel]' ({error})"
        ) from None
    runs = tracing.trace_runs(rt)
    try:
        yield
    finally:
        runs.close()


@contextlib.contextmanager
def notifying(rt: Runtime, wanted: bool, say: Callable[..., None]) -> Iterator[None]:
    """While serving: deliver the notification outbox on a thread of its own
    (`qlflow.notifications`), each attempt logged."""
    if not wanted:
        yield
        return
    from qlflow.notifications import AttemptResult, Notifier

    def on_attempt(result: AttemptResult) -> None:
        outcome = "delivered" if result.delivered else f"failed ({result.error})"
        say(
            f"qlflow: notification for run {result.run_id} (rule {result.rule}), attempt "
            f"{result.attempt}: {outcome}",
            "notification",
            run_id=result.run_id,
            rule=result.rule,
            attempt=result.attempt,
            delivered=result.delivered,
            error=result.error,
        )

    notifier = Notifier(rt.store, on_attempt=on_attempt).start()
    try:
        yield
    finally:
        notifier.close()


@contextlib.contextmanager
def observed(
    rt: Runtime, metrics_port: int | None, metrics_host: str, say: Callable[..., None]
) -> Iterator[SlotTracker]:
    """While hosting: log what the commits do (`qlflow.event_log`) and, with a
    metrics port, count them and serve /metrics; yields what reports the slots."""
    stop_logs = event_log.log_commits(rt.store)
    if metrics_port is None:
        try:
            yield lambda _total, _in_use: None
        finally:
            stop_logs()
        return
    from prometheus_client import start_http_server

    from qlflow import metrics

    handle = metrics.instrument(rt)
    try:
        server, thread = start_http_server(metrics_port, metrics_host, registry=metrics.registry())
    except OSError as error:
        handle.close()
        stop_logs()
        raise CliError(f"--metrics-port {metrics_port}: cannot listen ({error})") from error
    port = server.server_address[1]
    say(f"qlflow: metrics at http://{metrics_host}:{port}/metrics", "metrics", port=port)
    try:
        yield metrics.track_slots
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        handle.close()
        stop_logs()


def _host(
    ctx: typer.Context,
    *,
    cycles: bool,
    worker_id: str | None,
    slots: int,
    interval_ms: int,
    ttl_ms: int,
    kill_after_ms: int,
    drain_ms: int,
    package_dirs: list[Path] | None,
    tasks: list[str] | None,
    once: bool,
    log_dir: Path | None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    log_format: str = "human",
    traces: bool = False,
    retention: policies.RetentionPolicy | None = None,
) -> None:
    at_least("--interval-ms", interval_ms)
    at_least("--metrics-port", metrics_port, 0)
    if log_format not in LOG_FORMATS:
        raise CliError(f"--log-format must be human or json, got {log_format!r}")
    as_json = log_format == "json"
    if as_json:
        logs.use_json()
    at_least("--kill-after-ms", kill_after_ms, 0)
    at_least("--drain-ms", drain_ms, 0)
    check_ttl(ttl_ms)
    folders = [package_folder(p) for p in package_dirs or []]
    err = stderr_console()
    host_id = worker_id or default_worker_id()

    def say(message: str, event: str = "host", **fields: Any) -> None:
        """A host's message: a line for a person, or a JSON event naming the host."""
        if as_json:
            event_log.emit(event, message, worker_id=host_id, **fields)
        else:
            err.print(message, soft_wrap=True, highlight=False)

    if not folders:
        if not cycles:
            raise CliError(
                "a worker needs --package-dir: the folder of each package whose Tasks it runs"
            )
        say("qlflow: serve without --package-dir only cycles; workers run nothing here")
    with (
        opened(ctx) as rt,
        observed(rt, metrics_port, metrics_host, say) as track_slots,
        traced(rt, traces),
        notifying(rt, cycles and not once, say),
    ):
        published = PublishedTasks(rt)
        for folder in folders:
            published.add_folder(folder)
        name = "serve" if cycles else "worker"
        say(
            f"qlflow {name}: {redact(rt.url)} ({rt.profile.name}); "
            + (f"a cycle every {interval_ms} ms; " if cycles else "")
            + f"{slots} slot(s) for {', '.join(published.packages) or 'no package'}; "
            f"lease TTL {ttl_ms} ms; on SIGTERM running steps get {drain_ms} ms to finish"
        )
        executor = local_executor(
            ctx, rt, published, log_dir=log_dir, ttl_ms=ttl_ms, kill_after_ms=kill_after_ms
        )
        driver = Driver(
            rt,
            executor,
            worker_id=host_id,
            workers=slots,
            interval_ms=interval_ms,
            ttl_ms=ttl_ms,
            cycles=cycles,
            tasks=split_list(tasks),
            servable=published.task_refs,
            once=once,
            drain_s=drain_ms / 1000,
            retention=_with_local_logs(retention, log_dir or default_log_dir(rt.url)),
        )
        track_slots(slots, lambda: driver.pool.busy)

        def on_signal(signum: int) -> None:
            if not driver.stop.is_set():
                say(
                    f"qlflow: {signal.Signals(signum).name}: no new leases; "
                    f"{driver.pool.busy} running step(s) get {drain_ms} ms to finish, then "
                    "SIGTERM (recorded interrupted: they run again on the next host). "
                    "Signal again to exit at once.",
                    "drain_started",
                    signal=signal.Signals(signum).name,
                    running=driver.pool.busy,
                    drain_ms=drain_ms,
                )
                published.stop_reads()  # a step not started yet is left to its lease
                driver.request_stop()
            else:
                driver.request_abort()

        try:
            with SignalRelay(on_signal):
                result = driver.run()
        finally:
            executor.close()
    for report in result.reports:
        log.info(
            "attempt %s (%s/%s): %s, exit %s",
            report.attempt_id,
            report.run_id,
            report.step_key,
            report.recorded_status,
            report.exit_code,
        )
    if result.drain is not None:
        drain = result.drain
        say(
            f"qlflow: stopped in {drain.took_s * 1000:.0f} ms: {drain.finished} of "
            f"{drain.running} running step(s) finished within the drain, {drain.stopped} "
            "stopped (worker_shutdown)",
            "drain",
            running=drain.running,
            finished=drain.finished,
            stopped=drain.stopped,
            took_ms=round(drain.took_s * 1000),
        )
    if result.aborted:
        for process in result.left_running:
            say(
                f"qlflow: killed step {process.step_key} of run {process.run_id} "
                f"(pid {process.pid}); a later cycle records it lost",
                "killed",
                run_id=process.run_id,
                step_key=process.step_key,
                pid=process.pid,
            )
        raise typer.Exit(EXIT_INTERRUPTED)
    if once:
        stdout_console().print(f"{len(result.reports)} attempt(s) run")


@app.command(
    rich_help_panel=RUN_AND_HOST,
    epilog=(
        "Example: [bold]qlflow worker --package-dir examples/nightly --limit 4[/bold]\n\n"
        "Leases claimed Attempts (another process runs the cycles: [bold]qlflow serve"
        "[/bold] or [bold]qlflow cycle[/bold]), runs each in its package folder, renews "
        "its lease every TTL/3 and records the outcome. SIGTERM or Ctrl-C stops leasing; "
        "running steps get --drain-ms to finish, then SIGTERM and SIGKILL."
    ),
)
def worker(
    ctx: typer.Context,
    worker_id: Annotated[
        str | None, typer.Option("--id", help="Worker id (default host-pid).")
    ] = None,
    limit: Annotated[int, typer.Option(help="Attempts run at once.")] = 1,
    ttl_ms: TtlOption = 30_000,
    once: Annotated[
        bool, typer.Option("--once", help="One lease pass: run what it got, then exit.")
    ] = False,
    tasks: Annotated[
        list[str] | None,
        typer.Option(help="Only these task refs (package@generation#task, comma separated)."),
    ] = None,
    package_dir: PackageDirOption = None,
    interval_ms: Annotated[
        int, typer.Option(help="Lease poll interval.")
    ] = DEFAULT_SERVE_INTERVAL_MS,
    drain_ms: DrainOption = 10_000,
    kill_after_ms: KillAfterOption = int(DEFAULT_KILL_AFTER_S * 1000),
    log_dir: LogDirOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
    log_format: LogFormatOption = "human",
    traces: TracesOption = False,
) -> None:
    """Run leased Attempts as local processes (no cycles: a separate worker)."""
    at_least("--limit", limit)
    _host(
        ctx,
        cycles=False,
        worker_id=worker_id,
        slots=limit,
        interval_ms=interval_ms,
        ttl_ms=ttl_ms,
        kill_after_ms=kill_after_ms,
        drain_ms=drain_ms,
        package_dirs=package_dir,
        tasks=tasks,
        once=once,
        log_dir=log_dir,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        log_format=log_format,
        traces=traces,
    )


@app.command(
    rich_help_panel=RUN_AND_HOST,
    epilog=(
        "Example: [bold]qlflow serve --package-dir examples/nightly --interval-ms 500 "
        "--workers 4[/bold]\n\n"
        "A host-less deployment: every interval one cycle, then local workers lease and "
        "run what it admitted. SIGTERM (or Ctrl-C) stops leasing, gives running steps "
        "--drain-ms to finish, then SIGTERM and SIGKILL after --kill-after-ms, and exits 0."
    ),
)
def serve(
    ctx: typer.Context,
    interval_ms: Annotated[
        int, typer.Option(help="Cycle interval (a finished step wakes it early).")
    ] = DEFAULT_SERVE_INTERVAL_MS,
    workers: Annotated[int, typer.Option(help="Attempts run at once.")] = 4,
    worker_id: Annotated[str | None, typer.Option("--id", help="Worker id.")] = None,
    ttl_ms: TtlOption = 30_000,
    package_dir: PackageDirOption = None,
    drain_ms: DrainOption = 10_000,
    kill_after_ms: KillAfterOption = int(DEFAULT_KILL_AFTER_S * 1000),
    log_dir: LogDirOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = "127.0.0.1",
    log_format: LogFormatOption = "human",
    traces: TracesOption = False,
    retain_finished: Annotated[
        str | None,
        typer.Option(
            metavar="AGE",
            help="Remove Runs that finished longer ago than this (30d), one bounded "
            "batch after each cycle.",
        ),
    ] = None,
    retain_logs: Annotated[
        str | None,
        typer.Option(metavar="AGE", help="Delete step logs last written longer ago (7d)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help='A host config (TOML) whose [retention] table sets finished_runs = "30d", '
            'logs = "7d".',
        ),
    ] = None,
) -> None:
    """Cycles plus local workers in a loop, until SIGTERM."""
    at_least("--workers", workers)
    policy = policies.from_config(config) if config is not None else policies.RetentionPolicy()
    if retain_finished is not None:
        policy.finished_runs_ms = policies.parse_age("--retain-finished", retain_finished)
    if retain_logs is not None:
        policy.logs_ms = policies.parse_age("--retain-logs", retain_logs)
    _host(
        ctx,
        cycles=True,
        worker_id=worker_id,
        slots=workers,
        interval_ms=interval_ms,
        ttl_ms=ttl_ms,
        kill_after_ms=kill_after_ms,
        drain_ms=drain_ms,
        package_dirs=package_dir,
        tasks=None,
        once=False,
        log_dir=log_dir,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        log_format=log_format,
        traces=traces,
        retention=policy,
    )


def _with_local_logs(
    policy: policies.RetentionPolicy | None, folder: Path
) -> policies.RetentionPolicy | None:
    """`policy`, also deleting the local log folders of the Runs it removes."""
    if policy is None or not policy.active:
        return None
    policy.on_removed = lambda run_ids: remove_local_logs(folder, run_ids)
    return policy
