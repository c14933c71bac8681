"""References to judge the planner by: the exact CP-SAT optimum for small instances (``exact``) and the
random instances of the tests and benchmarks (``instances``). Imports the rooms below ``search``."""
