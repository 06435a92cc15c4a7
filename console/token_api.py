"""API tokens through the API: the list Settings > API tokens shows (admins every user's,
members their own) and Revoke (admins). A token is never made through the API: a token that
could make another would outlive its own revocation (console.auth); Settings > API tokens or
`manage.py create_api_token` make them."""

from __future__ import annotations

from typing import Annotated, Literal

from django.http import HttpRequest
from django.shortcuts import get_object_or_404
from pydantic import Field

from console.api import QuerySchema, Schema, endpoint
from console.models import ApiToken, TokenState
from console.token_views import visible_tokens
from console.tokens import revoke_token
from lifecycle.api import DEFAULT_LIMIT, Limit, cursor_of_another_list
from lifecycle.paging import InvalidCursor, encode_token, token_fields, token_pk
from lifecycle.serializers import iso


class TokenOut(Schema):
    id: int
    name: str
    prefix: str = Field(description="The token's first characters, as the screens show it (the token itself is "
                                    "never shown again).")
    user: str = Field(description="The username of the user it acts as.")
    state: Literal[tuple(TokenState.values)]  # type: ignore[valid-type]
    created_at: str
    last_used_at: str | None = Field(description="To the minute.")
    expires_at: str
    revoked_at: str | None


class TokenPageOut(Schema):
    results: list[TokenOut]
    next: str | None = Field(description="The `cursor` of the next page; null on the last.")


class TokensQuery(QuerySchema):
    error_codes = {"limit": "invalid_limit", "cursor": "invalid_cursor"}

    limit: Limit = DEFAULT_LIMIT
    cursor: Annotated[str, Field(max_length=200, description="The `next` of the previous page.")] | None = None


def token_json(token: ApiToken) -> dict:
    return {"id": token.pk, "name": token.name, "prefix": token.prefix, "user": token.user.get_username(),
            "state": token.state().value, "created_at": iso(token.created_at), "last_used_at": iso(token.last_used_at),
            "expires_at": iso(token.expires_at), "revoked_at": iso(token.revoked_at)}


@endpoint("GET", "/api/v1/tokens", query=TokensQuery, response=TokenPageOut, name="api-tokens-list",
          summary="API tokens: every user's to admins, a member's own (Settings > API tokens)",
          description="Newest first, in pages of up to `limit`; a token made meanwhile is on the first page, never "
                      "on a later one. Tokens are made on Settings > API tokens or with manage.py create_api_token, "
                      "never through the API.")
def token_list(request: HttpRequest, query: TokensQuery) -> dict:
    rows = visible_tokens(request.user).order_by("-pk")
    if query.cursor:
        try:
            version, place = token_fields(query.cursor, 2)
            if version != "k1":
                raise InvalidCursor(query.cursor)
            rows = rows.filter(pk__lt=token_pk(place))
        except InvalidCursor:
            raise cursor_of_another_list() from None
    found = list(rows[: query.limit + 1])
    more, found = len(found) > query.limit, found[: query.limit]
    return {"results": [token_json(t) for t in found],
            "next": encode_token("k1", str(found[-1].pk)) if more else None}


@endpoint("DELETE", "/api/v1/tokens/{token_id}", response=TokenOut, admin=True, name="api-token-revoke",
          summary="Revoke an API token now (admins)",
          description="Requests that send it are refused from now on. Revoking one already revoked changes nothing "
                      "and answers it as it is. The token sending this request may revoke itself.")
def token_revoke(request: HttpRequest, token_id: int) -> dict:
    token = get_object_or_404(ApiToken.objects.select_related("user"), pk=token_id)
    revoke_token(token, acting_user=request.user)
    token.refresh_from_db()
    return token_json(token)
