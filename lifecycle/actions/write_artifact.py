from __future__ import annotations

import re

from django.db import transaction
from django.utils.translation import gettext as _

from lifecycle.enginefs import EngineHome
from lifecycle.errors import ActionRefused, engine_folder_refusal
from lifecycle.fence import lock_writable
from lifecycle.models import Conversation

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def write_artifact(conversation: Conversation, *, name: str, data: bytes, home: EngineHome | None = None) -> None:
    """The engine's write of a large output or tool artifact, fenced like every write."""
    if not NAME.fullmatch(name) or ".." in name:
        raise ActionRefused("invalid_name", _("An artifact name is a plain file name."), status=400)
    home = home or EngineHome()
    with transaction.atomic():
        locked = lock_writable(conversation)
        try:
            home.write_atomic(home.artifacts_dir(locked.storage_key) / name, data)
        except OSError as error:  # a read-only or full engine folder (the old file stays whole)
            raise engine_folder_refusal(error) from None
