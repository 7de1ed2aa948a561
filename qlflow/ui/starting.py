"""The start form: a Workflow's declared parameters as fields, and the submitted
fields as the values `Runtime.start` binds (the domain checks them; an InvalidInput
is shown on the form and nothing is started).

Fields are named `param.<name>`. Every value is sent as text, read as the declared
type by the binding; an empty field is left out, so its default applies (or the
binding names it as missing). A boolean is a true/false choice, never an unchecked
box that could not say "false".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.params import ParamDefinition, ParamText
from qlflow.runtime import Runtime
from qlflow.ui.values import param_value

FIELD_PREFIX = "param."


@dataclass(frozen=True, slots=True)
class StartForm:
    """What the start page shows: the Workflow's parameters, the values in the fields
    (the defaults, or what was submitted), and the refusal of the last submit."""

    package: str
    workflow: str
    params: tuple[ParamDefinition, ...]
    values: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    error_field: str | None = None  # the refused parameter's name, if one was

    @property
    def has_params(self) -> bool:
        return bool(self.params)


def form_values(form: Mapping[str, str]) -> dict[str, str]:
    """The submitted parameter fields by name (the prefix taken off)."""
    return {k[len(FIELD_PREFIX) :]: v for k, v in form.items() if k.startswith(FIELD_PREFIX)}


def given_params(values: Mapping[str, str]) -> dict[str, ParamText]:
    """The non-empty fields as values for the binding (read as the declared types)."""
    return {name: ParamText(value) for name, value in values.items() if value != ""}


class Starting:
    """Mixed into `Dashboard`: the start form and the start action."""

    runtime: Runtime
    now_ms: Callable[[], int]  # the Dashboard's clock

    def start_form(
        self, package: str, workflow: str, values: Mapping[str, str] | None = None
    ) -> StartForm:
        """The form for `workflow` of `package`'s head: its parameters, filled with
        `values` or the defaults. NotFound for an unknown package or Workflow."""
        params = self.runtime.workflow_params(package, workflow)
        if values is None:
            values = {p.name: param_value(p.default) for p in params if p.default is not None}
        return StartForm(package, workflow, tuple(params), dict(values))

    def start(self, package: str, workflow: str, values: Mapping[str, str] | None = None) -> Any:
        """Admit a Run of `workflow` from the head of `package` (an installation or
        package name) with the form's parameter values; the runtime's start guard and
        the plan's binding decide whether it may."""
        params = given_params(values or {})
        return self.runtime.start(package, workflow, params=params, now_ms=self.now_ms())
