"""The remote engine's name is resolved within the connect timeout: a resolver that does not
answer (a DNS server down: seconds per try, per server, per attempt) holds no call, no web
request and no job past ENGINE_CONNECT_TIMEOUT and the call's deadline; hung lookups hold at
most MAX_RESOLVING threads per name; HTTPS still checks the certificate against the host name.

The resolver is the one part made up here (socket.getaddrinfo replaced: a name hangs, or maps to
127.0.0.1); the engine is a real server on a loopback port, over real sockets, with real
timeouts, and a real TLS handshake against certificates made with the openssl command."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter

import pytest
from django.test import Client

from console.models import ApiToken
from lifecycle.engine.http import MAX_RESOLVING, EngineUnreachable, HttpEngine
from tests import factories
from tests.scripted_engine import scripted_engine

OP = "op_" + "1" * 20
ANSWER = {"id": OP, "target": "c_" + "a" * 20, "state": "pending", "code": None}
ROUTES = {("GET", "/v1/operations/"): lambda h: (200, ANSWER)}
SYSTEM_GETADDRINFO = socket.getaddrinfo
HUNG = "hung"
# A hung lookup answers after this long, so that without a bounded resolution a call ends (late,
# and reaching the engine) instead of hanging the run.
HELD = 10
TIMED_OUT = "name resolution timed out"
TOO_MANY = "name resolution: too many lookups under way"


class Resolver:
    """socket.getaddrinfo as these tests have it: a name mapped to HUNG waits until released
    (at most HELD seconds) then answers 127.0.0.1; a name mapped to an address answers that
    address; anything else is asked of the system. Every name asked is kept, in order."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.asked: list[str] = []
        self.released = threading.Event()

    def __call__(self, host, port, *args, **kwargs):
        self.asked.append(host)
        address = self.names.get(host, host)
        if address == HUNG:
            self.released.wait(HELD)
            address = "127.0.0.1"
        return SYSTEM_GETADDRINFO(address, port, *args, **kwargs)


def lookups() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "engine-resolve" and t.is_alive()]


@pytest.fixture
def resolver(monkeypatch):
    made = Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", made)
    yield made
    made.released.set()  # the hung lookups end, and leave their places to the next tests
    for thread in lookups():
        thread.join(HELD)


def at(url: str, name: str) -> str:
    """The scripted engine's URL with its host given by name."""
    return url.replace("127.0.0.1", name)


def unreachable(engine: HttpEngine):
    """The EngineUnreachable an operation call raises, and the seconds it took to."""
    started = time.monotonic()
    with pytest.raises(EngineUnreachable) as caught:
        engine.operation(OP)
    return caught, time.monotonic() - started


# ---- the client ------------------------------------------------------------------------------


def test_a_name_that_does_not_resolve_in_time_is_unreachable_within_the_connect_timeout(resolver):
    resolver.names["engine.test"] = HUNG
    with scripted_engine(ROUTES) as (url, seen):
        engine = HttpEngine(at(url, "engine.test"), "t", connect_timeout=1, read_timeout=2, retries=0)
        caught, took = unreachable(engine)
        assert took < 1 + 2  # the connect timeout, and room for a loaded machine
        assert (caught.value.code, caught.value.status, caught.value.detail) == ("engine_unreachable", 503, TIMED_OUT)
        assert seen == []  # no connection was made
        # Once the name resolves, the same client reaches the engine; it asks each call anew.
        resolver.names["engine.test"] = "127.0.0.1"
        assert engine.operation(OP).id == OP
        assert engine.operation(OP).id == OP
    assert resolver.asked == ["engine.test"] * 3
    assert len(seen) == 2


def test_a_call_whose_retries_all_meet_a_hung_resolver_ends_within_its_deadline(resolver):
    resolver.names["engine.test"] = HUNG
    with scripted_engine(ROUTES) as (url, seen):
        engine = HttpEngine(at(url, "engine.test"), "t", connect_timeout=0.5, read_timeout=1, retries=5)
        caught, took = unreachable(engine)
    assert caught.value.detail == TIMED_OUT
    assert took < 0.5 + 2 * 1 + 1  # the call's deadline, and room for a loaded machine
    assert 2 <= resolver.asked.count("engine.test") <= 6  # retried, as a refused connection is
    assert seen == []


