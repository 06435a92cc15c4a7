from __future__ import annotations

from lifecycle.revisioned import save_revisioned
from retention.models import ToolPayloadPolicy


def save_tool_payload_policy(
    *, enabled: bool, age_value: int, age_unit: str, revision: int, acting_user
) -> ToolPayloadPolicy:
    """Save the installation-wide tool payload cleanup policy."""
    return save_revisioned(
        ToolPayloadPolicy,
        new={"enabled": enabled, "age_value": age_value, "age_unit": age_unit},
        revision=revision,
        acting_user=acting_user,
        action="tool_payload_policy.saved",
        extra={"updated_by": acting_user},
    )
