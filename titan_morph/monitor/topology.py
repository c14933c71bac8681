"""The hybrid-parallel orchestrator's decisions (paper §6, Fig. 13): which data-parallel pair of
ranks is slow, and which rank -> (stage, replica) assignment takes it off the DP collectives.

Layout. ``world = stages x replicas`` ranks, one per host; rank ``r`` holds stage ``r // replicas``
and replica ``r % replicas`` (TorchTitan's order, pipeline outermost), so stage ``s``'s DP group is
ranks ``s * replicas ... s * replicas + replicas - 1`` and replica ``d``'s pipeline is ranks ``d,
d + replicas, ...``. A :class:`Layout` says which host runs each rank; moving hosts between ranks
changes which host pairs carry DP collectives and which carry pipeline sends.

Detection (:class:`TopologyMonitor`, pure, fed the same exchanged data on every rank). Every rank
reports the DP collectives it ran in the step (:class:`CollectiveStamp`, from the DP backend
:mod:`titan_morph.comm.emulator.collectives`): per group and collective, ``min(end) - max(start)`` over the
group's ranks is its time on the wire, and that divided by its ring steps is one per-hop sample of
the group's ring. For a group of two ranks the ring is one host pair, so the sample is the pair's;
a larger group's ring pairs are told apart by probes (one message over each ring pair, timed by the
same backend) that the monitor asks for while the group is slow. Pairs then go through the PP
links' consensus rules (:class:`~titan_morph.monitor.detect.Detector`: k consecutive slow steps,
margin, floor, p75 rounded up) with an Eq. 1 tolerance of 0: no slackness absorbs a collective.

Decision (:func:`best_layout`). Among assignments, lexicographically: (1) the least slow-pair delay
left inside DP groups (every ring algorithm of a group may use any of its pairs); (2) with the
``pp`` policy, slow pairs on pipeline links rather than between ranks that exchange nothing
(Falcon's re-assignment, which the paper follows: a pair that carries traffic keeps carrying
some); (3) the shortest simulated step of the slowest
pipeline given the delays its links then carry (the PP links' slackness: a delay on a link with
more slack costs less); (4) the fewest hosts moved. Only the hosts of slow pairs are placed
explicitly; every other host keeps its rank unless displaced. Small worlds are searched
exhaustively, larger ones one slow pair at a time.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from titan_morph.monitor.delays import LinkEstimate
from titan_morph.monitor.detect import Decision, Detector, DetectRule

__all__ = [
    "CollectiveStamp",
    "Layout",
    "Move",
    "TopologyMonitor",
    "best_layout",
    "decode_stamps",
    "encode_stamps",
    "estimate_pairs",
    "segment_width",
]

logger = logging.getLogger(__name__)

Pair = tuple[int, int]
EXHAUSTIVE_LIMIT = 50_000
"""Placements of the slow pairs' hosts searched exhaustively; beyond it, one pair at a time."""


def _pair(a: int, b: int) -> Pair:
    return (a, b) if a <= b else (b, a)


# --------------------------------------------------------------------------------------------
# Layouts


