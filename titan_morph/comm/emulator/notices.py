"""The commit notices of the link emulator (:mod:`titan_morph.comm.emulator.transport`) in the c10d store.

gloo cannot poll a receive, so the sender of each emulated message posts a notice (``status:nbytes:
planned``) under ``<link>/<direction>/<seq>`` once the message is accepted, and the receiver's
watcher waits for it, in bounded slices, before it blocks on the data. Each receiving (link,
direction) has its own store client, so a wait on one link never delays another's.
"""

from __future__ import annotations

import datetime
import threading

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

__all__ = ["KEY_WINDOW", "NoticeBoard"]

# Commit notices older than this many messages on a (link, direction) are deleted by the sender: a
# receiver never lags that far behind (a pipeline has at most ~microbatches messages in flight).
KEY_WINDOW = 4096


class _Client:
    """One receiving (link, direction)'s store client and the timeout last set on it."""

    def __init__(self, store: PrefixStore) -> None:
        self.store, self.lock, self.timeout_s = store, threading.Lock(), -1.0


class NoticeBoard:
    """The notices of one emulated transport, under ``namespace`` in ``store``."""

    def __init__(self, store: Store, namespace: str) -> None:
        self._base, self._namespace = store, namespace
        self._send_store = PrefixStore(namespace, self._clone())
        self._send_lock, self._recv_lock = threading.Lock(), threading.Lock()
        self._clients: dict[tuple[int, str], _Client] = {}

    def _clone(self) -> Store:
        clone: Store = self._base.clone()  # type: ignore[attr-defined, unused-ignore]  # in torch's stub from 2.15 only
        return clone

    @staticmethod
    def key(link: int, direction: str, seq: int) -> str:
        return f"{link}/{direction}/{seq}"

    def post(self, key: str, value: str) -> None:
        with self._send_lock:
            self._send_store.set(key, value)

    def wait(self, link: int, direction: str, key: str, timeout_s: float) -> str | None:
        """The notice under ``key``, waiting at most ``timeout_s`` (one store round trip); None if none yet."""
        with self._recv_lock:
            client = self._clients.get((link, direction))
            if client is None:
                client = self._clients[(link, direction)] = _Client(PrefixStore(self._namespace, self._clone()))
        with client.lock:
            if timeout_s != client.timeout_s:
                client.store.set_timeout(datetime.timedelta(seconds=timeout_s))
                client.timeout_s = timeout_s
            try:
                return client.store.get(key).decode()
            except dist.DistStoreError:
                return None

    def forget(self, link: int, direction: str, seq: int) -> None:
        """Delete the notice ``KEY_WINDOW`` messages back (long consumed) so the store stays small."""
        if seq >= KEY_WINDOW:
            with self._send_lock:
                self._send_store.delete_key(self.key(link, direction, seq - KEY_WINDOW))

    def close(self) -> None:
        """Drop the receive clients now, not at interpreter exit."""
        with self._recv_lock:
            self._clients.clear()
