from __future__ import annotations

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import models
from django.test.utils import isolate_apps

from lifecycle.checks import check_models, check_retention_registry
from lifecycle.registry import STORES, RetentionClass, markdown_table


def test_it_passes_the_system_check_for_the_shipped_models():
    assert check_retention_registry() == []


def test_it_registers_every_model_that_refers_to_a_conversation():
    conversation = apps.get_model("lifecycle", "Conversation")
    registered = {s.model.lower() for s in STORES if s.kind == "table"}
    referring = {
        m._meta.label_lower
        for m in apps.get_models()
        if m is conversation or any(getattr(f, "related_model", None) is conversation for f in m._meta.fields)
    }
    assert referring <= registered
    assert "lifecycle.item" in referring


@isolate_apps("lifecycle")
def test_it_fails_the_check_for_an_unregistered_model():
    class Scratchpad(models.Model):
        conversation = models.ForeignKey("lifecycle.Conversation", on_delete=models.CASCADE)

        class Meta:
            app_label = "lifecycle"

    class Unrelated(models.Model):
        class Meta:
            app_label = "lifecycle"

    errors = check_models([Scratchpad, Unrelated])
    assert [e.id for e in errors] == ["lifecycle.E001"]
    assert "Scratchpad" in errors[0].msg


def test_it_declares_the_ratified_classes():
    by_key = {s.key: s.retention for s in STORES}
    assert by_key["lifecycle.Item"] == RetentionClass.ERASE
    assert by_key["lifecycle.OperationBinding"] == RetentionClass.COMPACT
    assert by_key["lifecycle.Export"] == RetentionClass.RETAIN_DETACH
    assert by_key["lifecycle.SharedLink"] == RetentionClass.SHARED
    assert by_key["lifecycle.MemoryEntry"] == RetentionClass.RETAIN
    assert by_key["lifecycle.AuditFact"] == RetentionClass.RETAIN_FACTS
    assert by_key["subagents"] == RetentionClass.COMPACT
    assert by_key["provider"] == RetentionClass.OUT_OF_SCOPE


def test_it_keeps_the_documentation_table_generated_from_the_registry(settings):
    doc = (settings.BASE_DIR / "docs" / "retention-classes.md").read_text()
    assert doc == markdown_table()
    for store in STORES:
        assert str(store.label) in doc
    call_command("retention_table", "--check")


def test_it_rejects_a_stale_documentation_table(tmp_path, monkeypatch):
    from lifecycle.management.commands import retention_table

    stale = tmp_path / "retention-classes.md"
    stale.write_text("# out of date\n")
    monkeypatch.setattr(retention_table, "DOC", stale)
    with pytest.raises(SystemExit):
        call_command("retention_table", "--check")
