"""The command lines: ``plan`` (``python -m titan_morph.pipelining.plan``) and ``partition`` (``python
-m titan_morph.pipelining.partition``), with the arguments (``args``) and the report (``report``)
they share. The top of the planner: no room imports it."""
