"""A job's stored error is said in the reader's language, its details and nested reasons too."""

from __future__ import annotations

import errno
import html
import json
import os

import pytest
from django.utils import translation

from retention import service
from retention.errors import Message, Size, os_reason, said, sizes_short
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from tests.test_api_tool_payloads import BASE
from tests.test_tool_payload_jobs import enable, old_conversation, run

HOST = {"HTTP_HOST": "127.0.0.1"}
PAGE = "/settings/system/data-storage/"
OUTER = "The backup made for this cleanup does not verify: %(reason)s"
INNER = "The backup file changed since it was made: its checksum no longer matches."
ENGLISH = OUTER % {"reason": INNER}
SPANISH = ("La copia de seguridad hecha para esta limpieza no supera la verificación: El archivo de la copia de "
           "seguridad cambió después de hacerse: su suma de comprobación ya no coincide.")
# Words of the English messages that no Spanish rendering of them has
ENGLISH_WORDS = ("backup", "verify", "checksum", "changed", "cleanup", "space", "needed", "free", "kept")


def english_in(text: str) -> list[str]:
    lowered = text.lower()
    return [word for word in ENGLISH_WORDS if word in lowered]


@pytest.fixture(autouse=True)
def english_after():
    """A request in Spanish leaves its language active in this thread: the next test starts in English."""
    yield
    translation.activate("en")


@pytest.fixture
def backup_dir(settings, tmp_path):
    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    return tmp_path / "backups"


