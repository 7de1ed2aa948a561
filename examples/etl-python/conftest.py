"""The qlflow_runtime fixture for these tests. A project whose root conftest.py is
its own would write `pytest_plugins = ["qlflow.testing"]` there instead."""

from qlflow.testing import qlflow_runtime  # noqa: F401
