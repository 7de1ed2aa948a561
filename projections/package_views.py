"""Packages as people ask about them: each installation with its generations (newest
first), which one is the current head, which are withdrawn or quarantined, and
whether its publisher is trusted — from the publication read models."""

from __future__ import annotations

from dataclasses import dataclass, field

from domain.values import Publication
from eventstore.api import Reads
from projections import publications

ACTIVE_PUBLISHER = "active"


@dataclass(frozen=True, slots=True)
class PackageView:
    """One package installation: its generations (newest first) and its publisher."""

    project: str
    installation: str
    package: str
    publisher: str
    publisher_status: str  # active | revoked
    generations: tuple[Publication, ...] = field(default_factory=tuple)

    @property
    def head(self) -> Publication | None:
        """The current head (the generation new Runs start from), if any."""
        return next((p for p in self.generations if p.head), None)


def packages(reads: Reads, package: str | None = None) -> list[PackageView]:
    """Every installation (of one package name, if given), by project and installation."""
    grouped: dict[tuple[str, str], list[Publication]] = {}
    for publication in publications.publications(reads, package):
        grouped.setdefault((publication.project, publication.installation), []).append(publication)
    found = []
    trust: dict[str, str] = {}
    for (project, installation), generations in sorted(grouped.items()):
        newest = max(generations, key=lambda p: p.generation)
        if newest.publisher not in trust:
            status = publications.publisher_status(reads, newest.publisher)
            trust[newest.publisher] = status or ACTIVE_PUBLISHER
        found.append(
            PackageView(
                project=project,
                installation=installation,
                package=newest.package,
                publisher=newest.publisher,
                publisher_status=trust[newest.publisher],
                generations=tuple(sorted(generations, key=lambda p: -p.generation)),
            )
        )
    return found
