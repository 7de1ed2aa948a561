"""Example Task: "fetch" a small data file into ./data for the archive step."""

import os
import pathlib

data = pathlib.Path("data")
data.mkdir(exist_ok=True)
run_id = os.environ.get("QLFLOW_RUN_ID", "manual")
(data / "fetched.txt").write_text(f"fetched for run {run_id}\n", encoding="utf-8")
print(f"fetched {data / 'fetched.txt'}")
