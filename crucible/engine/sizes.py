"""Byte sizes as people write them: '40GiB', '1.5 GB'. Strict: a unit is required, and a
bare number, a negative, a percentage or an unknown unit is an error naming the setting."""

from __future__ import annotations

import re

from crucible.errors import ConfigError

# bytes per unit; a unit is matched case-insensitively
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
UNITS_HELP = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d{1,9})?)\s*([A-Za-z]+)\s*$")


def parse_bytes(text: str, what: str = "kv_cache_memory",
                units: tuple[str, ...] | None = None) -> int:
    """'40GiB', '1.5 GB', '512MiB' -> bytes (fractional bytes round down). A unit is
    required: a bare number, a negative or another unit is an error naming ``what``.
    ``units``: the only units accepted (default: all of UNITS_HELP)."""
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else ""
    allowed = {u.upper() for u in units} if units else _UNITS.keys()
    if not m or unit not in _UNITS or unit not in allowed:
        names = ", ".join(units) if units else UNITS_HELP
        raise ConfigError(f"{what} must be a size with a unit ({names}), e.g. 40GiB; "
                          f"got {text!r}")
    whole, _, frac = m.group(1).partition(".")
    value = int(whole) * _UNITS[unit] + (int(frac) * _UNITS[unit]) // 10 ** len(frac) \
        if frac else int(whole) * _UNITS[unit]
    if value <= 0:
        raise ConfigError(f"{what} must be more than 0 bytes, got {text!r}")
    return value
