"""The cycle's phases, in the order a cycle runs them (docs/DESIGN.md, "The cycle")."""

from __future__ import annotations

RECOVERY = "recovery"
CANCELLATION = "cancellation"
SCHEDULE = "schedule"  # due schedules admit their Runs (docs/DESIGN.md, "Schedules")
FRONTIER = "frontier"
ADMISSION = "admission"

PHASES = (RECOVERY, CANCELLATION, SCHEDULE, FRONTIER, ADMISSION)
RUN_PHASES = (RECOVERY, CANCELLATION, FRONTIER, ADMISSION)
"""The phases whose work is on a Run (the schedule phase's is on a schedule): the
candidate index keeps a window of instants for each."""