@dataclass(frozen=True)
class Layout:
    """Which host runs each rank of a ``stages x replicas`` DP x PP job (see the module docstring)."""

    stages: int
    replicas: int
    hosts: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.stages < 1 or self.replicas < 1:
            raise ValueError(f"a layout needs stages and replicas >= 1, got {self.stages} x {self.replicas}")
        if sorted(self.hosts) != list(range(self.stages * self.replicas)):
            raise ValueError(
                f"a {self.stages} x {self.replicas} layout places hosts 0..{self.stages * self.replicas - 1} "
                f"once each, got {list(self.hosts)}"
            )

    @classmethod
    def identity(cls, stages: int, replicas: int) -> Layout:
        """Host ``r`` runs rank ``r``."""
        return cls(stages, replicas, tuple(range(stages * replicas)))

    def rank(self, stage: int, replica: int) -> int:
        return stage * self.replicas + replica

    def position(self, rank: int) -> tuple[int, int]:
        """(stage, replica) of ``rank``."""
        return divmod(rank, self.replicas)

    def dp_group(self, stage: int) -> tuple[int, ...]:
        """Ranks of stage ``stage``'s data-parallel group, in rank order."""
        return tuple(self.rank(stage, d) for d in range(self.replicas))

    def pipeline(self, replica: int) -> tuple[int, ...]:
        """Ranks of replica ``replica``'s pipeline, first stage to last."""
        return tuple(self.rank(s, replica) for s in range(self.stages))

    def host_pairs_of_dp(self) -> list[Pair]:
        """Every host pair inside one DP group (sorted)."""
        out = []
        for s in range(self.stages):
            hs = [self.hosts[r] for r in self.dp_group(s)]
            out += [_pair(a, b) for a, b in itertools.combinations(hs, 2)]
        return sorted(out)

    def where(self, a: int, b: int) -> str:
        """What traffic host pair ``a``-``b`` carries in this layout."""
        (sa, da), (sb, db) = (self.position(self.hosts.index(h)) for h in (a, b))
        if sa == sb:
            return f"stage {sa}'s DP group"
        if da == db and abs(sa - sb) == 1:
            return f"link {min(sa, sb)} of pipeline {da}"
        return "no traffic"

    def describe(self) -> str:
        """``[[0, 1], [2, 3]]``: the hosts of each stage's DP group (one list per stage)."""
        return str([[self.hosts[r] for r in self.dp_group(s)] for s in range(self.stages)])


# --------------------------------------------------------------------------------------------
# What the ranks exchange about their DP collectives


@dataclass(frozen=True)
class CollectiveStamp:
    """One DP collective (or probe message) as one rank saw it; times in ms on the common clock.

    ``group`` is the global ranks of its process group, ``ordinal`` tells apart groups over the
    same ranks, ``seq`` counts the group's collectives (equal on every member). ``start``: when it
    could begin on this rank (issued, and the group's previous collective done); ``end``: when it
    completed here. ``peer`` >= 0 for a probe message to or from that rank (``steps`` 1 on the
    receive, 0 on the send).
    """

    group: tuple[int, ...]
    ordinal: int
    seq: int
    steps: int
    start_ms: float
    end_ms: float
    peer: int = -1

    @property
    def key(self) -> tuple[tuple[int, ...], int, int]:
        return (self.group, self.ordinal, self.seq)


_STAMP = 7  # group bitmask, ordinal, seq, steps, start, end, peer
MAX_GROUP_RANK = 52  # group masks are exact integers in a float64 row


def segment_width(capacity: int) -> int:
    """Floats a rank's DP segment takes: a count, the stamps left out, ``capacity`` stamps."""
    return 2 + _STAMP * capacity


def encode_stamps(stamps: Sequence[CollectiveStamp], capacity: int) -> list[float]:
    """Pack the newest ``capacity`` stamps into :func:`segment_width` floats (older ones are counted
    as left out: statistics never stop training)."""
    kept = list(stamps)[-capacity:] if capacity else []
    row = [math.nan] * segment_width(capacity)
    row[0], row[1] = float(len(kept)), float(len(stamps) - len(kept))
    at = 2
    for st in kept:
        if max(st.group) > MAX_GROUP_RANK:
            raise ValueError(f"DP group {list(st.group)}: ranks above {MAX_GROUP_RANK} do not fit the exchange row")
        mask = sum(1 << r for r in st.group)
        row[at : at + _STAMP] = [float(mask), st.ordinal, st.seq, st.steps, st.start_ms, st.end_ms, st.peer]
        at += _STAMP
    return row


def decode_stamps(row: Sequence[float]) -> tuple[list[CollectiveStamp], int]:
    """Inverse of :func:`encode_stamps`: the stamps and how many were left out."""
    count, dropped = int(row[0]), int(row[1])
    out = []
    at = 2
    for _ in range(count):
        mask, ordinal, seq, steps, start, end, peer = row[at : at + _STAMP]
        group = tuple(r for r in range(MAX_GROUP_RANK + 1) if int(mask) >> r & 1)
        out.append(CollectiveStamp(group, int(ordinal), int(seq), int(steps), float(start), float(end), int(peer)))
        at += _STAMP
    return out, dropped


