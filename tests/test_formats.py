"""Dates on the screens read one way in every country."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.template import Context, Template
from django.utils import translation

MOMENT = datetime(2026, 2, 12, 18, 5, tzinfo=UTC)


@pytest.mark.parametrize(("language", "short_date", "short_datetime"), [
    ("en", "Feb. 12, 2026", "Feb. 12, 2026, 6:05 p.m."),  # not 02/12/2026, which reads as 2 December abroad
    ("es", "12/02/2026", "12/02/2026 18:05"),
])
def test_short_dates_name_the_month_in_english_and_stay_day_first_in_spanish(language, short_date, short_datetime):
    template = Template('{{ at|date:"SHORT_DATE_FORMAT" }}|{{ at|date:"SHORT_DATETIME_FORMAT" }}')
    with translation.override(language):
        assert template.render(Context({"at": MOMENT})) == f"{short_date}|{short_datetime}"
