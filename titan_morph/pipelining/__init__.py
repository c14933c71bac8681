"""Slackness-aware pipeline scheduling: the planner, pure Python (imports neither torch nor any
other titan_morph package).

Data flows one way: ``model`` (costs) → ``slackness`` (Eq. 1, Alg. 1/2) → ``generate``
(Alg. 3/4) → ``simulate`` (fixed orders under delays) → ``search`` → ``export`` (CSV, Chrome
trace, PNG); ``links`` is the link model the simulator and the transports' emulator share.
The runtime (``titan_morph.runtime``) turns plans into torch actions.
"""
