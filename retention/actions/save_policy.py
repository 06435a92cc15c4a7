from __future__ import annotations

from lifecycle.revisioned import save_revisioned
from retention.models import BackupChoice, PreparationState, ToolPayloadPolicy


def save_tool_payload_policy(
    *, enabled: bool, age_value: int, age_unit: str, revision: int, acting_user,
    backup_choice: str | None = None,
) -> ToolPayloadPolicy:
    """Save the installation-wide tool payload cleanup policy.

    A `backup_choice` starts the preparation over: "skip" makes it ready at once (the admin
    chose to continue without a backup), "create" asks for a new verified backup before the
    next cleanup. Whether a choice is required, and whether a save changes anything (the
    stored choice sent again with the stored switch and period does not: r108), are
    `retention.service.save_policy`'s rules.
    """
    return save_revisioned(
        ToolPayloadPolicy,
        new=policy_fields(enabled=enabled, age_value=age_value, age_unit=age_unit, backup_choice=backup_choice),
        revision=revision,
        acting_user=acting_user,
        action="tool_payload_policy.saved",
        extra={"updated_by": acting_user},
    )


def policy_fields(*, enabled: bool, age_value: int, age_unit: str, backup_choice: str | None) -> dict:
    """The policy's fields as a save with these values leaves them."""
    new = {"enabled": enabled, "age_value": age_value, "age_unit": age_unit}
    if backup_choice is not None:
        new.update(
            backup_choice=backup_choice,
            preparation_state=(
                PreparationState.READY if backup_choice == BackupChoice.SKIP else PreparationState.NONE
            ),
            backup_receipt_name="",
            preparation_error="",
        )
    return new
