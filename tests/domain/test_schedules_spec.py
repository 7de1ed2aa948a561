"""A schedule entry of the manifest: validation, identity and the cron in words."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import ManifestError
from domain.ids import SCHEDULE_ID
from domain.schedule_spec import (
    FIRE_ONCE,
    SKIP,
    ScheduleSpec,
    ScheduleSpecError,
    describe_cron,
    schedule_id,
    validate_schedule,
    validate_schedules,
)
from tests.hypothesis_budget import examples

TABLE = "workflows.nightly"


def refused(raw, key="schedules[0]") -> ScheduleSpecError:
    with pytest.raises(ScheduleSpecError) as caught:
        validate_schedule(raw, "qlflow.toml", TABLE, key)
    error = caught.value
    assert isinstance(error, ManifestError)
    assert str(error).startswith(f"qlflow.toml: [{TABLE}] {error.key}: ")
    assert (error.source, error.table) == ("qlflow.toml", TABLE)
    return error


def entry(**fields):
    return {"cron": "0 3 * * *", "timezone": "UTC", **fields}


def test_a_valid_entry_gets_defaults_and_a_normalized_cron():
    spec = validate_schedule({"cron": " 0  3 * *   mon ", "timezone": "Europe/Berlin"})
    assert spec == ScheduleSpec(
        cron="0 3 * * MON", timezone="Europe/Berlin", misfire=SKIP, overlap="skip"
    )
    spec = validate_schedule(entry(misfire="fire_once", params={"b": 1, "a": "x", "c": True}))
    assert spec.misfire == FIRE_ONCE
    assert spec.params == (("a", "x"), ("b", 1), ("c", True))
    assert spec.params_dict() == {"a": "x", "b": 1, "c": True}


@pytest.mark.parametrize("macro", ["@daily", "@hourly", "@reboot", " @weekly", "@every 5m"])
def test_macros_are_refused_naming_the_cron(macro):
    error = refused(entry(cron=macro))
    assert (error.key, error.field) == ("schedules[0].cron", "cron")
    assert "macros" in str(error) and "five fields" in str(error)


@pytest.mark.parametrize(
    ("cron", "count"),
    [("0 0 * * * *", 6), ("0 0 3 * * * 2027", 7), ("0 3 * *", 4), ("*", 1)],
)
def test_anything_but_five_fields_is_refused(cron, count):
    error = refused(entry(cron=cron))
    assert error.field == "cron"
    assert f"has {count} fields" in str(error)


@pytest.mark.parametrize(
    "cron", ["60 * * * *", "* 24 * * *", "* * 32 * *", "* * * 13 *", "0 0 31 2 *", "*/0 * * * *"]
)
def test_a_malformed_cron_is_refused(cron):
    error = refused(entry(cron=cron))
    assert error.field == "cron" and "not a valid cron" in str(error)


@pytest.mark.parametrize("cron", [None, 5, "", "0 3 * * \x00", "1," * 200 + "1 * * * *"])
def test_a_missing_or_mistyped_cron_is_refused(cron):
    raw = entry(cron=cron) if cron is not None else {"timezone": "UTC"}
    assert refused(raw).field == "cron"


@pytest.mark.parametrize("timezone", ["localtime", "Mars/Olympus", "", "utc", "CET ", 1, True])
def test_timezone_must_be_an_iana_name(timezone):
    error = refused(entry(timezone=timezone))
    assert (error.key, error.field) == ("schedules[0].timezone", "timezone")


def test_timezone_is_required_the_host_zone_is_never_assumed():
    error = refused({"cron": "0 3 * * *"})
    assert error.field == "timezone"
    assert "missing" in str(error) and "never assumed" in str(error)


@pytest.mark.parametrize("zone_name", ["UTC", "Etc/UTC", "Europe/Berlin", "America/New_York"])
def test_iana_names_are_accepted(zone_name):
    assert validate_schedule(entry(timezone=zone_name)).timezone == zone_name


@pytest.mark.parametrize("misfire", ["catch_up", "Skip", "", None, True, 1])
def test_misfire_is_skip_or_fire_once(misfire):
    error = refused(entry(misfire=misfire))
    assert error.field == "misfire" and "'skip' or 'fire_once'" in str(error)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"x": 1.5}, "params.x"),
        ({"x": [1]}, "params.x"),
        ({"x": {"y": 1}}, "params.x"),
        ({"x": None}, "params.x"),
        ({"x": 2**53}, "params.x"),
        ({"x": "a\x00b"}, "params.x"),
        ({"1x": 1}, "params.1x"),
        ({"a-b": 1}, "params.a-b"),
        ([1, 2], "params"),
        ("date=1", "params"),
    ],
)
def test_params_are_strings_integers_or_booleans(params, key):
    error = refused(entry(params=params))
    assert (error.key, error.field) == (f"schedules[0].{key}", "params")


def test_unknown_keys_and_non_tables_are_refused():
    error = refused(entry(every="day"))
    assert (error.key, error.field) == ("schedules[0].every", "every")
    assert "unknown key" in str(error)
    error = refused("0 3 * * *")
    assert (error.key, error.field) == ("schedules[0]", None)


def test_a_list_is_validated_in_order_and_refuses_the_same_schedule_twice():
    specs = validate_schedules([entry(), entry(cron="0 4 * * *")], "qlflow.toml", TABLE)
    assert [spec.cron for spec in specs] == ["0 3 * * *", "0 4 * * *"]
    with pytest.raises(ScheduleSpecError) as caught:
        validate_schedules([entry(), entry(cron="0  3 * * *", misfire="fire_once")], table=TABLE)
    assert caught.value.key == "schedules[1]"
    assert "same schedule as schedules[0]" in str(caught.value)
    with pytest.raises(ScheduleSpecError) as caught:
        validate_schedules([entry(), entry(timezone="Nowhere")], table=TABLE)
    assert caught.value.key == "schedules[1].timezone"
    with pytest.raises(ScheduleSpecError) as caught:
        validate_schedules({"cron": "0 3 * * *"}, table=TABLE)
    assert caught.value.key == "schedules"


def test_without_a_table_the_message_names_file_and_key():
    with pytest.raises(ScheduleSpecError) as caught:
        validate_schedule({"cron": "@daily", "timezone": "UTC"}, "<manifest dict>")
    assert str(caught.value).startswith("<manifest dict>: schedule.cron: ")


@settings(max_examples=examples(300), deadline=None)
@given(
    cron=st.text(alphabet="0123456789*/,-LW#?@ MONSUNJAFEB\t", max_size=40)
    | st.lists(
        st.text(alphabet="0123456789*/,-LW#", min_size=1, max_size=6), min_size=5, max_size=5
    ).map(" ".join)
)
def test_any_text_validates_or_is_refused_with_the_typed_error(cron):
    try:
        spec = validate_schedule({"cron": cron, "timezone": "UTC"})
    except ScheduleSpecError as error:
        assert error.field == "cron"
    else:
        assert len(spec.cron.split()) == 5


# --- identity ---------------------------------------------------------------------------


BASE = ("acme", "reports", "nightly", ScheduleSpec("0 3 * * *", "UTC", SKIP, (("day", "mon"),)))


def test_schedule_id_is_36_characters_and_deterministic():
    first = schedule_id(*BASE)
    assert first.startswith(SCHEDULE_ID) and len(first) == 36
    assert schedule_id(*BASE) == first
    raw = {"cron": "0   3 * * *", "timezone": "UTC", "params": {"day": "mon"}}
    assert schedule_id(*BASE[:3], validate_schedule(raw)) == first


@pytest.mark.parametrize(
    "changed",
    [
        ("other", *BASE[1:]),
        (BASE[0], "other", *BASE[2:]),
        (*BASE[:2], "other", BASE[3]),
        (*BASE[:3], ScheduleSpec("0 4 * * *", "UTC", SKIP, (("day", "mon"),))),
        (*BASE[:3], ScheduleSpec("0 3 * * *", "Europe/Berlin", SKIP, (("day", "mon"),))),
        (*BASE[:3], ScheduleSpec("0 3 * * *", "UTC", SKIP, (("day", "tue"),))),
        (*BASE[:3], ScheduleSpec("0 3 * * *", "UTC", SKIP, ())),
    ],
)
def test_each_identifying_input_changes_the_id(changed):
    assert schedule_id(*changed) != schedule_id(*BASE)


def test_the_misfire_policy_is_not_part_of_the_id():
    spec = ScheduleSpec("0 3 * * *", "UTC", FIRE_ONCE, (("day", "mon"),))
    assert schedule_id(*BASE[:3], spec) == schedule_id(*BASE)


def test_param_types_are_part_of_the_id():
    one = ScheduleSpec("0 3 * * *", "UTC", SKIP, (("n", 1),))
    text = ScheduleSpec("0 3 * * *", "UTC", SKIP, (("n", "1"),))
    true = ScheduleSpec("0 3 * * *", "UTC", SKIP, (("n", True),))
    ids = {schedule_id(*BASE[:3], spec) for spec in (one, text, true)}
    assert len(ids) == 3


# --- in words -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("0 3 * * *", "At 03:00 every day"),
        ("* * * * *", "Every minute"),
        ("*/15 * * * *", "Every 15th minute of every hour"),
        ("0 * * * *", "At the start of every hour"),
        ("0 9 * * 1-5", "At 09:00 on Monday through Friday"),
    ],
)
def test_describe_cron_says_simple_expressions_in_words(cron, words):
    assert describe_cron(cron) == words


def test_describe_cron_falls_back_to_the_expression():
    busy = "1,2,3,4,5,6,7,8,9 1,2,3,4,5 1,2,3 1,2 1,2"
    assert describe_cron(busy) == busy
    assert describe_cron("not a cron") == "not a cron"


# --- overlap ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", ["allow", "skip", "queue"])
def test_overlap_is_allow_skip_or_queue_and_not_part_of_the_id(overlap):
    spec = validate_schedule(entry(overlap=overlap, params={"day": "mon"}))
    assert spec.overlap == overlap
    assert schedule_id(*BASE[:3], spec) == schedule_id(*BASE)


@pytest.mark.parametrize("overlap", ["wait", "Skip", "", None, True, 1, ["skip"]])
def test_an_unknown_overlap_is_refused_naming_the_field(overlap):
    error = refused(entry(overlap=overlap))
    assert (error.key, error.field) == ("schedules[0].overlap", "overlap")
    assert "'allow', 'skip', 'queue'" in str(error)


def test_a_manifest_defaults_to_skip_and_a_stored_revision_to_allow():
    assert validate_schedule(entry()).overlap == "skip"
    stored = validate_schedules([entry()], "revision", None, default_overlap="allow")
    assert stored[0].overlap == "allow"


def test_a_revision_states_overlap_unless_allow_so_older_revisions_keep_their_digests():
    import dataclasses

    from domain.errors import PlanError
    from domain.revision import revision_from_json, revision_to_json
    from tests.domain.test_plan_package import revision

    made = revision()
    (flow,) = made.workflows.values()
    digests = {}
    for overlap in ("allow", "skip", "queue"):
        spec = ScheduleSpec("0 3 * * *", "UTC", overlap=overlap)
        with_schedule = revision(workflows=[dataclasses.replace(flow, schedules=(spec,))])
        document = revision_to_json(with_schedule)
        (stated,) = document["workflows"][flow.key]["schedules"]
        assert ("overlap" in stated) is (overlap != "allow")
        assert revision_from_json(document).workflows[flow.key].schedules == (spec,)
        digests[overlap] = with_schedule.revision_digest
    assert len(set(digests.values())) == 3
    # a revision published before overlap existed has none: it reads as allow
    old = revision_to_json(revision(workflows=[dataclasses.replace(flow, schedules=(
        ScheduleSpec("0 3 * * *", "UTC"),
    ))]))  # fmt: skip
    assert revision_from_json(old).revision_digest == digests["allow"]
    (stated,) = old["workflows"][flow.key]["schedules"]
    stated["overlap"] = "allow"  # the default stated is not the canonical form
    with pytest.raises(PlanError):
        revision_from_json(old)
