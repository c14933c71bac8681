"""Schedule dispatch: names from [parallelism] pipeline_parallel_schedule → registered builders."""

from __future__ import annotations

import pytest

from titan_morph.integration import schedules


def test_torch_schedules_are_registered_case_insensitively():
    names = schedules.schedule_names()
    assert "1F1B" in names and "GPipe" in names
    schedules.check_schedule_name("gpipe")
    schedules.check_schedule_name("1f1b")


def test_unknown_schedule_lists_allowed_ones():
    with pytest.raises(ValueError, match=r"pipeline_parallel_schedule = 'Zigzag'.*1F1B.*GPipe"):
        schedules.check_schedule_name("Zigzag")


def test_register_schedule_plugs_in_and_refuses_silent_overrides():
    built = []

    def builder(req):
        built.append(req)
        return "schedule-object"

    schedules.register_schedule("TestOnlySchedule", builder)
    try:
        req = schedules.ScheduleRequest("testonlyschedule", stage=None, n_microbatches=8, loss_fn=None, settings=None)
        assert schedules.build_schedule(req) == "schedule-object" and built == [req]
        with pytest.raises(ValueError, match="already registered"):
            schedules.register_schedule("TESTONLYSCHEDULE", builder)
        schedules.register_schedule("TestOnlySchedule", builder, replace=True)
    finally:
        schedules._SCHEDULES.pop("testonlyschedule", None)
