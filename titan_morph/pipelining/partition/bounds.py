"""Which contiguous splits of the layers :mod:`partition` has to plan: a lower bound on every split's
makespan that a DP minimises, and the enumeration of every split whose bound is under a threshold.

The bound of a split is a bound on *any* schedule of it (it only weakens :func:`timing.bounds.lower_bound_ms`
so that it decomposes): stage ``s`` cannot start before the first forward reaches it, head_s =
Σ_{j<s}(t^F_j + c_j + τ_j), and then still runs the N F, I and W of its layers, so the makespan is
at least max_s head_s + N·t_s (t_s = the stage's F + B + W, at its rank's speed). In the V (two stages
per rank, rank r running r and 2R−1−r) a rank's two stages share it: max_r head_r + N·(t_r + t_{2R−1−r}).

* :class:`ChainSplits` (one stage per rank): a DP over the suffixes, value[s][i] = the least
  max_{s'≥s}(head_{s'} − head_s + N·t_{s'}) over the splits of layers i.. into stages s.., is the
  exact minimum of the bound over the splits' remainders; a depth-first walk that visits a stage's
  ends in the order of that value yields exactly the splits whose bound is <= the threshold, never
  entering a branch without one.
* :class:`FoldSplits` (the V): rank by rank from the outside in (rank r takes the layers after rank
  r−1's front stage and the layers before its back stage), pruned by the largest middle the inner
  ranks can still take under the threshold (a table per threshold, heads ignored and empty stages
  allowed: a relaxation, so no split under the threshold is lost).

``fits(rank, ranges)`` says whether a rank's layer ranges (one, or two in the V) fit its memory; a
split with a rank that does not fit is never yielded. Layer ranges are half-open ``(start, stop)``.
Pure Python.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence

__all__ = ["ChainSplits", "FoldSplits", "Fits", "prefix_sums"]

Fits = Callable[[int, tuple[tuple[int, int], ...]], bool]
"""``fits(rank, ranges)``: do these layer ranges (the rank's stages) fit the rank's memory?"""

_REL = 1e-9


def prefix_sums(values: Sequence[float]) -> list[float]:
    """P[i] = values[0] + ... + values[i−1] (P[0] = 0)."""
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _within(value: float, threshold: float) -> bool:
    """value <= threshold, with room for the rounding of sums of floats."""
    return value <= threshold + _REL * max(1.0, abs(threshold))


class ChainSplits:
    """Splits of L layers into S stages on S ranks, one stage each (module docstring).

    ``fwd`` and ``work`` are prefix sums (:func:`prefix_sums`) of each layer's forward and of its
    F + B + W at speed 1; ``speeds[s]`` the speed of stage s's rank; ``hops[s]`` the least time a
    message takes from stage s to s+1 (latency + transmit); ``n`` the microbatches.
    """

    def __init__(
        self,
        fwd: Sequence[float],
        work: Sequence[float],
        speeds: Sequence[float],
        hops: Sequence[float],
        n: int,
        fits: Fits,
    ) -> None:
        self.pf, self.pw, self.speeds, self.hops, self.n, self.fits = list(fwd), list(work), list(speeds), hops, n, fits
        self.layers, self.stages = len(self.pw) - 1, len(self.speeds)
        self.truncated = False
        self._children: dict[tuple[int, int], list[tuple[float, int]]] = {}
        s_count, n_layers = self.stages, self.layers
        self.value = [[math.inf] * (n_layers + 1) for _ in range(s_count + 1)]
        self.value[s_count][n_layers] = 0.0
        for s in reversed(range(s_count)):
            for i in range(s, n_layers - (s_count - s) + 1):
                best = math.inf
                for e in self._ends(s, i):
                    nt = self._own(s, i, e)
                    if nt >= best:
                        break  # N·t_s only grows with e
                    best = min(best, self._h(s, i, e, nt))
                self.value[s][i] = best

    def _ends(self, s: int, i: int) -> range:
        """Where stage s (starting at layer i) may end: every later stage keeps at least one layer."""
        last = self.layers - (self.stages - 1 - s)
        return range(last, last + 1) if s == self.stages - 1 else range(i + 1, last + 1)

    def _own(self, s: int, i: int, e: int) -> float:
        """N·t_s for layers [i, e) on stage s, or inf when they do not fit the rank's memory."""
        if not self.fits(s, ((i, e),)):
            return math.inf
        return self.n * (self.pw[e] - self.pw[i]) / self.speeds[s]

    def _h(self, s: int, i: int, e: int, own: float) -> float:
        """The bound from stage s on, relative to head_s, when stage s is [i, e)."""
        if s == self.stages - 1:
            return own
        ahead = (self.pf[e] - self.pf[i]) / self.speeds[s] + self.hops[s]
        return max(own, ahead + self.value[s + 1][e])

    def floor(self) -> float:
        """The least bound over every split (inf: no split fits the memory)."""
        return self.value[0][0]

    def bound(self, split: Sequence[int]) -> float:
        """The bound of one split (layers per stage)."""
        head, out, i = 0.0, 0.0, 0
        for s, count in enumerate(split):
            e = i + count
            out = max(out, head + self.n * (self.pw[e] - self.pw[i]) / self.speeds[s])
            if s < self.stages - 1:
                head += (self.pf[e] - self.pf[i]) / self.speeds[s] + self.hops[s]
            i = e
        return out

    def _sorted_ends(self, s: int, i: int) -> list[tuple[float, int]]:
        key = (s, i)
        got = self._children.get(key)
        if got is None:
            got = []
            for e in self._ends(s, i):
                own = self._own(s, i, e)
                h = self._h(s, i, e, own) if own < math.inf else math.inf
                if h < math.inf:
                    got.append((h, e))
            got.sort()
            self._children[key] = got
        return got

    def splits(self, threshold: float, limit: int | None = None) -> Iterator[tuple[float, tuple[int, ...]]]:
        """Every split whose bound is <= ``threshold``, as (bound, layers per stage) (``limit``: as
        :meth:`FoldSplits.splits`; this walk never drops a split it visits)."""
        path: list[int] = []

        def walk(s: int, i: int, head: float, top: float) -> Iterator[tuple[float, tuple[int, ...]]]:
            for h, e in self._sorted_ends(s, i):
                if not _within(head + h, threshold):
                    return  # sorted: every later end is worse
                own = self.n * (self.pw[e] - self.pw[i]) / self.speeds[s]
                path.append(e - i)
                if s == self.stages - 1:
                    yield max(top, head + own), tuple(path)
                else:
                    ahead = (self.pf[e] - self.pf[i]) / self.speeds[s] + self.hops[s]
                    yield from walk(s + 1, e, head + ahead, max(top, head + own))
                path.pop()

        yield from walk(0, 0, 0.0, 0.0)


class FoldSplits:
    """Splits of L layers into 2R stages in the V, rank r running stages r and 2R−1−r.

    ``fwd``/``work`` as for :class:`ChainSplits`; ``speeds[r]`` per rank; ``hops[r]`` the least
    time from front stage r to r+1 (link r), r < R−1.
    """

    def __init__(
        self,
        fwd: Sequence[float],
        work: Sequence[float],
        speeds: Sequence[float],
        hops: Sequence[float],
        n: int,
        fits: Fits,
    ) -> None:
        self.pf, self.pw, self.speeds, self.hops, self.n, self.fits = list(fwd), list(work), list(speeds), hops, n, fits
        self.layers, self.ranks = len(self.pw) - 1, len(self.speeds)
        self.truncated = False

    def floor(self) -> float:
        """A lower bound on every split's bound: the work spread over the ranks by speed."""
        return self.n * self.pw[-1] / sum(self.speeds)

    def bound(self, split: Sequence[int]) -> float:
        """The bound of one split (layers per stage, 2R values in stage order), tightened now that
        every stage is known: each stage from its own head (the forward reaches stage s at
        head_s, over both legs of the V), and each rank from its back stage's head, before which
        it can run only its front stage's forwards."""
        r_count = self.ranks
        bounds = prefix_sums([float(c) for c in split])
        head = [0.0] * (2 * r_count)
        out = 0.0
        for s in range(2 * r_count):
            a, b = int(bounds[s]), int(bounds[s + 1])
            rank = s if s < r_count else 2 * r_count - 1 - s
            own = (self.pw[b] - self.pw[a]) / self.speeds[rank]
            out = max(out, head[s] + self.n * own)
            if s < 2 * r_count - 1:
                link = s if s < r_count - 1 else 2 * r_count - 2 - s if s >= r_count else -1
                head[s + 1] = (
                    head[s] + (self.pf[b] - self.pf[a]) / self.speeds[rank] + (self.hops[link] if link >= 0 else 0.0)
                )
        for r in range(r_count):
            back = 2 * r_count - 1 - r
            spans = ((int(bounds[r]), int(bounds[r + 1])), (int(bounds[back]), int(bounds[back + 1])))
            work = sum(self.pw[b] - self.pw[a] for a, b in spans) / self.speeds[r]
            front_f = (self.pf[spans[0][1]] - self.pf[spans[0][0]]) / self.speeds[r]
            gap = head[back] - head[r]
            out = max(out, head[r] + self.n * work, head[back] + self.n * work - min(self.n * front_f, gap))
        return out

    def _reach(self, threshold: float) -> list[list[int]]:
        """reach[r][i]: the largest j such that ranks r.. can take the middle [i, j) with each
        rank's N·work <= ``threshold`` (heads ignored, empty stages allowed: a relaxation)."""
        pw, n_layers, r_count = self.pw, self.layers, self.ranks
        slack = _REL * max(1.0, abs(threshold))
        reach = [[n_layers] * (n_layers + 1) for _ in range(r_count + 1)]
        for r in reversed(range(r_count)):
            cap = (threshold + slack) * self.speeds[r] / self.n
            row = reach[r]
            for i in range(n_layers + 1):
                best = i
                for e in range(i, n_layers + 1):
                    front = pw[e] - pw[i]
                    if front > cap:
                        break
                    f = e if r == r_count - 1 else reach[r + 1][e]
                    j = min(n_layers, bisect_right(pw, pw[f] + cap - front) - 1)
                    best = max(best, j)
                    if best == n_layers:
                        break
                row[i] = best
        return reach

    def splits(self, threshold: float, limit: int | None = None) -> Iterator[tuple[float, tuple[int, ...]]]:
        """Every split whose bound (:meth:`bound`) is <= ``threshold``, as (bound, layers per stage).
        The walk prunes by the rank bound with the front heads only, so it may visit splits it then
        drops; after ``limit`` such visits it stops and sets ``truncated``."""
        self.truncated = False
        reach = self._reach(threshold)
        if reach[0][0] < self.layers:
            return
        visits = 0
        r_count, n_layers = self.ranks, self.layers
        fronts: list[int] = []
        backs: list[int] = []

        def counts() -> tuple[int, ...]:
            front = [b - a for a, b in zip([0, *fronts], fronts)]
            back = [d - c for c, d in zip(backs, [n_layers, *backs])]
            return tuple(front + back[::-1])

        def walk(r: int, i: int, j: int, head: float, top: float) -> Iterator[tuple[float, tuple[int, ...]]]:
            speed = self.speeds[r]
            if r == r_count - 1:
                own = head + self.n * (self.pw[j] - self.pw[i]) / speed
                if not _within(own, threshold):
                    return
                nonlocal visits
                for e in range(i + 1, j):
                    if not self.fits(r, ((i, e), (e, j))):
                        continue
                    fronts.append(e)
                    backs.append(e)
                    split = counts()
                    fronts.pop()
                    backs.pop()
                    bound = self.bound(split)
                    if _within(bound, threshold):
                        yield bound, split
                        continue
                    visits += 1
                    if limit is not None and visits > limit:
                        self.truncated = True
                        return
                return
            inner = 2 * (r_count - 1 - r)  # layers the inner ranks need at least
            for e in range(i + 1, j - inner):
                front = self.pw[e] - self.pw[i]
                if not _within(head + self.n * front / speed, threshold):
                    break
                ahead = head + (self.pf[e] - self.pf[i]) / speed + self.hops[r]
                for f in range(min(j - 1, reach[r + 1][e]), e + inner - 1, -1):
                    own = head + self.n * (front + self.pw[j] - self.pw[f]) / speed
                    if not _within(own, threshold):
                        break
                    if not self.fits(r, ((i, e), (f, j))):
                        continue
                    fronts.append(e)
                    backs.append(f)
                    yield from walk(r + 1, e, f, ahead, max(top, own))
                    fronts.pop()
                    backs.pop()
                    if self.truncated:
                        return

        yield from walk(0, 0, n_layers, 0.0, 0.0)
