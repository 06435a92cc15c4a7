"""System check: every model that refers to a conversation declares a retention class."""

from __future__ import annotations

from django.apps import apps
from django.core import checks


def conversation_references(model) -> bool:
    conversation = apps.get_model("lifecycle", "Conversation")
    if model is conversation:
        return True
    return any(
        f.is_relation and f.related_model is conversation and (f.many_to_one or f.one_to_one or f.many_to_many)
        for f in model._meta.get_fields()
        if not f.auto_created or f.concrete
    )


@checks.register()
def check_retention_registry(app_configs=None, **kwargs):
    from lifecycle.registry import stores_by_model

    registered = stores_by_model()
    errors = []
    for model in apps.get_models():
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
