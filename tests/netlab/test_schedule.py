"""Schedules and --shape specs are read strictly: a bad row is one error naming its line."""

from __future__ import annotations

import pytest

from titan_morph.netlab.lab import LabError
from titan_morph.netlab.run import parse_shape_spec
from titan_morph.netlab.schedule import Event, parse_schedule


def test_rows_are_read_in_time_order_with_break_and_heal():
    text = "time_s,from,to,nic,rate_mbit\n# comment\n10,0,1,data,0\n2.5,n0,n1,data,100\n\n5,1,3,host,break\n"
    assert parse_schedule(text) == [
        Event(2.5, 0, 1, "data", 100.0),
        Event(5.0, 1, 3, "host", action="break"),
        Event(10.0, 0, 1, "data", 0.0),
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [("1,0,1,eth0,100", "nic"), ("1,0,1,data", "5 fields"), ("-1,0,1,data,5", "time_s"), ("1,a,1,data,5", "node")],
)
def test_a_bad_row_names_its_line(row: str, message: str):
    with pytest.raises(LabError, match=f"plan.csv:2: .*{message}"):
        parse_schedule(f"time_s,from,to,nic,rate_mbit\n{row}\n", "plan.csv")


def test_shape_specs():
    assert parse_shape_spec("0-1:data:100") == Event(0.0, 0, 1, "data", 100.0)
    with pytest.raises(LabError, match="A-B:NIC:RATE"):
        parse_shape_spec("0-1:wifi:100")
