"""A folder this process cannot read, made for a test: as a process of another user meets one."""

from __future__ import annotations

import contextlib
import ctypes
import os


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _capabilities(data=None):
    """This thread's capability sets (capget), or set them (capset) when `data` is given."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    sets = data if data is not None else (_CapData * 2)()
    if (libc.capset if data is not None else libc.capget)(ctypes.byref(header), sets) != 0:
        raise OSError(ctypes.get_errno(), "capset" if data is not None else "capget")
    return sets


@contextlib.contextmanager
def unreadable(folder):  # a file too
    """`folder` cannot be listed by this thread while the block runs: no permission on it, and
    for root the capabilities that pass over permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)
    taken out of the thread's effective set; the kernel refuses it (EACCES), as it would a
    process of another user."""
    mode = folder.stat().st_mode
    folder.chmod(0)
    sets = _capabilities() if os.geteuid() == 0 else None
    saved = sets[0].effective if sets is not None else 0
    try:
        if sets is not None:
            sets[0].effective &= ~((1 << 1) | (1 << 2))
            _capabilities(sets)
        yield
    finally:
        if sets is not None:
            sets[0].effective = saved
            _capabilities(sets)
        folder.chmod(mode)
