"""The steps of an erasure, derived from the registry (never a second list)."""

from __future__ import annotations

from lifecycle.registry import Store, erasure_order

FINGERPRINTS = "fingerprints"


def step_keys() -> list[str]:
    """Fingerprints first (while the content is still there), then every acting store."""
    return [FINGERPRINTS] + [s.key for s in erasure_order()]


def stores_by_key() -> dict[str, Store]:
    return {s.key: s for s in erasure_order()}
