"""Hypothesis profiles and the example budget of a property (docs/DESIGN.md, "Tests
that cannot pass by accident").

Profiles, chosen once by tests/conftest.py (`--hypothesis-profile NAME` overrides):

- `ci` (when CI=true): derandomized, so every run draws the same examples and a
  failure in CI fails again on any machine with CI=true; no example database; the
  `@reproduce_failure` blob printed. Each property runs the examples it states
  (`max_examples=examples(n)`: n), 100 when it states none.
- `dev` (the default): a fresh random draw each run, failures kept in the local
  example database (.hypothesis/) and replayed first on the next run.
- `fuzz` (when QLFLOW_FUZZ_EXAMPLES=N is set): random like `dev`, with every budget
  scaled by N/100: a property stating n examples runs n*N/100 (N=5000: 50 times CI).

Deadline: none in any profile. The budget is the per-test timeout (pytest-timeout,
pyproject.toml), which names the test that ran long; a per-example wall-clock
deadline on a loaded 2-core CI host fails honest examples with a timing flake.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FUZZ_ENV = "QLFLOW_FUZZ_EXAMPLES"
CI_DEFAULT_EXAMPLES = 100  # what a property that states no budget runs in CI


def fuzz_examples() -> int | None:
    """QLFLOW_FUZZ_EXAMPLES as a positive integer, or None when it is not set."""
    raw = os.environ.get(FUZZ_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{FUZZ_ENV} must be a positive integer, not {raw!r}") from None
    if value < 1:
        raise ValueError(f"{FUZZ_ENV} must be a positive integer, not {value}")
    return value


def examples(ci: int) -> int:
    """The examples a property runs: `ci` (its CI budget), scaled by
    QLFLOW_FUZZ_EXAMPLES/100 when that is set (never below 1)."""
    scale = fuzz_examples()
    if scale is None:
        return ci
    return max(1, ci * scale // CI_DEFAULT_EXAMPLES)


def load_profile() -> str:
    """Register the three profiles and load the one the environment asks for."""
    # each on hypothesis's defaults, not on whatever profile is loaded (hypothesis has
    # a "ci" profile of its own that it loads by itself when CI is set)
    base = settings.get_profile("default")
    settings.register_profile(
        "ci",
        base,
        max_examples=CI_DEFAULT_EXAMPLES,
        derandomize=True,
        database=None,
        print_blob=True,
        deadline=None,
        # generation time on a loaded 2-core host says nothing about the code
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", base, print_blob=True, deadline=None)
    settings.register_profile(
        "fuzz", base, max_examples=examples(CI_DEFAULT_EXAMPLES), print_blob=True, deadline=None
    )
    if fuzz_examples() is not None:
        name = "fuzz"
    elif os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        name = "ci"
    else:
        name = "dev"
    settings.load_profile(name)
    return name
