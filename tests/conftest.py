from __future__ import annotations

import pytest
from django.test import Client

from tests import factories


@pytest.fixture(autouse=True)
def engine_home(settings, tmp_path):
    """Every test gets its own real engine folder."""
    settings.ENGINE_HOME = tmp_path / "engine"
    settings.ENGINE_HOME.mkdir()
    return settings.ENGINE_HOME


@pytest.fixture
def admin_user(db):
    return factories.make_user("alice", admin=True)


@pytest.fixture
def member_user(db):
    return factories.make_user("bob", admin=False)


@pytest.fixture
def admin_client(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def member_client(member_user) -> Client:
    client = Client()
    client.force_login(member_user)
    return client


@pytest.fixture
def conversation(db):
    return factories.make_conversation(title="Fix flaky login test")
