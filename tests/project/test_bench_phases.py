"""The pack-cost benchmark's placement of rule groups in time (bench/phases.py): the offset it
predicts for a group is where a real Prometheus evaluates it, and a placed copy of a rule file
puts its group at the chosen moment. No timing of the rules here."""

import time

import pytest
import yaml

from bench import phases
from exporter.harness.localstack import Stack, http_get, wait_until

pytestmark = pytest.mark.skipif(not phases.available(), reason="xxhash (the test extra) is not installed")


def test_targets_spread_over_the_interval_in_whole_ticks():
    assert phases.targets(3, 30, 5) == [0, 10, 20]
    assert phases.targets(1, 30, 5) == [0]
    four = phases.targets(4, 30, 5)
    assert len(set(four)) == 4 and all(t % 5 == 0 for t in four)


def test_a_real_prometheus_evaluates_each_group_where_the_hash_says(tmp_path):
    interval = 6.0
    src = tmp_path / "src.yml"
    src.write_text(yaml.safe_dump({"groups": [
        {"name": "first", "interval": "6s", "rules": [{"record": "one", "expr": "vector(1)"}]},
        {"name": "second", "interval": "6s", "rules": [{"record": "two", "expr": "vector(2)"}]}]}))
    placed = phases.placed_copy(src, tmp_path / "placed", "first", 4.0, interval)
    assert placed.read_text() == src.read_text() and placed.is_absolute()
    predicted = {g: phases.group_offset_s(str(placed), g, interval) for g in ("first", "second")}
    assert abs(predicted["first"] - 4.0) <= 0.05
    with Stack(tmp_path) as st:
        st.start_prometheus([], [placed])

        def evaluated_twice():
            groups = http_get(st.prom_url + "/api/v1/rules")["data"]["groups"]
            seen = phases.observed(groups, interval)
            return seen if all(v is not None for v in seen.values()) and time.time() > started + 2 * interval else None

        started = time.time()
        seen = wait_until(evaluated_twice, 30, every=0.5, what="both groups evaluated")
    for g, offset in predicted.items():
        # lastEvaluation is the wall time the evaluation started: the slot, plus the scheduler's delay
        late = (seen[g] - offset) % interval
        assert late < 0.5, (g, offset, seen[g])


def test_the_later_groups_meet_the_fleet_at_the_same_point_of_its_tick_and_nobody_else(tmp_path):
    """The slower groups of a placed copy (every minute, every two) are evaluated at the point of
    the fleet's tick where its alerting group is, and never within a second of another group's
    moment (another instance's alerting group, or one of its own)."""
    src = tmp_path / "src.yml"
    src.write_text(yaml.safe_dump({"groups": [
        {"name": "first", "rules": [{"record": "one", "expr": "vector(1)"}]},
        {"name": "steady", "interval": "1m", "rules": [{"record": "two", "expr": "vector(2)"}]},
        {"name": "slow", "interval": "2m", "rules": [{"record": "three", "expr": "vector(3)"}]}]}))
    taken = [(0.0, 30.0), (20.0, 30.0)]
    later = [("steady", 60.0), ("slow", 120.0)]
    placed = phases.placed_copy(src, tmp_path / "placed", "first", 10.0, 30.0, later=later, tick_s=5.0, taken=taken)
    first = phases.group_offset_s(str(placed), "first", 30.0)
    at = {g: (phases.group_offset_s(str(placed), g, s), s) for g, s in later}
    assert abs(first - 10.0) <= 0.05
    for g, (offset, every) in at.items():
        assert min(offset % 5.0, 5.0 - offset % 5.0) <= 0.5, (g, offset)
        assert not any(phases._collide((offset, every), t, 1.0) for t in taken + [(first, 30.0)]), (g, offset)
    assert not phases._collide(at["steady"], at["slow"], 1.0)
    # the check can fail: a group at another instance's moment collides
    assert phases._collide((40.2, 120.0), (10.0, 30.0), 1.0) and not phases._collide((45.0, 120.0), (10.0, 30.0), 1.0)
