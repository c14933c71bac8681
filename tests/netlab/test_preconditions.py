"""Where namespaces cannot be made, the reason is one line (the netlab tests skip with it)."""

from __future__ import annotations

import pytest

from titan_morph.netlab import lab


def test_without_root_the_reason_is_one_line(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(lab.os, "geteuid", lambda: 1000)
    assert lab.can_make_namespaces() == "netlab needs root (network namespaces, veths, tc)"


def test_without_iproute2_the_reason_names_the_tool(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(lab.os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert lab.can_make_namespaces() == "netlab needs the 'ip' command (iproute2)"
