"""Flow control declarations: concurrency limits and priorities (docs/DESIGN.md,
"Flow control").

A limit caps how many holders its slots have at once, store-wide:

- a Task's `concurrency = 2` (or `{ limit = 2, key = "{params.region}" }`): its
  Attempts leased at once;
- a Workflow's `max_running = 1` (or `concurrency = { limit = 1, key = "..." }`):
  its Runs past their queue at once.

A limit is named `task:<package>/<task>` or `workflow:<package>/<workflow>`; a keyed
limit has one set of slots per distinct key value, named `<limit>[<value>]` (a
*slot*). The key is a template over the Workflow's parameters, rendered when a Run
is bound to its plan. A Run's plan binds its priority and the slot of every limit
that applies to it (`PlanFlow`), so the decisions read them from the aggregate.

Pure: nothing here reads the store. The rules that give slots out are
`domain.slots`'.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from domain.errors import InvalidInput, PlanError

MIN_LIMIT: Final = 1
MAX_LIMIT: Final = 10_000
MIN_PRIORITY: Final = -1_000
MAX_PRIORITY: Final = 1_000
DEFAULT_PRIORITY: Final = 0
MAX_KEY_CHARS: Final = 200  # a rendered key value
MAX_TEMPLATE_CHARS: Final = 200

TASK_LIMIT: Final = "task"
WORKFLOW_LIMIT: Final = "workflow"
LIMIT_KINDS = (TASK_LIMIT, WORKFLOW_LIMIT)

PLACEHOLDER_PATTERN: Final = r"\{params\.([A-Za-z0-9][A-Za-z0-9_-]{0,63})\}"
_PLACEHOLDER = re.compile(PLACEHOLDER_PATTERN)
_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
_TARGET = re.compile(rf"({'|'.join(LIMIT_KINDS)}):({_NAME})/({_NAME})(?:\[(.+)\])?", re.S)
CONCURRENCY_KEYS = ("limit", "key")


class FlowError(ValueError):
    """A flow declaration is wrong: `field` names it (relative to its table), `reason`
    says why. The manifest and the API each say it in their own error type."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True, slots=True)
class Concurrency:
    """A declared limit: at most `limit` holders per slot; `key` (a template such as
    "{params.region}") gives one slot per rendered value, None one slot in all."""

    limit: int
    key: str | None = None

    def document(self) -> int | dict[str, Any]:
        """As a manifest or revision states it: the count alone when unkeyed."""
        return self.limit if self.key is None else {"limit": self.limit, "key": self.key}


def limit_problem(value: object) -> str | None:
    """Why `value` is no limit (None: it is one)."""
    if type(value) is not int:
        return f"must be an integer from {MIN_LIMIT} to {MAX_LIMIT}, not {_describe(value)}"
    if not MIN_LIMIT <= value <= MAX_LIMIT:
        return f"must be from {MIN_LIMIT} to {MAX_LIMIT}, not {value}"
    return None


def priority_problem(value: object) -> str | None:
    """Why `value` is no priority (None: it is one)."""
    if type(value) is not int:
        return f"must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, not {_describe(value)}"
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        return f"must be from {MIN_PRIORITY} to {MAX_PRIORITY}, not {value}"
    return None


def check_priority(value: object, field: str = "priority") -> int:
    """`value` if it is a priority, else InvalidInput naming `field`."""
    problem = priority_problem(value)
    if problem is not None:
        raise InvalidInput(field, "priority", f"{field} {problem}")
    assert isinstance(value, int)
    return value


def parse_concurrency(raw: object, field: str = "concurrency") -> Concurrency:
    """A `concurrency` value: a count, or a table `{limit, key}` (FlowError naming
    the field: `concurrency`, `concurrency.limit`, `concurrency.key`)."""
    if not isinstance(raw, Mapping):
        problem = limit_problem(raw)
        if problem is not None:
            if field == "concurrency":
                problem += ' (or a table { limit = N, key = "{params.x}" })'
            raise FlowError(field, problem)
        assert isinstance(raw, int)
        return Concurrency(raw)
    for name in raw:
        if name not in CONCURRENCY_KEYS:
            raise FlowError(
                f"{field}.{name}", f"unknown key (allowed: {', '.join(CONCURRENCY_KEYS)})"
            )
    if "limit" not in raw:
        raise FlowError(f"{field}.limit", "missing")
    problem = limit_problem(raw["limit"])
    if problem is not None:
        raise FlowError(f"{field}.limit", problem)
    key = raw.get("key")
    if key is not None:
        problem = template_problem(key)
        if problem is not None:
            raise FlowError(f"{field}.key", problem)
    return Concurrency(raw["limit"], key)


def template_problem(template: object) -> str | None:
    """Why `template` is no key template (None: it is one): text with at least one
    `{params.<name>}`, and no other braces."""
    if not isinstance(template, str):
        return f'must be a string such as "{{params.region}}", not {_describe(template)}'
    if not template or len(template) > MAX_TEMPLATE_CHARS:
        return f"must be 1 to {MAX_TEMPLATE_CHARS} characters"
    if not _PLACEHOLDER.search(template):
        return f'{template!r} names no parameter: use "{{params.<name>}}"'
    if "{" in _PLACEHOLDER.sub("", template) or "}" in _PLACEHOLDER.sub("", template):
        return f"{template!r}: a brace outside a {{params.<name>}} placeholder"
    return None


