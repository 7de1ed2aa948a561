"""Count the day's items and hand the count on: the JSON object written to
$QLFLOW_OUTPUT becomes this step's output."""

import json
import os

date = os.environ["QLFLOW_PARAM_DATE"]
items = int(date[-2:]) * 3  # a stand-in for real work on that day's data
print(f"counted {items} items for {date}")
with open(os.environ["QLFLOW_OUTPUT"], "w") as out:
    json.dump({"date": date, "items": items}, out)