def _group_samples(stamps_by_rank: Iterable[Sequence[CollectiveStamp]]) -> dict[tuple[int, ...], list[float]]:
    """Per DP group (its ranks): the per-hop samples of the collectives every member reported."""
    seen: dict[tuple[tuple[int, ...], int, int], list[CollectiveStamp]] = {}
    for stamps in stamps_by_rank:
        for st in stamps:
            if st.peer < 0 and st.steps > 0:
                seen.setdefault(st.key, []).append(st)
    out: dict[tuple[int, ...], list[float]] = {}
    for (group, _, _), sts in seen.items():
        if len(sts) != len(group) or any(math.isnan(s.end_ms) for s in sts):
            continue  # a member's stamp was left out or the collective had not finished
        wire = max(0.0, min(s.end_ms for s in sts) - max(s.start_ms for s in sts))
        out.setdefault(group, []).append(wire / sts[0].steps)
    return out


def _probe_samples(stamps_by_rank: Sequence[Sequence[CollectiveStamp]]) -> dict[Pair, list[float]]:
    """Per rank pair: one-way delays of the probe messages (receive end - send start); send #q from
    rank i to rank j matches receive #q on j from i."""
    sends: dict[tuple[tuple[int, ...], int, int, int, int], CollectiveStamp] = {}
    recvs: list[tuple[int, CollectiveStamp]] = []
    for rank, stamps in enumerate(stamps_by_rank):
        for st in stamps:
            if st.peer < 0:
                continue
            if st.steps == 0:
                sends[(st.group, st.ordinal, rank, st.peer, st.seq)] = st
            else:
                recvs.append((rank, st))
    out: dict[Pair, list[float]] = {}
    for rank, recv in recvs:
        send = sends.get((recv.group, recv.ordinal, recv.peer, rank, recv.seq))
        if send is not None and not math.isnan(recv.end_ms):
            out.setdefault(_pair(rank, recv.peer), []).append(max(0.0, recv.end_ms - send.start_ms))
    return out


def estimate_pairs(
    stamps_by_rank: Sequence[Sequence[CollectiveStamp]], layout: Layout
) -> tuple[dict[Pair, LinkEstimate], dict[int, float]]:
    """The step's per-hop delay samples per DP host pair, and each stage's DP group median.

    A two-rank group's collectives are samples of its one pair; probe messages are samples of the
    pair they crossed (:func:`_probe_samples`). ``stamps_by_rank[r]`` is rank ``r``'s report.
    """
    by_group = _group_samples(stamps_by_rank)
    pairs: dict[Pair, LinkEstimate] = {}
    medians: dict[int, float] = {}
    for s in range(layout.stages):
        ranks = layout.dp_group(s)
        samples = by_group.get(ranks, [])
        if samples:
            medians[s] = statistics.median(samples)
        if len(ranks) == 2 and samples:
            hp = _pair(layout.hosts[ranks[0]], layout.hosts[ranks[1]])
            pairs.setdefault(hp, LinkEstimate(-1)).exact.extend(samples)
    for (a, b), samples in _probe_samples(stamps_by_rank).items():
        hp = _pair(layout.hosts[a], layout.hosts[b])
        pairs.setdefault(hp, LinkEstimate(-1)).exact.extend(samples)
    return pairs, medians


# --------------------------------------------------------------------------------------------
# The assignment search


PipelineCost = Callable[[tuple[float, ...]], float]
"""Simulated step of one pipeline (ms) given the delay of each of its links."""


def link_delay_sum(delays: tuple[float, ...]) -> float:
    """The cost of a pipeline when no simulator is given: the delays it carries."""
    return float(sum(delays))


@dataclass(frozen=True)
class Score:
    """How good a layout is for a set of slow pairs; smaller is better, compared in field order."""

    dp_delay_ms: float  # slow-pair delay left inside DP groups
    off_pipeline: int  # with the ``pp`` policy: slow pairs that carried traffic and would carry none
    pipeline_ms: float  # the slowest pipeline's simulated step under the delays its links carry
    moved: int  # hosts that run another rank than before
    hosts: tuple[int, ...]  # a fixed tie-break


