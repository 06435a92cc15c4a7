"""Console-wide endpoints: the published API schema."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from pydantic import BaseModel, ConfigDict

from console.api import cached_openapi_document, endpoint


class OpenApiOut(BaseModel):
    model_config = ConfigDict(extra="allow", title="OpenApiDocument")

    openapi: str
    info: dict
    paths: dict


@endpoint("GET", "/v1/openapi.json", response=OpenApiOut, public=True, name="api-openapi",
          summary="The OpenAPI 3.1 description of every /v1/ and /api/v1/ endpoint")
def openapi(request: HttpRequest) -> HttpResponse:
    return HttpResponse(cached_openapi_document(), content_type="application/json")
