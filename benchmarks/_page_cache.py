"""Page-cache helpers of the benchmarks: how much of a file is cached (``mincore``), drop a file's
clean pages (``posix_fadvise``), read a file once into the cache, and a folder's apparent and
allocated bytes (the disk columns of the reports)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


def page_cache_fraction(path: Path) -> float:
    """Fraction of ``path``'s pages that are in the page cache (``mincore`` on a mapping)."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore on {path} failed")
            resident = sum(1 for v in bytes(vec) if v & 1)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return resident / pages


def evict(path: Path) -> None:
    """Drop ``path``'s clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    """Read ``path`` once so that it is in the page cache (through one small reused buffer)."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass


def disk_usage(path: Path) -> dict[str, float]:
    """Apparent bytes (sum of sizes), allocated bytes (blocks) and file count under ``path``."""
    apparent = allocated = files = 0
    for p in [path, *path.rglob("*")] if path.exists() else []:
        st = p.lstat()
        if p.is_file():
            apparent += st.st_size
            allocated += st.st_blocks * 512
            files += 1
    return {"apparent": apparent, "allocated": allocated, "files": files}