def score(layout: Layout, slow: Mapping[Pair, float], policy: str, cost: PipelineCost, current: Layout) -> Score:
    """:class:`Score` of ``layout`` (``current``: the layout the hosts are in now)."""
    position = {h: layout.position(r) for r, h in enumerate(layout.hosts)}
    dp = 0.0
    off = 0
    links: list[list[float]] = [[0.0] * (layout.stages - 1) for _ in range(layout.replicas)]
    for (a, b), ms in slow.items():
        (sa, da), (sb, db) = position[a], position[b]
        if sa == sb:
            dp += ms
        elif da == db and abs(sa - sb) == 1:
            links[da][min(sa, sb)] += ms
        elif policy == "pp" and current.where(a, b) != "no traffic":
            off += 1  # moved off its DP group or pipeline link, but onto no link
    slowest = max((cost(tuple(v)) for v in links), default=0.0) if layout.stages > 1 else 0.0
    moved = sum(1 for x, y in zip(layout.hosts, current.hosts) if x != y)
    return Score(dp, off, round(slowest, 6), moved, layout.hosts)


def _fill(current: Layout, placed: Mapping[int, int]) -> Layout:
    """``current`` with host -> rank ``placed``; every other host keeps its rank unless displaced,
    displaced hosts take the freed ranks in order."""
    hosts: list[int | None] = [None] * len(current.hosts)
    for h, r in placed.items():
        hosts[r] = h
    free = [r for r in range(len(hosts)) if hosts[r] is None]
    waiting = []
    for r, h in enumerate(current.hosts):
        if h in placed:
            continue
        if hosts[r] is None:
            hosts[r] = h
            free.remove(r)
        else:
            waiting.append(h)
    for h, r in zip(waiting, free):
        hosts[r] = h
    return Layout(current.stages, current.replicas, tuple(h for h in hosts if h is not None))


def best_layout(
    current: Layout,
    slow: Mapping[Pair, float],
    *,
    policy: str = "any",
    cost: PipelineCost = link_delay_sum,
) -> Layout:
    """The layout that takes the slow host pairs (``{(a, b): ms}``) off the DP groups (see the
    module docstring for the order of preferences); ``current`` when nothing is better."""
    if policy not in ("pp", "any"):
        raise ValueError(f"policy must be 'pp' or 'any', got {policy!r}")
    slow = {_pair(a, b): float(ms) for (a, b), ms in slow.items()}
    cache: dict[tuple[float, ...], float] = {}

    def cached(delays: tuple[float, ...]) -> float:
        if delays not in cache:
            cache[delays] = cost(delays)
        return cache[delays]

    def rate(layout: Layout) -> tuple[float, int, float, int, tuple[int, ...]]:
        sc = score(layout, slow, policy, cached, current)
        return (sc.dp_delay_ms, sc.off_pipeline, sc.pipeline_ms, sc.moved, sc.hosts)

    n = len(current.hosts)
    involved = sorted({h for p in slow for h in p})
    best, best_rate = current, rate(current)
    if math.perm(n, len(involved)) <= EXHAUSTIVE_LIMIT:
        for ranks in itertools.permutations(range(n), len(involved)):
            cand = _fill(current, dict(zip(involved, ranks)))
            r = rate(cand)
            if r < best_rate:
                best, best_rate = cand, r
        return best
    # one slow pair at a time, worst first, the hosts already placed staying where they are
    placed: dict[int, int] = {}
    for (a, b), _ in sorted(slow.items(), key=lambda kv: (-kv[1], kv[0])):
        todo = [h for h in (a, b) if h not in placed]
        step_best, step_rate = None, None
        for ranks in itertools.permutations([r for r in range(n) if r not in placed.values()], len(todo)):
            cand = _fill(current, {**placed, **dict(zip(todo, ranks))})
            r = rate(cand)
            if step_rate is None or r < step_rate:
                step_best, step_rate = dict(zip(todo, ranks)), r
        placed.update(step_best or {})
    cand = _fill(current, placed)
    return cand if rate(cand) < best_rate else best


# --------------------------------------------------------------------------------------------
# The monitor


