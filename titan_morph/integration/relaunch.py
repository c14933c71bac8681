"""The protocol between the ranks and ``./run_train.sh``'s supervisor for a relaunch with a new
rank order (the DP x PP orchestrator's moves; :func:`titan_morph.integration.supervisor.supervise` runs it).

The supervisor sets ``$TITAN_MORPH_RELAUNCH_FILE`` for the ranks. After a move the ranks
checkpoint, rank 0 writes the new host of every rank into that file (:func:`request_relaunch`) and
all exit cleanly; the supervisor takes the request (:func:`take_request`) and starts the job again
with ``$TITAN_MORPH_HOSTS`` (the host of each rank, read by :func:`hosts_from_env`),
``$TITAN_MORPH_TOPOLOGY_CHANGES`` (moves so far) and ``$TITAN_MORPH_SLOW_PAIRS`` (the host pairs
measured slow and their planned delays, :func:`known_slow_pairs`: the pipeline scheduler of the
relaunched run plans for the ones that now carry pipeline traffic).

A re-partition (``[morph] partition = "auto"``) uses the same protocol with the hosts unchanged: its
request also names environment variables for the next launch (``env``): ``$TITAN_MORPH_SPLIT``,
the transformer layers of every stage (:func:`split_from_env`), and ``$TITAN_MORPH_PARTITION``, what
the partition's monitor carries (per-layer costs, rank speeds, the relaunch cost). The supervisor
sets ``$TITAN_MORPH_LAUNCH_TIME`` (wall-clock seconds) when it starts each launch, from which the
ranks measure their start-up. Pure Python: the launcher imports it before any rank starts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "HOSTS_ENV",
    "LAUNCH_ENV",
    "MOVES_ENV",
    "PARTITION_ENV",
    "RELAUNCH_ENV",
    "SLOW_ENV",
    "SPLIT_ENV",
    "can_relaunch",
    "known_slow_pairs",
    "hosts_from_env",
    "launch_time",
    "relaunch_available",
    "request_relaunch",
    "split_from_env",
    "take_request",
]

HOSTS_ENV = "TITAN_MORPH_HOSTS"
"""The host of every rank of this launch, ``"0,3,2,1"`` (unset: rank r runs on host r)."""
MOVES_ENV = "TITAN_MORPH_TOPOLOGY_CHANGES"
"""Topology moves made before this launch."""
RELAUNCH_ENV = "TITAN_MORPH_RELAUNCH_FILE"
"""Where rank 0 asks the supervisor for a relaunch."""
SLOW_ENV = "TITAN_MORPH_SLOW_PAIRS"
"""Host pairs measured slow before this launch with their planned delays: ``"0-1:35,2-5:10"``."""
SPLIT_ENV = "TITAN_MORPH_SPLIT"
"""Transformer layers per pipeline stage of this launch, ``"5,5,4,2"`` (unset: the configured split)."""
PARTITION_ENV = "TITAN_MORPH_PARTITION"
"""What a re-partition carries into the next launch (JSON, :class:`~titan_morph.monitor.repartition.PartitionState`)."""
LAUNCH_ENV = "TITAN_MORPH_LAUNCH_TIME"
"""When the supervisor started this launch (``time.time()`` seconds)."""
CARRIED = (SPLIT_ENV, PARTITION_ENV)
"""The variables a request may set for the next launch."""


def split_from_env() -> tuple[int, ...] | None:
    """``$TITAN_MORPH_SPLIT`` as layers per stage (None when unset); a value that is not a list of
    integers >= 0 is a ``ValueError`` naming the variable."""
    raw = os.environ.get(SPLIT_ENV, "").strip()
    if not raw:
        return None
    try:
        split = tuple(int(n) for n in raw.split(","))
    except ValueError:
        raise ValueError(f"{SPLIT_ENV}: {raw!r} is not a comma-separated list of layer counts") from None
    if any(n < 0 for n in split):
        raise ValueError(f"{SPLIT_ENV}: {raw!r} has a negative layer count")
    return split


def launch_time() -> float | None:
    """``$TITAN_MORPH_LAUNCH_TIME`` (None when unset: no supervisor)."""
    raw = os.environ.get(LAUNCH_ENV, "")
    return float(raw) if raw else None


def hosts_from_env(world: int) -> tuple[int, ...] | None:
    """``$TITAN_MORPH_HOSTS`` as the host of each of ``world`` ranks (None when unset); a list that
    is not a permutation of 0..world-1 is a ``ValueError`` naming the variable."""
    raw = os.environ.get(HOSTS_ENV, "").strip()
    if not raw:
        return None
    try:
        hosts = tuple(int(h) for h in raw.split(","))
    except ValueError:
        raise ValueError(f"{HOSTS_ENV}: {raw!r} is not a comma-separated list of hosts") from None
    if sorted(hosts) != list(range(world)):
        raise ValueError(f"{HOSTS_ENV}: {raw!r} must name hosts 0..{world - 1} once each ({world} ranks)")
    return hosts


def moves_before() -> int:
    """Topology moves made before this launch (``$TITAN_MORPH_TOPOLOGY_CHANGES``, 0 when unset)."""
    return int(os.environ.get(MOVES_ENV, "0") or 0)


def known_slow_pairs() -> dict[tuple[int, int], float]:
    """``$TITAN_MORPH_SLOW_PAIRS`` as {(a, b): ms} with a < b (empty when unset)."""
    out = {}
    for item in os.environ.get(SLOW_ENV, "").split(","):
        if item.strip():
            pair, _, ms = item.partition(":")
            a, b = (int(h) for h in pair.split("-"))
            out[(min(a, b), max(a, b))] = float(ms)
    return out


def slow_pairs_spec(pairs: Mapping[tuple[int, int], float]) -> str:
    """The value of ``$TITAN_MORPH_SLOW_PAIRS`` for ``pairs``."""
    normal = {(min(a, b), max(a, b)): ms for (a, b), ms in pairs.items()}
    return ",".join(f"{a}-{b}:{ms:g}" for (a, b), ms in sorted(normal.items()))


def relaunch_available() -> bool:
    """Whether a supervisor will restart the ranks on request."""
    return bool(os.environ.get(RELAUNCH_ENV))


def can_relaunch(move: str, step: int, last: int, what: str, logger: logging.Logger) -> bool:
    """Whether a ``move`` (its description) decided after ``step`` is applied by a relaunch with
    ``what`` (e.g. "the new split"): not after the run's ``last`` step, and only with a launcher to
    restart the ranks. Logs either way."""
    if step >= last:
        logger.warning("titan_morph: %s; not applied: it was the last step", move)
        return False
    if not relaunch_available():
        logger.warning("titan_morph: %s; not applied: no launcher to restart the ranks", move)
        return False
    logger.warning("titan_morph: %s; checkpointing step %d, restarting with %s", move, step, what)
    return True


def request_relaunch(
    hosts: Sequence[int],
    step: int,
    moves: int,
    reason: str,
    slow: Mapping[tuple[int, int], float] | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Ask the supervisor to restart the job with ``hosts[r]`` running rank ``r`` once it exits
    (call on one rank, after the checkpoint of ``step``); ``moves``: moves made so far; ``slow``:
    every host pair known slow, with its planned delay; ``env``: variables of :data:`CARRIED` for
    the next launch."""
    unknown = sorted(set(env or {}) - set(CARRIED))
    if unknown:
        raise ValueError(f"request_relaunch: {unknown} are not variables a relaunch carries ({', '.join(CARRIED)})")
    path = Path(os.environ[RELAUNCH_ENV])
    tmp = path.with_suffix(".tmp")
    request: dict[str, Any] = {"hosts": list(hosts), "step": step, "moves": moves, "reason": reason}
    request["slow"] = slow_pairs_spec(slow or {})
    request["env"] = dict(env or {})
    tmp.write_text(json.dumps(request))
    tmp.replace(path)


def take_request(path: Path) -> dict[str, Any] | None:
    """The pending request at ``path`` (removed), or None."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    path.unlink()
    return data
