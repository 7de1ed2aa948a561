"""The Runtime's calls for finding out what happened: step logs (written by the
executor, read from any machine that reaches the store, pruned when old), short
ids, counting a search, and the packages with their generations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from domain.errors import InvalidInput
from domain.params import ParamDefinition
from domain.transitions import RUN_RUNNING, RUN_TERMINAL
from eventstore import logs as log_store
from eventstore.logs import LogState, Piece, Pruned
from projections import package_views, run_search, step_logs, views, workflow_params
from projections import workers as worker_views
from projections.package_views import PackageView
from projections.run_search import RunFilter
from projections.step_logs import LogAttempt, LogChunk
from projections.workers import WorkerView
from qlflow.arguments import instant, optional_text, positive, text, texts
from qlflow.store_bound import StoreBound

RUN_STATUSES = frozenset({RUN_RUNNING, *RUN_TERMINAL})  # what a runs search filters on
RECENT_MS = 3_600_000  # `workers()` lists those seen in the last hour by default


class Inspection(StoreBound):
    """Mixed into `Runtime`: the calls for finding out what happened; it needs the log
    cap of its profile too."""

    log_cap_bytes: int  # how much of one Attempt's output the store keeps (head and tail)

    # -- step logs ---------------------------------------------------------------------
    def append_log(
        self, attempt_id: str, pieces: Sequence[Piece], *, left_out: int = 0
    ) -> LogState:
        """Append output of a running Attempt to its log in the store: pieces of
        `(stream, at_ms, bytes)`, stream stdout | stderr | qlflow (a note of the
        executor). The log keeps the first and the last `log_cap_bytes / 2` bytes and
        marks what it dropped between them, counting `left_out` bytes the writer read
        but could not send. Returns what the log now holds."""
        attempt_id = text("attempt_id", attempt_id)
        cap = self.log_cap_bytes
        chunks = list(pieces) if isinstance(pieces, Sequence) else pieces
        return self._authority.execute(
            lambda tx: log_store.append(tx, attempt_id, chunks, cap, left_out=left_out),
            name="log",
        )

    def log_attempts(
        self, run_id: str, step_key: str | None = None, attempt: int | str | None = None
    ) -> list[LogAttempt]:
        """The Attempts of a Run (of one step; one of them: its number in the step, or
        its id) in claim order, each with what its log holds."""
        run_id = text("run_id", run_id)
        step_key = optional_text("step_key", step_key)
        if isinstance(attempt, int):
            positive("attempt", attempt)
        elif attempt is not None:
            text("attempt", attempt)
        run = views.get_run(self.store, run_id)  # NotFound for an unknown Run
        if step_key is not None and step_key not in run.steps:
            raise InvalidInput(
                "step_key",
                "step of the run",
                f"run {run_id!r} has no step {step_key!r}; its steps are {sorted(run.steps)}",
            )
        return step_logs.attempts(self.store, run_id, step_key, attempt)

    def logs(
        self,
        run_id: str,
        step_key: str | None = None,
        attempt: int | str | None = None,
        *,
        after: Mapping[str, int] | None = None,
    ) -> list[LogChunk]:
        """The output of a Run's steps as stored (of one step; of one Attempt: its number
        in the step or its id), Attempt by Attempt in claim order, chunks in order.
        `after` maps attempt ids to the last seq already read, to follow a running step."""
        named = self.log_attempts(run_id, step_key, attempt)
        return step_logs.read(self.store, named, None if after is None else _cursor(after))

    def last_log_lines(self, attempt_id: str, count: int = step_logs.LAST_LINES) -> list[str]:
        """The last `count` lines of one Attempt's log (none when it wrote nothing)."""
        attempt_id = text("attempt_id", attempt_id)
        positive("count", count, 1, 10_000)
        return step_logs.last_lines(self.store, log_store.state(self.store, attempt_id), count)

    def prune_logs(self, before_ms: int) -> Pruned:
        """Delete every step log last written before `before_ms` (never an event)."""
        before_ms = instant("before_ms", before_ms)
        return self._authority.execute(
            lambda tx: log_store.prune(tx, before_ms, tx.clock_ms()), name="prune"
        )

    # -- finding Runs ------------------------------------------------------------------
    def resolve_run_id(self, text_or_prefix: str) -> str:
        """The Run id a person typed: the id, or any unique prefix of it (with or without
        `run:`). NotFound when none matches; AmbiguousId listing the matches."""
        return run_search.resolve_run(self.store, text("run_id", text_or_prefix))

    def resolve_attempt_id(self, text_or_prefix: str, run_id: str | None = None) -> str:
        """The Attempt id a person typed (the id or a unique prefix, `wta:` optional),
        among one Run's Attempts if `run_id` is given."""
        return run_search.resolve_attempt(
            self.store, text("attempt_id", text_or_prefix), optional_text("run_id", run_id)
        )

    def short_run_ids(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The shortest prefix that names each Run (at least 8 hex digits of a derived
        id, without `run:`; an id chosen by hand whole)."""
        return run_search.short_ids(self.store, sorted(texts("run_ids", run_ids)))

    def count_runs(
        self,
        *,
        package: str | None = None,
        workflow: str | None = None,
        status: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        id_prefix: str | None = None,
        at_most: int = 10_000,
    ) -> int:
        """How many Runs `runs(...)` with these filters would list without a limit,
        counted up to `at_most` + 1."""
        run_filter = self._run_filter(package, workflow, status, since_ms, until_ms, id_prefix)
        return run_search.count_runs(self.store, run_filter, positive("at_most", at_most))

    def _run_filter(
        self,
        package: str | None,
        workflow: str | None,
        status: str | None,
        since_ms: int | None,
        until_ms: int | None,
        id_prefix: str | None,
    ) -> RunFilter:
        """The checked filter of a runs search."""
        if status is not None and (not isinstance(status, str) or status not in RUN_STATUSES):
            raise InvalidInput(
                "status",
                "run status",
                f"status must be one of {', '.join(sorted(RUN_STATUSES))}, got {status!r}",
            )
        return RunFilter(
            package=optional_text("package", package),
            workflow=optional_text("workflow", workflow),
            status=status,
            since_ms=None if since_ms is None else instant("since_ms", since_ms),
            until_ms=None if until_ms is None else instant("until_ms", until_ms),
            id_prefix=optional_text("id_prefix", id_prefix),
        )

    # -- workers -----------------------------------------------------------------------
    def workers(
        self, since_ms: int | None = None, *, now_ms: int | None = None, limit: int = 1_000
    ) -> list[WorkerView]:
        """The workers that run an Attempt now or leased, renewed or completed one at or
        after `since_ms` (default: the hour before `now_ms`), the most recently seen
        first: host and slots as they said, Attempts running (and of those, under a
        lease that ran out), last renewal (docs/DESIGN.md, "Workers")."""
        now = self.store.clock_ms() if now_ms is None else instant("now_ms", now_ms)
        since = now - RECENT_MS if since_ms is None else instant("since_ms", since_ms)
        positive("limit", limit, 1, 10_000)
        return worker_views.list_workers(self.store, now, since, limit)

    # -- packages ----------------------------------------------------------------------
    def packages(self, package: str | None = None) -> list[PackageView]:
        """Every package installation (of one package name): its generations newest
        first, the current head, withdrawn or quarantined ones, its publisher's trust."""
        return package_views.packages(self.store, optional_text("package", package))

    def workflow_params(self, package: str, workflow: str) -> list[ParamDefinition]:
        """The parameters `workflow` of the head of `package` declares (name, type,
        default, description), by name: what a start form offers. NotFound for an
        unknown package or Workflow."""
        package, workflow = text("package", package), text("workflow", workflow)
        return list(workflow_params.declared_params(self.store, package, workflow))


def _cursor(after: object) -> dict[str, int]:
    """A follower's place: attempt id -> the last seq read (an int >= 0)."""
    if not isinstance(after, Mapping):
        raise InvalidInput(
            "after", "mapping", f"after maps attempt ids to seqs, got {type(after).__name__}"
        )
    return {text("after[]", key): positive("after[]", seq, 0) for key, seq in after.items()}
