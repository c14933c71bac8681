"""The planner's vocabulary, imported by every other room: the cost model and plans (``model``), the
link model (``links``; time-varying delays in ``stragglers``), compute speeds (``speeds``) and the
trace rows both read (``trace_rows``), the stage tables and the arrival rule (``layout``), and value
parsing (``values``). It imports no other room."""
