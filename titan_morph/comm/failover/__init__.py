"""``transport = "auto"``: the default path on per-link groups, delegated on demand or on failure.

* :mod:`.transport`: :class:`FailoverTransport`;
* :mod:`.router`: which path carries a link and direction now;
* :mod:`.resend`: a step's traffic of a failed link replayed on the new path, in order;
* :mod:`.stall`: a path that stalls without failing, recognised through the store;
* :mod:`.probe`: a failed link's group re-made in the background, and the way back.
"""
