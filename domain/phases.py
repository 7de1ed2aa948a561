"""The cycle's phases, in the order a cycle runs them (docs/DESIGN.md, "The cycle")."""

from __future__ import annotations

RECOVERY = "recovery"
CANCELLATION = "cancellation"
FRONTIER = "frontier"
ADMISSION = "admission"

PHASES = (RECOVERY, CANCELLATION, FRONTIER, ADMISSION)
