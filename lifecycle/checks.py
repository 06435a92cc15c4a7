"""System check: every model that refers to a conversation declares a retention class."""

from __future__ import annotations

from django.apps import apps
from django.core import checks


def conversation_references(model) -> bool:
    conversation = apps.get_model("lifecycle", "Conversation")
    if model is conversation:
        return True
    for f in model._meta.get_fields():
        if f.auto_created and not f.concrete or not f.is_relation:
            continue
        # An unresolved lazy reference is still the "app.Model" string.
        target = f.related_model
        label = target.lower() if isinstance(target, str) else target._meta.label_lower
        if label == conversation._meta.label_lower:
            return True
    return False


@checks.register()
def check_retention_registry(app_configs=None, **kwargs):
    return check_models(apps.get_models())


def check_models(models) -> list[checks.Error]:
    from lifecycle.registry import stores_by_model

    registered = stores_by_model()
    errors = []
    for model in models:
        if conversation_references(model) and model._meta.label_lower not in registered:
            errors.append(
                checks.Error(
                    f"{model._meta.label} refers to a conversation but declares no retention class.",
                    hint="Add it to STORES in lifecycle/registry.py.",
                    obj=model,
                    id="lifecycle.E001",
                )
            )
    for label in registered:
        try:
            apps.get_model(label)
        except LookupError:
            errors.append(
                checks.Error(f"The retention registry names an unknown model {label}.", id="lifecycle.E002")
            )
    return errors
