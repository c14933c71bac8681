"""Making orders: Eq. 1 and Alg. 1/2 (``slackness``), the ONE Alg. 3/4 generator (``event_loop``, with
its checked entry points in ``generate``) and the fixed baselines of §7 (``baselines``). Imports only
``core``."""
