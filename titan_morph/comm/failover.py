"""``[morph] transport = "auto"``: the default path per link, the delegated path when told or when
the link fails (paper §5.3: a failed link/NIC is routed around via the delegates instead of crashing
training).

:class:`FailoverTransport` routes each (link, direction) either through ``primary`` (the default
transport, normally the link emulator) or through ``delegate`` (a
:class:`~titan_morph.comm.delegate.DelegateTransport`).

* Told (``switch(links)``): between steps, on every rank, both directions of the links move to the
  delegates -- nothing is in flight then, so nothing is lost or reordered.
* Failover: a send the primary refuses with :class:`LinkDownError` moves that (link, direction) to
  the delegates on the sending rank and is re-issued there. The receiving rank learns it from its
  receive (the emulator delivers the refused message's placeholder, or gives up after its grace
  period, as :class:`LinkDownError`): it moves the (link, direction) too and re-posts, on the
  delegates and *in posting order*, every receive of that direction still outstanding on the
  primary. Both sides thus number the delegated messages of that direction identically from the
  first failed one on (the delegated path's per-link order), without restart. Each failover is
  counted (``failovers``) and logged.

Records: :meth:`take_records` returns both paths' :class:`MessageRecord` s, each naming its
``path``; sequence numbers count per path, so a send matches its receive by (path, link,
direction, seq). Both transports share one ``epoch`` (t=0 of all their times).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence

import torch.distributed as dist

from titan_morph.comm.records import MessageRecord
from titan_morph.comm.transport import Handle, Transport, classify_op
from titan_morph.pipelining.links import LinkDownError

logger = logging.getLogger(__name__)

__all__ = ["FailoverTransport"]


class _Recv:
    """A receive posted on the primary that fails over to the delegates if the link goes down."""

    def __init__(self, owner: FailoverTransport, key: tuple[int, str], inner: Handle) -> None:
        self.owner, self.key, self.inner = owner, key, inner
        self.ops: Sequence[dist.P2POp] = list(inner.ops)
        self.rerouted: Handle | None = None
        self.done = False

    @property
    def record(self) -> MessageRecord | None:
        return (self.rerouted or self.inner).record

    @property
    def due_s(self) -> float | None:
        return (self.rerouted or self.inner).due_s

    def wait(self, timeout: float | None = None) -> bool:
        if self.rerouted is None and not self.done:
            try:
                self.inner.wait(timeout)
                self.done = True
                pending = self.owner._pending.get(self.key, [])
                if self in pending:
                    pending.remove(self)
                return True
            except LinkDownError as e:
                self.owner._fail_over(self.key, f"receive: {e}")
        if self.rerouted is not None:
            return bool(self.rerouted.wait(timeout))
        return True

    def is_completed(self) -> bool:
        return self.done or (self.rerouted is not None and self.rerouted.is_completed())


class FailoverTransport:
    """Per-(link, direction) routing between a default ``primary`` and a ``delegate`` transport."""

    name = "auto"

    def __init__(
        self,
        primary: Transport,
        delegate: Transport,
        *,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        if primary.epoch != delegate.epoch:
            raise ValueError(
                f"FailoverTransport: primary and delegate must share one epoch (records' t=0), got "
                f"{primary.epoch} and {delegate.epoch}"
            )
        self.primary, self.delegate = primary, delegate
        self.stage, self.num_stages = stage, num_stages
        self.epoch = primary.epoch
        self.links = primary.links  # the link model predictions and metrics use
        self.depth = primary.depth
        self.routed: set[tuple[int, str]] = set()  # (link, direction) on the delegates
        self.switched: set[tuple[int, str]] = set()  # delegated by switch() (not by a failure)
        self.failovers = 0
        self.failover_log: list[tuple[int, int, str, str]] = []  # (step, link, direction, why)
        self._pending: dict[tuple[int, str], list[_Recv]] = {}
        self._group_name = (group if group is not None else dist.group.WORLD).group_name
        self.step = 0

    def now_ms(self) -> float:
        return self.primary.now_ms()

    def set_step(self, step: int) -> None:
        self.step = int(step)
        self.primary.set_step(step)
        self.delegate.set_step(step)

    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        self.primary.hint_issue(t_s, max_early_ms)
        self.delegate.hint_issue(t_s, max_early_ms)

    def delegated(self) -> frozenset[int]:
        return frozenset(link for link, _ in self.routed)

    def switch(self, links: Iterable[int]) -> None:
        """Move both directions of ``links`` to the delegates; call between steps on every rank."""
        for link in links:
            if not 0 <= link < self.num_stages - 1:
                raise ValueError(f"link must be in 0..{self.num_stages - 2}, got {link}")
            for d in ("fwd", "bwd"):
                if self._pending.get((link, d)):
                    raise RuntimeError(f"switch(link {link}) with {d} receives outstanding: switch between steps only")
                if (link, d) not in self.routed:
                    self.switched.add((link, d))
                self.routed.add((link, d))

    def restore(self, links: Iterable[int]) -> None:
        """Move ``links`` that :meth:`switch` delegated back to the primary (a recovered straggler);
        call between steps on every rank. Directions that failed over (link down) stay delegated:
        nothing shows that the failed path works again."""
        for link in links:
            if not 0 <= link < self.num_stages - 1:
                raise ValueError(f"link must be in 0..{self.num_stages - 2}, got {link}")
            for d in ("fwd", "bwd"):
                if (link, d) in self.switched:
                    self.switched.discard((link, d))
                    self.routed.discard((link, d))

    def _fail_over(self, key: tuple[int, str], why: str) -> None:
        if key in self.routed:
            return
        self.routed.add(key)
        self.switched.discard(key)  # a failed path stays delegated, even after a restore()
        self.failovers += 1
        self.failover_log.append((self.step, key[0], key[1], why))
        logger.warning(
            "titan_morph: link %d (%s) failed at step %d on stage %d; traffic fails over to the delegates (%s)",
            key[0],
            key[1],
            self.step,
            self.stage,
            why,
        )
        for rec in list(self._pending.get(key, [])):  # re-post outstanding receives, in posting order
            (rec.rerouted,) = self.delegate.batch_p2p(rec.ops)
        self._pending[key] = []

    def _down_now(self, link: int, direction: str) -> bool:
        links = self.primary.links
        return links is not None and math.isinf(links.delay_ms(link, direction, self.primary.now_ms(), self.step))

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        ops = list(ops)
        via_delegate, via_primary, keys = [], [], {}
        for op in ops:
            if op.group.group_name != self._group_name:
                via_primary.append(op)
                continue
            lo = classify_op(op, self.stage, self.num_stages)
            keys[id(op)] = (lo.link, lo.direction, lo.is_send)
            (via_delegate if (lo.link, lo.direction) in self.routed else via_primary).append(op)
        handles: list[Handle] = []
        if via_delegate:
            handles += self.delegate.batch_p2p(via_delegate, desc)
        if not via_primary:
            return handles
        try:
            inner = self.primary.batch_p2p(via_primary, desc)
        except LinkDownError as e:  # nothing of the batch was issued; move the dead sends and retry
            down = {
                (k[0], k[1]) for op in via_primary if (k := keys.get(id(op))) and k[2] and self._down_now(k[0], k[1])
            }
            for key in down or {(e.link, e.direction)}:
                self._fail_over(key, f"send: {e}")
            return handles + self.batch_p2p(via_primary, desc)
        for h in inner:
            rec = h.record
            if h.ops and rec is not None and rec.side == "recv":
                key = (rec.link, rec.direction)
                wrapped = _Recv(self, key, h)
                self._pending.setdefault(key, []).append(wrapped)
                handles.append(wrapped)
            else:
                handles.append(h)
        return handles

    def records(self) -> list[MessageRecord]:
        """Snapshot (copies) of the primary's and the delegate's message records; see ``path``."""
        return self.primary.records() + self.delegate.records()

    def take_records(self) -> list[MessageRecord]:
        """The primary's and the delegate's records so far, then forget them (per-step metrics)."""
        return self.primary.take_records() + self.delegate.take_records()

    def blocked_ms(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for t in (self.primary, self.delegate):
            for link, ms in t.blocked_ms().items():
                out[link] = out.get(link, 0.0) + ms
        return out

    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        try:
            self.primary.close(timeout, drain)
        finally:
            self.delegate.close(timeout, drain)

    def __enter__(self) -> FailoverTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)
