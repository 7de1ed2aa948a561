"""The schedule phase's rule over one schedule (`domain.schedule_heads`): the index
value `work_at_ms` says exactly when `decide_turn` has something to write, and a
run of turns admits each occurrence at most once, in order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.occurrences import next_after
from domain.schedule_heads import Declaration, decide_turn, work_at_ms
from domain.schedules import ACTIVE, PAUSED, pause, resume
from tests.domain.schedule_log import HOUR, MINUTE, ScheduleLog, make_spec, ms
from tests.hypothesis_budget import examples

T0 = ms("2024-03-30T00:00:00Z")
CRONS = ["*/7 * * * *", "0 * * * *", "30 2 * * *", "15 1,2,3 * * *", "0 0 * * MON"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]


def declaration(log: ScheduleLog, published_at_ms: int) -> Declaration:
    return Declaration(
        schedule_id=log.schedule_id,
        publication_id="pub:" + "1" * 32,
        project="default",
        installation="reports",
        package="reports",
        publisher="acme",
        workflow="nightly",
        spec=log.spec,
        published_at_ms=published_at_ms,
    )


steps = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=3 * HOUR),  # the gap to the next turn
        st.sampled_from(["turn", "turn", "turn", "pause", "resume", "undeclare", "declare"]),
        st.sampled_from([None, None, None, "withdrawn"]),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=examples(150), deadline=None)
@given(
    cron=st.sampled_from(CRONS),
    zone=st.sampled_from(ZONES),
    misfire=st.sampled_from(["skip", "fire_once"]),
    grace=st.sampled_from([30_000, 5 * MINUTE]),
    script=steps,
)
def test_work_at_ms_is_exactly_when_a_turn_writes(cron, zone, misfire, grace, script):
    log = ScheduleLog(make_spec(cron, zone, misfire))
    published = declaration(log, T0)
    declared, now = True, T0
    for gap, action, refusal in script:
        now += gap
        state = log.state
        if action == "pause" and state is not None and state.status == ACTIVE:
            log.apply(pause(state, now))
            continue
        if action == "resume" and state is not None and state.status == PAUSED:
            log.apply(resume(state, log.spec, now))
            continue
        if action in ("undeclare", "declare"):
            declared = action == "declare"
            if declared:
                published = declaration(log, now)
            continue
        due = work_at_ms(state, declared, published.published_at_ms)
        decision = decide_turn(state, published, declared, now, grace, refusal=refusal)
        assert decision.noop == (due is None or due > now), (due, now, decision)
        before = len(log.admitted)
        log.apply(decision)
        if refusal is not None:
            assert len(log.admitted) == before  # the guard refused: nothing admitted
        after = work_at_ms(log.state, declared, published.published_at_ms)
        if decision.admit is not None or any(e.type == "schedule.skipped" for e in decision.events):
            assert after is not None and after > now  # past now: no backlog
    fired = log.fired_at
    assert fired == sorted(set(fired))  # each occurrence at most once, in order
    for at in fired:
        assert next_after(cron, zone, at - 1) == at  # each one an occurrence of the cron
