"""The free C heap goes back to the system: glibc keeps freed small blocks in its arena (the resident
set stays up though nothing live grows) until :func:`release_free_heap` trims it."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest

from titan_morph.comm.machine.system import proc_status, release_free_heap

BLOCKS, SIZE, KEEP_EVERY = 60_000, 1024, 64  # 60 MB in 1 KB blocks (below mmap's threshold)


def _rss_kb() -> int:
    return int(proc_status(os.getpid()).get("VmRSS", "0 kB").split()[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_free_heap_returns_the_pages_of_freed_blocks() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(SIZE) for _ in range(BLOCKS)]
    for b in blocks:
        ctypes.memset(b, 1, SIZE)  # touched: resident
    kept = blocks[::KEEP_EVERY]  # one live block every 64 KB: no free page at the heap's top only
    for b in set(blocks) - set(kept):
        libc.free(b)
    freed_kb = (BLOCKS - len(kept)) * SIZE // 1024
    before = _rss_kb()
    release_free_heap()
    after = _rss_kb()
    for b in kept:
        libc.free(b)
    assert before - after > freed_kb // 2, f"RSS {before} -> {after} KB after freeing {freed_kb} KB"