@pytest.mark.django_db(transaction=True)
def test_a_backup_changed_on_disk_fails_cleanup_and_says_so_in_each_readers_language(
        admin_user, admin_client, api, backup_dir):
    old_conversation("tampered", tools=2)
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(enabled=False)  # prepare only: no cleanup follows
    backup = run(service.retry_preparation(user=admin_user))
    assert backup.state == "succeeded", backup.error_message
    ToolPayloadPolicy.objects.filter(id=1).update(enabled=True)
    with (backup_dir / backup.backup_name).open("ab") as archive:
        archive.write(b"\0")  # one byte more than was made and hashed

    cleanup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (cleanup.state, cleanup.error_code) == ("failed", "preparation_required")
    kept = {"msgid": OUTER, "params": {"reason": {"msgid": INNER, "params": {}}}}
    assert json.loads(cleanup.error_message) == kept  # the msgids and details, no text in a language
    policy = ToolPayloadPolicy.load()
    assert (policy.preparation_state, json.loads(policy.preparation_error)) == ("failed", kept)

    assert said(cleanup.error_message) == ENGLISH
    with translation.override("es"):
        assert said(cleanup.error_message) == SPANISH
        assert english_in(said(policy.preparation_error)) == []

    spanish_page = html.unescape(admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode())
    assert "La copia de seguridad falló:</strong> " + SPANISH in spanish_page
    assert "does not verify" not in spanish_page and "checksum" not in spanish_page
    english_page = html.unescape(admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="en", **HOST).content.decode())
    assert "Backup failed:</strong> " + ENGLISH in english_page

    operations = html.unescape(admin_client.get("/operations/", HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode())
    assert SPANISH in operations and "does not verify" not in operations
    assert ENGLISH in html.unescape(admin_client.get("/operations/", HTTP_ACCEPT_LANGUAGE="en", **HOST).content.decode())

    spanish = api.get(BASE, HTTP_ACCEPT_LANGUAGE="es").json()
    assert spanish["history"][0]["error"] == {"code": "preparation_required", "message": SPANISH}
    assert spanish["preparation"]["error"] == SPANISH
    english = api.get(BASE, HTTP_ACCEPT_LANGUAGE="en").json()
    assert english["history"][0]["error"] == {"code": "preparation_required", "message": ENGLISH}
    assert english["preparation"]["error"] == ENGLISH


@pytest.mark.django_db(transaction=True)
def test_a_backup_without_room_keeps_its_sizes_and_says_them_in_the_readers_language(
        admin_user, api, backup_dir, settings):
    settings.DISK_RESERVE_BYTES = 2**42
    enable(admin_user, choice="create")
    failed = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (failed.kind, failed.state, failed.error_code) == ("backup", "failed", "no_space")
    stored = json.loads(failed.error_message)
    assert stored["msgid"].startswith("There is not enough free disk space for the backup in %(folder)s")
    assert stored["params"]["reserve"] == {"bytes": 2**42}
    assert stored["params"]["folder"] == str(backup_dir)

    english = api.get(BASE, HTTP_ACCEPT_LANGUAGE="en").json()["history"][0]["error"]["message"]
    assert english.startswith(f"There is not enough free disk space for the backup in {backup_dir}:")
    assert "4.0\xa0TB kept free" in english
    spanish = api.get(BASE, HTTP_ACCEPT_LANGUAGE="es").json()
    message = spanish["history"][0]["error"]["message"]
    assert message.startswith(f"No hay espacio libre suficiente en el disco para la copia de seguridad en "
                              f"{backup_dir}:")
    assert english_in(message.replace(str(backup_dir), "").replace("LETHE_BACKUP_DIR", "")) == []
    assert "4,0\xa0TB" in message
    assert spanish["preparation"]["error"] == message


@pytest.mark.django_db(transaction=True)
def test_a_backup_folder_that_cannot_be_made_fails_naming_it_and_the_status_reads_on(
        admin_user, api, settings, tmp_path):
    """A backup folder under a file (NotADirectoryError for every user, root too): the backup
    fails with io_error naming the folder and the system's reason, not as an unexpected error,
    and the status, which lists that folder's backups, still reads."""
    (tmp_path / "afile").write_text("not a folder")
    folder = tmp_path / "afile" / "backups"
    settings.LETHE_BACKUP_DIR = str(folder)
    enable(admin_user, choice="create")
    failed = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (failed.kind, failed.state, failed.error_code) == ("backup", "failed", "io_error")
    stored = json.loads(failed.error_message)
    # The system's reason is kept as a message of its own (strerror is English prose).
    assert stored["params"] == {"folder": str(folder), "error": {"msgid": "a part of that path is not a folder",
                                                                "params": {}}}
    assert (tmp_path / "afile").read_text() == "not a folder"

    english = api.get(BASE, HTTP_ACCEPT_LANGUAGE="en")
    assert english.status_code == 200 and english.json()["backups"] == []
    message = english.json()["history"][0]["error"]["message"]
    assert message.startswith(
        f"The backup could not be written in {folder}: a part of that path is not a folder. Nothing was kept.")
    spanish = api.get(BASE, HTTP_ACCEPT_LANGUAGE="es").json()
    message = spanish["history"][0]["error"]["message"]
    assert message.startswith(f"No se pudo escribir la copia de seguridad en {folder}: una parte de esa ruta "
                              "no es una carpeta.")
    assert english_in(message.replace(str(folder), "").replace("LETHE_BACKUP_DIR", "")) == []
    assert spanish["preparation"]["error"] == message


def test_nested_messages_are_translated_at_every_level_and_read_back_as_stored():
    message = Message(OUTER, {"reason": Message(
        "The backup copy is damaged: %(error)s", {"error": Message(INNER)})})
    stored = message.stored()
    assert Message.from_json(json.loads(stored)) == message
    with translation.override("es"):
        assert said(stored) == ("La copia de seguridad hecha para esta limpieza no supera la verificación: La copia "
                                "de seguridad está dañada: El archivo de la copia de seguridad cambió después "
                                "de hacerse: su suma de comprobación ya no coincide.")
    assert said(stored) == OUTER % {"reason": "The backup copy is damaged: " + INNER}
    assert str(Size(2048)) == "2.0\xa0KB"


def test_sizes_of_a_refusal_for_lack_of_room_show_the_shortfall():
    """Rounded as usual while the rounded figures show that free < needed + reserve; every byte
    of each when they would read alike (1.0 MB needed, 1.0 MB free); kept so when stored."""
    mb = 1 << 20
    assert [str(size) for size in sizes_short(mb + 100, mb + 200, 0)] == [
        "1,048,676\xa0bytes", "1,048,776\xa0bytes", "0\xa0bytes"]
    assert [str(size) for size in sizes_short(mb - 100, mb, 0)] == ["1023.9\xa0KB", "1.0\xa0MB", "0\xa0bytes"]
    assert [str(size) for size in sizes_short(mb, mb // 2 + 10, mb // 2)] == [
        "1,048,576\xa0bytes", "524,298\xa0bytes", "524,288\xa0bytes"]
    assert [str(size) for size in sizes_short(mb, 2 * mb, 256 * mb)] == ["1.0\xa0MB", "2.0\xa0MB", "256.0\xa0MB"]
    message = Message("%(free)s free", {"free": sizes_short(mb + 100, mb + 200, 0)[0]})
    assert Message.from_json(json.loads(message.stored())) == message
    assert said(message.stored()) == "1,048,676\xa0bytes free"
    with translation.override("es"):
        assert str(Size(1_048_476, exact=True)) == "1\xa0048\xa0476\xa0bytes"
        assert str(Size(1, exact=True)) == "1\xa0byte"
    assert Message.from_json({"msgid": "%(free)s", "params": {"free": {"bytes": 5}}}).params["free"] == Size(5)


@pytest.mark.parametrize(("stored", "english", "spanish"), [
    ("", "", ""),
    # a msgid alone, as jobs stored it before and still store a message without details
    ("Cancelled. Removals committed before the cancel stay.",
     "Cancelled. Removals committed before the cancel stay.", "Cancelada. "),
    # text an earlier version stored with its details filled in: shown as stored
    (ENGLISH, ENGLISH, ENGLISH),
    ('{"not": "a stored message"}', '{"not": "a stored message"}', '{"not": "a stored message"}'),
    ('{"msgid": "x", "params": {"a": [1]}}', '{"msgid": "x", "params": {"a": [1]}}',
     '{"msgid": "x", "params": {"a": [1]}}'),
    ("{broken", "{broken", "{broken"),
])
def test_older_stored_messages_still_read(stored, english, spanish):
    assert said(stored) == english
    with translation.override("es"):
        assert said(stored).startswith(spanish)


@pytest.mark.django_db
def test_an_operation_stored_with_old_text_shows_it_on_both_pages(admin_client, api):
    ToolPayloadOperation.objects.create(kind="compact", state="failed", slot=None, error_code="internal",
                                        error_message="The disk said no: errno 28.")
    assert "The disk said no: errno 28." in admin_client.get("/operations/", HTTP_ACCEPT_LANGUAGE="es",
                                                               **HOST).content.decode()
    error = api.get(BASE, HTTP_ACCEPT_LANGUAGE="es").json()["history"][0]["error"]
    assert error == {"code": "internal", "message": "The disk said no: errno 28."}


@pytest.mark.parametrize(("number", "english", "spanish"), [
    (errno.EEXIST, "something else is already at that path", "ya hay otra cosa en esa ruta"),
    (errno.ENOTDIR, "a part of that path is not a folder", "una parte de esa ruta no es una carpeta"),
    (errno.EACCES, "permission denied", "permiso denegado"),
    (errno.ENOSPC, "no space is left on the disk", "no queda espacio en el disco"),
    (errno.EROFS, "the file system is read-only", "el sistema de archivos es de solo lectura"),
    (errno.ENOENT, "not found", "no se encuentra"),
    (errno.EISDIR, "that path is a folder", "esa ruta es una carpeta"),
    (errno.ENOTEMPTY, "the folder is not empty", "la carpeta no está vacía"),
    (errno.EIO, "the disk reported a read or write error", "el disco informó de un error de lectura o escritura"),
    (errno.EDQUOT, "the disk quota is used up", "se agotó la cuota de disco"),
    (errno.ELOOP, "a link is in the way (links are not followed)",
     "hay un enlace en el camino (los enlaces no se siguen)"),
    (errno.ENAMETOOLONG, "a name in that path is too long", "un nombre de esa ruta es demasiado largo"),
    (errno.EBUSY, "the file or folder is in use", "el archivo o la carpeta está en uso"),
    (errno.EMFILE, "too many files are open", "hay demasiados archivos abiertos"),
    (errno.EXDEV, "that path is on another disk", "esa ruta está en otro disco"),
    (errno.ENXIO, "ENXIO", "ENXIO"),  # no description of its own: the errno's name, never English prose
])
def test_an_os_error_is_said_in_the_readers_language(number, english, spanish):
    reason = os_reason(OSError(number, os.strerror(number)))
    assert str(reason) == english
    with translation.override("es"):
        assert str(reason) == spanish
