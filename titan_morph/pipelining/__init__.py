"""Slackness-aware pipeline scheduling (pure Python core: no torch import here).

Data flows one way: ``model`` (costs) → ``slackness`` (Eq. 1, Alg. 1/2) → ``generate``
(Alg. 3/4) → ``simulate`` (fixed orders under delays) → ``export`` / ``schedule`` (torch runtime).
"""
