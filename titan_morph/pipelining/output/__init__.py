"""Plans out of the planner: CSV, Chrome trace and PNG timelines (``export``), and a timeline drawn in a
child process (``render``, ``python -m titan_morph.pipelining.output.render``)."""
