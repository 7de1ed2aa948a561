"""The cycle's phases, in the order a cycle runs them (docs/DESIGN.md, "The cycle")."""

from __future__ import annotations

from typing import Final

RECOVERY: Final = "recovery"
CANCELLATION: Final = "cancellation"
SCHEDULE: Final = "schedule"  # due schedules admit their Runs (docs/DESIGN.md, "Schedules")
QUEUE: Final = "queue"  # queued Runs take their Workflow's free slots ("Flow control")
FRONTIER: Final = "frontier"
CLAIM: Final = "claim"  # ready steps get an Attempt (not a Run's admission, `rt.start`)

PHASES = (RECOVERY, CANCELLATION, SCHEDULE, QUEUE, FRONTIER, CLAIM)
RUN_PHASES = (RECOVERY, CANCELLATION, FRONTIER, CLAIM)
"""The phases whose work is on a Run (the schedule phase's is on a schedule, the queue
phase's on a limit's slot): the candidate index keeps a window of instants for each."""