@dataclass(frozen=True)
class Move:
    """A new layout decided after ``step`` for the slow pairs ``slow`` ({host pair: planned ms})."""

    step: int
    old: Layout
    new: Layout
    slow: dict[Pair, float]
    reasons: tuple[str, ...]

    def describe(self) -> str:
        """The log line of this move."""
        where = "; ".join(
            f"pair {a}-{b}: {self.old.where(a, b)} -> {self.new.where(a, b)}" for a, b in sorted(self.slow)
        )
        return (
            f"step {self.step}: {'; '.join(self.reasons)} -> rank layout (hosts per stage's DP group) "
            f"{self.old.describe()} -> {self.new.describe()} ({where}); host of each rank {list(self.new.hosts)}"
        )


@dataclass
class TopologyMonitor:
    """Per-step DP pair detection and the resulting moves; identical on every rank.

    Args:
        layout: the layout the run is in.
        rule: the consensus rules (``[morph] detect_*``/``recover_*``, floor ``dp_detect_min_ms``).
        policy: ``off`` (detect and report only), ``pp`` or ``any`` (see :func:`best_layout`).
        cost: a pipeline's simulated step under per-link delays (None: the sum of its delays).
    """

    layout: Layout
    rule: DetectRule = field(default_factory=DetectRule)
    policy: str = "off"
    cost: PipelineCost | None = None
    step: int = 0
    move: Move | None = None
    medians: dict[int, float] = field(default_factory=dict)
    estimates: dict[Pair, LinkEstimate] = field(default_factory=dict)
    dropped: int = 0

    def __post_init__(self) -> None:
        if self.policy not in ("off", "pp", "any"):
            raise ValueError(f"policy must be off, pp or any, got {self.policy!r}")
        self.pairs = self.layout.host_pairs_of_dp()
        self.detector = Detector(len(self.pairs), self.rule)

    def observe(self, step: int, stamps_by_rank: Sequence[Sequence[CollectiveStamp]], dropped: int = 0) -> Move | None:
        """Take every rank's DP stamps of step ``step`` (rank order); the move to make, if any (once)."""
        self.step = step
        self.dropped += dropped
        self.estimates, self.medians = estimate_pairs(stamps_by_rank, self.layout)
        per_pair = [self.estimates.get(p, LinkEstimate(i)) for i, p in enumerate(self.pairs)]
        zeros = [0.0] * len(self.pairs)
        decision = self.detector.update(step, per_pair, zeros, zeros)
        if decision is None or self.move is not None:
            return None
        reasons = self._reasons(decision)
        slow = {self.pairs[i]: self.detector.links[i].planned_ms for i in decision.slow_links}
        if self.policy == "off":
            if slow:
                logger.warning("titan_morph: step %d: %s (orchestrator off: no move)", step, "; ".join(reasons))
            return None
        if not slow:
            return None
        new = best_layout(self.layout, slow, policy=self.policy, cost=self.cost or link_delay_sum)
        if new == self.layout:
            logger.warning("titan_morph: step %d: %s; no better rank layout exists", step, "; ".join(reasons))
            return None
        self.move = Move(step, self.layout, new, slow, reasons)
        return self.move

    def _reasons(self, decision: Decision) -> tuple[str, ...]:
        """The detector's reasons with its link numbers named as DP host pairs."""
        out = []
        for text in decision.reasons:
            head, _, rest = text.partition(" ")
            if head == "link":
                index, _, rest = rest.partition(" ")
                a, b = self.pairs[int(index)]
                text = f"DP pair {a}-{b} ({self.layout.where(a, b)}) {rest}"
            out.append(text)
        return tuple(out)

    def suspects(self) -> list[tuple[int, ...]]:
        """DP groups of more than two ranks whose median per-hop delay is above the floor: their
        ring pairs need probes to be told apart."""
        floor = self.rule.slow_threshold(0.0)
        return [
            self.layout.dp_group(s)
            for s, ms in sorted(self.medians.items())
            if ms > floor and len(self.layout.dp_group(s)) > 2
        ]

    def metrics(self) -> dict[str, float]:
        """TensorBoard scalars of the last step (the same on every rank)."""
        out: dict[str, float] = {}
        for s, ms in self.medians.items():
            out[f"morph/dp_delay_ms/stage{s}"] = ms
        for i, (a, b) in enumerate(self.pairs):
            out[f"morph/dp_straggling/pair{a}-{b}"] = float(self.detector.links[i].slow)
        out["morph/dp_stamps_dropped"] = float(self.dropped)
        return out
