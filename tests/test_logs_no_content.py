"""Logs never hold conversation content.

A unique marker goes into a conversation's title, a message and a tool item's title and
payload. Then every URL pattern is requested with every method, as nobody, a member, an
admin and an admin's API token, with the marker in query strings and bodies (API bodies
built from each endpoint's declared schema, forms filled from the pages that show them);
every job queued meanwhile and every scheduled job runs. Everything logged, at DEBUG, goes
through the production filter and JSON formatter, and must not contain the marker.

URL patterns, endpoint bodies and schedules are read from the project itself, so new ones
are covered without touching this test. A new kind of URL parameter makes it fail until a
value for it is added to `path_values`.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from html.parser import HTMLParser
from importlib import import_module

import pytest
from django.apps import apps
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django_q.models import OrmQ, Schedule
from django_q.signing import SignedPackage
from django_q.tasks import async_task
from pydantic import BaseModel

from console.api import ENDPOINTS, is_api_path
from console.models import ApiToken
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.fleet import put_row
from ops.logs import JsonFormatter
from tests import factories
from tests.test_logs import Captured

MARKER = "zqmark" + uuid.uuid4().hex[:12]
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
ROUTE_PARAM = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")
# re_path patterns, by URL name or view: a concrete address for each.
REGEX_ADDRESSES = {"console.api.not_found": ["v1/nothing-here", "api/v1/nothing-here"]}
# Forms whose fields are not conversation content (the sign-in form takes a username).
FORMS_LEFT_AS_THEY_ARE = {"/accounts/login/"}


def url_patterns() -> list[tuple[str, str]]:
    """(name, pattern) of every URL the project answers."""
    found: list[tuple[str, str]] = []

    def walk(patterns, prefix: str) -> None:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                found.append((entry.name or entry.lookup_str, prefix + str(entry.pattern)))

    walk(get_resolver().url_patterns, "")
    return found


def addresses(values: dict[str, str]) -> list[tuple[str, str]]:
    out = []
    for name, pattern in url_patterns():
        if pattern.startswith("^"):
            assert name in REGEX_ADDRESSES, f"add a concrete address for the re_path {name} ({pattern})"
            out += [(name, "/" + address) for address in REGEX_ADDRESSES[name]]
            continue
        missing = [m["name"] for m in ROUTE_PARAM.finditer(pattern) if m["name"] not in values]
        assert not missing, f"teach path_values a value for <{missing[0]}> (in {pattern})"
        out.append((name, "/" + ROUTE_PARAM.sub(lambda m: values[m["name"]], pattern)))
    return out


def sample(schema: dict, defs: dict):
    """A value for a JSON schema (pydantic's), with the marker wherever text goes."""
    if "$ref" in schema:
        return sample(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return next((v for v in schema["enum"] if v != ""), schema["enum"][0])
    if "anyOf" in schema:
        return sample(next(s for s in schema["anyOf"] if s.get("type") != "null"), defs)
    kind = schema.get("type")
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return max(1, schema.get("minimum", 1))
    if kind == "array":
        return [sample(schema.get("items", {}), defs)]
    if kind == "object":
        properties = schema.get("properties")
        if not properties:
            return {"stdout": MARKER, "command": MARKER}
        return {name: sample(sub, defs) for name, sub in properties.items() if name in schema.get("required", [])}
    return MARKER


def sample_bodies(model: type[BaseModel] | None) -> list[dict]:
    """The marker in every field; required and text fields only; required plus each one."""
    if model is None:
        return [{"title": MARKER, "content": MARKER}]
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    fields = {name: sample(sub, defs) for name, sub in schema.get("properties", {}).items()}
    required = {name: fields[name] for name in schema.get("required", [])}
    texty = {name: value for name, value in fields.items() if value == MARKER}
    bodies = [fields, {**required, **texty}]
    bodies += [{**required, name: value} for name, value in fields.items() if name not in required]
    return bodies


class Forms(HTMLParser):
    """The forms on a page: method, action and the fields a person would fill in."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict] = []
        self._select: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.forms.append({"method": (attrs.get("method") or "get").upper(), "action": attrs.get("action") or "",
                               "data": {}})
        elif not self.forms or not attrs.get("name"):
            return
        elif tag == "input":
            kind, name = attrs.get("type", "text"), attrs["name"]
            if kind == "hidden":
                self.forms[-1]["data"][name] = attrs.get("value", "")
            elif kind in ("checkbox", "radio"):
                self.forms[-1]["data"].setdefault(name, attrs.get("value", "on"))
            else:
                self.forms[-1]["data"][name] = MARKER
        elif tag == "textarea":
            self.forms[-1]["data"][attrs["name"]] = MARKER
        elif tag == "select":
            self._select = attrs["name"]
        if tag == "option" and self._select:
            self.forms[-1]["data"].setdefault(self._select, attrs.get("value", ""))

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None


@pytest.fixture
def captured_all():
    capture = Captured(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(capture.handler)
    root.setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        root.removeHandler(capture.handler)
        root.setLevel(level)


@pytest.mark.django_db
def test_it_never_logs_conversation_content(captured_all):
    admin = factories.make_user("ada", admin=True)
    member = factories.make_user("mel", admin=False)
    conversation = factories.make_conversation(title=f"Plan {MARKER}")
    factories.add_message(conversation, content=f"please keep {MARKER} safe")
    tool = factories.add_tool(conversation, title=f"Run {MARKER}",
                              payload={"command": f"grep {MARKER}", "cwd": "/w", "exit_code": 0,
                                       "stdout": MARKER * 50, "stderr": ""})
    _token, raw = ApiToken.issue(admin, name="for the log test")
    spare, _raw = ApiToken.issue(admin, name="spare")
    # A second marked conversation with a delete under way: its erasure runs with the jobs
    # below, and its operation id and a legacy subagent row give the remaining addresses.
    doomed = factories.make_conversation(title=f"Doomed {MARKER}")
    factories.add_message(doomed, content=f"erase {MARKER} too")
    operation = request_deletion(doomed, key=f"log-test-{uuid.uuid4()}", acting_user=admin)
    put_row({"agent_id": "sa_logtest", "origin": None, "legacy": True, "status": "completed",
             "delivery": "settled", "prompt": f"do {MARKER}", "result": MARKER})
    # A conversation bound on a remote engine (none is configured here), and a delete of it.
    from remote.models import BoundDelete, EngineBinding

    binding = EngineBinding.objects.create(engine_id="c_" + "d" * 20, owner_kind="account", owner_id=1,
                                           scope="bound", thread_id="t-log", title=f"Bound {MARKER}")
    bound = BoundDelete.objects.create(key=f"log-bound-{uuid.uuid4()}", binding_ref=binding.public_id,
                                       engine_id=binding.engine_id, owner_kind="account", owner_id=1, scope="bound",
                                       thread_id="t-log", state="unavailable", code="engine_not_configured")
    path_values = {"public_id": conversation.public_id, "item_id": str(tool.pk), "token_id": str(spare.pk),
                   "operation_id": operation.public_id, "agent_id": "sa_logtest",
                   "binding_id": binding.public_id, "delete_id": bound.public_id}

    def client_for(who: str) -> Client:
        client = Client(HTTP_HOST="127.0.0.1")
        if who in ("member", "admin"):
            client.force_login(member if who == "member" else admin)
        if who == "token":
            client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {raw}"
        return client

    # Every scheduled job first (the heartbeat makes /readyz answer 200).
    functions = set(Schedule.objects.values_list("func", flat=True))
    for config in apps.get_app_configs():
        try:
            module = import_module(f"{config.name}.schedules")
        except ModuleNotFoundError:
            continue
        functions |= {spec["func"] for spec in getattr(module, "SCHEDULES", {}).values()}
    assert "ops.tasks.heartbeat" in functions and len(functions) >= 2  # every app's schedules are found
    for func in sorted(functions):
        async_task(func, sync=True)
    operation.refresh_from_db()
    assert operation.state == "completed"  # the recovery job erased the marked conversation

    targets = addresses(path_values)  # loads the URLconf, which registers the endpoints
    # An address's URL name is that of the first endpoint declared on its path.
    url_name = {}
    for ep in ENDPOINTS:
        url_name.setdefault(ep.path, ep.name)
    endpoint_at = {(url_name[ep.path], ep.method): ep for ep in ENDPOINTS}
    sent: list = []  # every response
    reached: set[str] = set()  # URL names that answered at least once without an error
    written: set[tuple[str, str]] = set()
    pages = []

    def drive(method: str) -> None:
        for name, address in targets:
            api = is_api_path(address)
            for who in ("anonymous", "member", "admin", "token"):
                client = client_for(who)
                headers = {"HTTP_IDEMPOTENCY_KEY": str(uuid.uuid4())}
                if method in ("GET", "HEAD"):
                    for query in ("", f"?q={MARKER}"):
                        response = client.generic(method, address + query, **headers)
                        sent.append(response)
                        if who == "admin" and method == "GET" and response.status_code == 200 and not api:
                            pages.append(response.content.decode())
                        if response.status_code < 400:
                            reached.add(name)
                elif api:
                    ep = endpoint_at.get((name, method))
                    for body in sample_bodies(ep.body if ep else None):
                        response = client.generic(method, address, json.dumps(body),
                                                  content_type="application/json", **headers)
                        sent.append(response)
                        # Past validation: done, or valid but refused here (unknown id, wrong state).
                        if (response.status_code < 300 or response.status_code in (404, 409, 410)) and ep:
                            written.add((ep.path, ep.method))
                            reached.add(name)
                else:
                    data = "&".join(f"{k}={MARKER}" for k in ("title", "content", "q", "name"))
                    response = client.generic(method, address, data,
                                              content_type="application/x-www-form-urlencoded", **headers)
                    sent.append(response)
                    if response.status_code < 400:
                        reached.add(name)

    def fill_forms() -> None:
        for page in pages:
            parser = Forms()
            parser.feed(page)
            for form in parser.forms:
                if form["action"] in FORMS_LEFT_AS_THEY_ARE:
                    continue
                client = client_for("admin")
                if form["method"] == "GET":
                    sent.append(client.get(form["action"] or "/", form["data"]))
                else:
                    sent.append(client.post(form["action"], form["data"]))

    # Method by method over every address, deletes last: a delete of the marked conversation
    # must not keep the writes before it from going through.
    for method in METHODS[:-1]:
        drive(method)
    fill_forms()
    drive("DELETE")

    # Every page, and every endpoint address with a GET or a body, answered without an error at
    # least once, and every endpoint that takes a body accepted one of its sample bodies (done,
    # or valid and refused in this state): the content really went through them. Body-less
    # actions, such as a cancel with nothing to cancel, may rightly refuse; they were driven.
    actions_only = {name for name, address in targets
                    if is_api_path(address) and name not in {url_name[ep.path] for ep in ENDPOINTS
                                                             if ep.method == "GET" or ep.body is not None}}
    assert {name for name, _address in targets} - actions_only - reached == set()
    for ep in ENDPOINTS:
        if ep.body is not None:
            assert (ep.path, ep.method) in written, f"no sample body of {ep.method} {ep.path} got past validation"

    # Then whatever the requests queued, until the queue is empty. A job already run with the
    # same arguments is not run again: every synchronous run starts a worker, and every worker
    # start queues the startup recoveries once more (thousands of identical runs otherwise).
    ran: dict[str, str] = {}  # each distinct call, with its function
    for _round in range(10):
        queued = list(OrmQ.objects.all())
        if not queued:
            break
        for row in queued:
            task = SignedPackage.loads(row.payload)
            row.delete()
            call = repr((task["func"], task["args"], sorted(task["kwargs"].items())))
            if call not in ran:
                ran[call] = task["func"]
                async_task(task["func"], *task["args"], sync=True, **task["kwargs"])
    assert not OrmQ.objects.exists()
    assert {"lifecycle.tasks.startup", "retention.jobs.startup", "remote.tasks.sweep"} <= set(ran.values())

    lines = captured_all.lines()
    # One access line per request, by its id (passing health probes are counted, not logged).
    logged = {line["request_id"] for line in lines if line["logger"] == "lethe.request"}
    probes = {r["X-Request-ID"] for r in sent if r.wsgi_request.path in ("/healthz", "/readyz") and r.status_code < 400}
    assert logged == {r["X-Request-ID"] for r in sent} - probes
    finished = {line["job"] for line in lines if line["logger"] == "lethe.jobs"}
    assert functions <= finished
    assert MARKER not in captured_all.text


@pytest.mark.django_db
def test_a_file_the_storage_measures_cannot_read_is_logged_without_its_name(captured_all, monkeypatch, engine_home):
    """A file of a conversation's folder that cannot be read (an EACCES on lstat, made here: the
    tests run as root) is logged by its error code: its path names an artifact the user named."""
    import errno
    import os

    from insight.tasks import measure_storage
    from lifecycle import enginefs
    from lifecycle.actions.write_artifact import write_artifact
    from retention.tasks import measure_engine_folder

    conversation = factories.make_conversation(title="Names")
    secret = f"offer-{MARKER}.txt"
    write_artifact(conversation, name=secret, data=b"x")
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        if str(path).endswith(secret):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(enginefs.os, "lstat", lstat)
    measure_engine_folder()
    measure_storage()
    logged = captured_all.text
    assert "could not be read" in logged and "engine folder not measured: PermissionError (EACCES)" in logged
    assert MARKER not in logged
