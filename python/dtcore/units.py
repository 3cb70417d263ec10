"""Sizes as dtcore reads and writes them: one parser and one formatter (csrc/dtcore/common/units.h).

    parse_bytes("2GB") == 2_000_000_000      # kB, MB, GB, TB: powers of 1000 (SI)
    parse_bytes("1.5GiB") == 1_610_612_736   # KiB, MiB, GiB, TiB: powers of 1024 (IEC)
    format_bytes(65536) == "64 KiB"          # binary units, exact when whole

A bare K, M or G is refused as ambiguous. Bucket sizes (bucket_mb, torch DDP's bucket_cap_mb)
are MiB.
"""

from __future__ import annotations

from . import _C
from ._C import format_bytes

__all__ = ["parse_bytes", "format_bytes"]


def parse_bytes(size: str | int, what: str = "size") -> int:
    """Bytes from "2GB", "1.5GiB", "4096" or a positive int; ConfigError naming `what` otherwise."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 1:
            raise _C.ConfigError(f"{what} {size} is not a size in bytes. Fix: pass a positive number of bytes.")
        return size
    return _C.parse_bytes(str(size), what)