def test_hung_lookups_hold_at_most_max_resolving_threads_and_the_others_are_refused_at_once(resolver):
    resolver.names["engine.test"] = HUNG
    outcomes: list[tuple[str, float]] = []
    with scripted_engine(ROUTES) as (url, seen):
        engine = HttpEngine(at(url, "engine.test"), "t", connect_timeout=1.5, read_timeout=2, retries=0)

        def ask() -> None:
            started = time.monotonic()
            try:
                engine.operation(OP)
            except EngineUnreachable as exc:
                outcomes.append((exc.detail, time.monotonic() - started))

        callers = [threading.Thread(target=ask) for _ in range(3 * MAX_RESOLVING)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(HELD + 5)
        assert len(lookups()) == MAX_RESOLVING  # the given-up lookups, still hung: no more
        assert Counter(detail for detail, _took in outcomes) == {TIMED_OUT: MAX_RESOLVING, TOO_MANY: 2 * MAX_RESOLVING}
        assert all(took < 1.5 + 2 for _detail, took in outcomes)
        # An engine named by its address asks no resolver: reached while the lookups are hung;
        # and another engine's name has places of its own (the cap is per name).
        assert HttpEngine(url, "t", connect_timeout=1.5, read_timeout=2, retries=0).operation(OP).id == OP
        resolver.names["other.test"] = "127.0.0.1"
        assert HttpEngine(at(url, "other.test"), "t", connect_timeout=1.5, read_timeout=2,
                          retries=0).operation(OP).id == OP
        assert len(seen) == 2
        # Once the resolver answers, the lookups end and their places are free again.
        resolver.released.set()
        for thread in lookups():
            thread.join(HELD)
        assert lookups() == []
        resolver.names["engine.test"] = "127.0.0.1"
        assert engine.operation(OP).id == OP
    assert len(seen) == 3


# ---- web requests through the engine ---------------------------------------------------------


@pytest.mark.django_db
def test_a_console_page_and_an_api_call_answer_unreachable_instead_of_waiting_for_the_resolver(settings, resolver):
    resolver.names["engine.test"] = HUNG
    with scripted_engine(ROUTES) as (url, seen):
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = at(url, "engine.test"), "t" * 40, 0
        settings.ENGINE_CONNECT_TIMEOUT, settings.ENGINE_READ_TIMEOUT = 1, 2
        admin = factories.make_user("adm", admin=True)
        client = Client(raise_request_exception=False)
        client.force_login(admin)
        conversation = factories.make_conversation(title="Here")
        started = time.monotonic()
        page = client.get(f"/conversations/{conversation.public_id}/delete/", HTTP_HOST="127.0.0.1")
        page_took = time.monotonic() - started
        _token, raw = ApiToken.issue(admin)
        started = time.monotonic()
        answer = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
            "/api/v1/bindings-sync", HTTP_HOST="127.0.0.1", content_type="application/json")
        answer_took = time.monotonic() - started
    assert page.status_code == 503 and "The engine cannot be reached" in page.content.decode()
    assert answer.status_code == 503 and answer.json()["code"] == "engine_unreachable"
    assert page_took < 1 + 2 and answer_took < 1 + 2
    assert seen == []


# ---- HTTPS: the certificate is checked against the name --------------------------------------


@pytest.fixture
def certificates(tmp_path):
    """make(name, san) -> a server TLS context with a certificate for `san` ("DNS:localhost",
    "IP:127.0.0.1"), signed by a CA the client trusts (SSL_CERT_FILE), and the server names it
    was asked for (SNI)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command makes these tests' certificates")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=tmp_path, check=True, capture_output=True, timeout=60)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Lethe test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def make(name: str, san: str) -> tuple[ssl.SSLContext, list]:
        (tmp_path / f"{name}.ext").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
        run("req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / f"{name}.pem", tmp_path / f"{name}.key")
        asked: list = []
        context.sni_callback = lambda _sock, server_name, _context: asked.append(server_name)
        return context, asked

    return make, tmp_path / "ca.pem"


@pytest.mark.parametrize(("san", "reached"), [("DNS:localhost", True), ("DNS:other.test", False),
                                              ("IP:127.0.0.1", False)])
def test_an_https_engine_reached_by_name_has_its_certificate_checked_against_that_name(
        resolver, certificates, monkeypatch, san, reached):
    """localhost resolved (here, to 127.0.0.1) and connected to by address: the handshake names
    localhost (SNI), and a certificate for another name, or only for the address, is refused."""
    make, authority = certificates
    monkeypatch.setenv("SSL_CERT_FILE", str(authority))  # the client trusts the test CA, and no other
    resolver.names["localhost"] = "127.0.0.1"
    context, server_names = make("engine", san)
    with scripted_engine(ROUTES, tls=context) as (url, seen):
        engine = HttpEngine(at(url, "localhost"), "t", connect_timeout=2, read_timeout=2, retries=0)
        if reached:
            assert engine.operation(OP).id == OP
        else:
            with pytest.raises(EngineUnreachable) as caught:
                engine.operation(OP)
            assert caught.value.detail == "SSLCertVerificationError"
    assert resolver.asked == ["localhost"]
    assert server_names == ["localhost"]
    assert len(seen) == (1 if reached else 0)
