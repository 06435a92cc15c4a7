"""Words that carry counts agree with each count, in both languages (r137: "1 nuevas", "1 new
conversations"), and one English word used as two things has a Spanish word for each."""

from __future__ import annotations

import pytest
from django.utils import translation

from lifecycle.errors import ActionRefused
from remote.sync import failed_read_text, read_text


@pytest.mark.parametrize(("language", "counts", "words"), [
    ("en", {"created": 1, "updated": 2}, "Read the engine's conversations: 1 new, 2 already listed and brought up to "
                                         "date."),
    ("es", {"created": 1, "updated": 1}, "Se leyeron las conversaciones del motor: 1 nueva, 1 ya listada y puesta "
                                         "al día."),
    ("es", {"created": 2, "updated": 0}, "Se leyeron las conversaciones del motor: 2 nuevas, 0 ya listadas y "
                                         "puestas al día."),
])
def test_a_reads_counts_agree_with_their_words(language, counts, words):
    with translation.override(language):
        assert read_text(counts) == words


@pytest.mark.parametrize(("language", "kept", "words"), [
    ("en", {"created": 1, "updated": 2, "returned": 0},
     "(1 new conversation, 2 brought up to date, 0 back after a completed delete)."),
    ("es", {"created": 1, "updated": 1, "returned": 1},
     "(1 conversación nueva, 1 actualizada, 1 de vuelta tras una eliminación completada)."),
    ("es", {"created": 3, "updated": 2, "returned": 0},
     "(3 conversaciones nuevas, 2 actualizadas, 0 de vuelta tras una eliminación completada)."),
])
def test_a_failed_reads_kept_pages_agree_with_their_counts(language, kept, words):
    refused = ActionRefused("engine_unreachable", "")
    refused.kept = kept
    with translation.override(language):
        assert failed_read_text(refused).endswith(words)


@pytest.mark.django_db
def test_the_compaction_is_named_as_an_operation_where_it_is_one_and_as_an_action_on_its_button(admin_user,
                                                                                                 admin_client):
    from retention import service

    service.start_compact(user=admin_user)  # queued: listed in the history and on Operations
    host = {"HTTP_HOST": "127.0.0.1", "HTTP_ACCEPT_LANGUAGE": "es"}
    with translation.override("es"):
        storage = admin_client.get("/settings/system/data-storage/", **host).content.decode()
        operations = admin_client.get("/operations/", **host).content.decode()
    assert "Compactación de la base de datos" in operations and "Compactar la base de datos" not in operations
    assert "Compactación de la base de datos" in storage  # its history row
    assert ">Compactar la base de datos</button>" in storage  # its button