def template_params(template: str) -> tuple[str, ...]:
    """The parameter names a key template uses, in order of first use."""
    return tuple(dict.fromkeys(_PLACEHOLDER.findall(template)))


def render_key(template: str, params: Mapping[str, object]) -> str:
    """The key value of `template` for a Run's bound parameters (a boolean renders as
    true/false). InvalidInput when a value is missing or the value is too long."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in params:
            raise InvalidInput(
                f"params.{name}", "declared", f"the limit key {template!r} needs parameter {name!r}"
            )
        found = params[name]
        return ("true" if found else "false") if isinstance(found, bool) else str(found)

    key = _PLACEHOLDER.sub(value, template)
    if len(key) > MAX_KEY_CHARS:
        raise InvalidInput(
            "params",
            "key_length",
            f"the limit key {template!r} renders to {len(key)} characters; at most {MAX_KEY_CHARS}",
        )
    return key


def limit_name(kind: str, package: str, name: str) -> str:
    """`task:<package>/<task>` or `workflow:<package>/<workflow>`."""
    return f"{kind}:{package}/{name}"


def limit_of(slot: str) -> str:
    """The limit a slot belongs to (a limit name holds no "[")."""
    return slot.partition("[")[0]


def slot_name(limit: str, key: str | None) -> str:
    """The slot a holder takes: the limit, or `<limit>[<key value>]`."""
    return limit if key is None else f"{limit}[{key}]"


@dataclass(frozen=True, slots=True)
class Target:
    """What `limits set` names: a limit, or one key value of a keyed limit."""

    kind: str
    package: str
    name: str
    key: str | None = None

    @property
    def limit(self) -> str:
        return limit_name(self.kind, self.package, self.name)

    @property
    def slot(self) -> str:
        return slot_name(self.limit, self.key)


def parse_target(text: object) -> Target:
    """A `limits set` target: `task:<package>/<task>`, `workflow:<package>/<workflow>`,
    either with `[<key value>]` (InvalidInput naming `target` otherwise)."""
    if not isinstance(text, str):
        raise InvalidInput("target", "limit_target", f"a limit target is a string, not {text!r}")
    found = _TARGET.fullmatch(text)
    if found is None:
        raise InvalidInput(
            "target",
            "limit_target",
            f"{text!r} is no limit: say task:<package>/<task>, workflow:<package>/<workflow>,"
            " or one key of a keyed limit, e.g. task:etl/fetch[eu]",
        )
    kind, package, name, key = found.groups()
    if key is not None and len(key) > MAX_KEY_CHARS:
        raise InvalidInput("target", "key_length", f"a key value has at most {MAX_KEY_CHARS} chars")
    return Target(kind, package, name, key)


def check_limit(value: object, field: str = "limit") -> int:
    """`value` if it is a limit, else InvalidInput naming `field`."""
    problem = limit_problem(value)
    if problem is not None:
        raise InvalidInput(field, "limit", f"{field} {problem}")
    assert isinstance(value, int)
    return value


# --- what a plan binds ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotRef:
    """The slot of one limit a Run (or a step's Attempts) takes, as its plan binds it:
    the limit, its key value (None: unkeyed) and the count it declared."""

    limit: str
    key: str | None
    declared: int

    @property
    def slot(self) -> str:
        return slot_name(self.limit, self.key)

    def document(self) -> dict[str, Any]:
        document: dict[str, Any] = {"limit": self.limit, "slots": self.declared}
        if self.key is not None:
            document["key"] = self.key
        return document


@dataclass(frozen=True, slots=True)
class PlanFlow:
    """What a plan binds of flow control: the Run's priority, the slot the Run takes
    (a Workflow limit) and the slot each step's Attempts take (Task limits), sorted by
    step key. In the plan only when any differs from the default (`document`)."""

    priority: int = DEFAULT_PRIORITY
    run_slot: SlotRef | None = None
    step_slots: tuple[tuple[str, SlotRef], ...] = ()

    @property
    def is_default(self) -> bool:
        return self == NO_FLOW

    def step_slot(self, step_key: str) -> SlotRef | None:
        """The slot the step's Attempts take (None: no limit)."""
        for key, ref in self.step_slots:
            if key == step_key:
                return ref
        return None

    def document(self) -> dict[str, Any]:
        """The plan's `flow` member (only its non-default parts)."""
        document: dict[str, Any] = {}
        if self.priority != DEFAULT_PRIORITY:
            document["priority"] = self.priority
        if self.run_slot is not None:
            document["run_slot"] = self.run_slot.document()
        if self.step_slots:
            document["step_slots"] = {key: ref.document() for key, ref in self.step_slots}
        return document


NO_FLOW = PlanFlow()


def plan_flow(raw: object, step_keys: tuple[str, ...]) -> PlanFlow:
    """Strictly read a plan's `flow` member (PlanError naming what is wrong); an empty
    one is not canonical (the member is absent then)."""
    if not isinstance(raw, Mapping):
        raise PlanError("flow", f"plan flow must be an object, not {_describe(raw)}")
    unknown = sorted(set(raw) - {"priority", "run_slot", "step_slots"})
    if unknown:
        raise PlanError("unknown_field", f"plan flow: {', '.join(map(str, unknown))}")
    if not raw:
        raise PlanError("not_canonical", "plan states an empty flow")
    priority = raw.get("priority", DEFAULT_PRIORITY)
    if "priority" in raw and (priority_problem(priority) or priority == DEFAULT_PRIORITY):
        raise PlanError("flow", f"plan flow priority {priority!r} is not a stated priority")
    run_slot = _slot_ref(raw["run_slot"], "run_slot") if "run_slot" in raw else None
    steps: list[tuple[str, SlotRef]] = []
    if "step_slots" in raw:
        found = raw["step_slots"]
        if not isinstance(found, Mapping) or not found:
            raise PlanError("flow", "plan flow step_slots must be a non-empty object")
        for key in sorted(found):
            if key not in step_keys:
                raise PlanError("flow", f"plan flow names step {key!r}, which the plan lacks")
            steps.append((key, _slot_ref(found[key], f"step_slots.{key}")))
    return PlanFlow(priority, run_slot, tuple(steps))


def _slot_ref(raw: object, what: str) -> SlotRef:
    if not isinstance(raw, Mapping):
        raise PlanError("flow", f"plan flow {what} must be an object")
    if set(raw) - {"limit", "key", "slots"} or not {"limit", "slots"} <= set(raw):
        raise PlanError("flow", f"plan flow {what} has the fields limit, slots and maybe key")
    limit, key, slots = raw["limit"], raw.get("key"), raw["slots"]
    target = _TARGET.fullmatch(limit) if isinstance(limit, str) else None
    if target is None or target.group(4) is not None:
        raise PlanError("flow", f"plan flow {what} limit {limit!r} is no limit name")
    if key is not None and (not isinstance(key, str) or len(key) > MAX_KEY_CHARS):
        raise PlanError("flow", f"plan flow {what} key {key!r} is no key value")
    if limit_problem(slots) is not None:
        raise PlanError("flow", f"plan flow {what} slots {slots!r} is no limit")
    return SlotRef(limit, key, slots)


def bind_flow(
    package: str,
    workflow_key: str,
    run_limit: Concurrency | None,
    step_limits: Mapping[str, tuple[str, Concurrency]],
    params: Mapping[str, object],
    priority: int,
) -> PlanFlow:
    """The PlanFlow of one Run: `run_limit` is the Workflow's, `step_limits` maps a
    step key to (its Task, the Task's limit) for the steps whose Task has one."""
    check_priority(priority)
    run_slot = None
    if run_limit is not None:
        run_slot = _bound(WORKFLOW_LIMIT, package, workflow_key, run_limit, params)
    steps = tuple(
        (key, _bound(TASK_LIMIT, package, task, limit, params))
        for key, (task, limit) in sorted(step_limits.items())
    )
    return PlanFlow(priority, run_slot, steps)


def _bound(
    kind: str, package: str, name: str, limit: Concurrency, params: Mapping[str, object]
) -> SlotRef:
    key = None if limit.key is None else render_key(limit.key, params)
    return SlotRef(limit_name(kind, package, name), key, limit.limit)


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string {value!r}"
    if isinstance(value, float):
        return f"a float ({value})"
    return f"{type(value).__name__} {value!r}"


# --- limits changed at runtime ------------------------------------------------------------


def target_digest(target: str) -> str:
    """The entity id of a target's `limit-` stream: 32 hex digits of its SHA-256."""
    return hashlib.sha256(target.encode("utf-8")).hexdigest()[:32]


def declared_for(target: Target, declared: Mapping[str, Concurrency]) -> Concurrency:
    """The declared limit a `limits set` target changes: the limit must be declared
    (by the newest publication of its package), and a key value names a keyed
    limit's slot.
    InvalidInput naming `target` otherwise."""
    found = declared.get(target.limit)
    if found is None:
        what = "Task" if target.kind == TASK_LIMIT else "Workflow"
        raise InvalidInput(
            "target",
            "declared",
            f"{what} {target.package}/{target.name} declares no limit in the newest "
            "publication of its package: declare one in qlflow.toml (`limits set` changes "
            "a declared limit)",
        )
    if target.key is not None and found.key is None:
        raise InvalidInput(
            "target",
            "keyed",
            f"{target.limit} has no key: set {target.limit} itself, not one key of it",
        )
    return found


def effective_limit(slot: str, declared: int, overrides: Mapping[str, int]) -> int:
    """A slot's limit now: the one set for the slot, else for its limit, else the
    declared one. The one rule every reader of limits asks."""
    found = overrides.get(slot)
    if found is None:
        found = overrides.get(limit_of(slot))
    return declared if found is None else found
