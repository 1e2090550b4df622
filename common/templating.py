"""The console's template engine: Django's, whose pages never fail on text UTF-8 cannot carry.

A string stored before input was checked (`common.text`) may hold a lone
surrogate; rendered into a page it made encoding the response fail, a 500
for everyone who opened that page. Pages show U+FFFD in its place instead.
"""

from __future__ import annotations

from typing import Any

from django.template.backends.django import DjangoTemplates, Template, reraise
from django.template.exceptions import TemplateDoesNotExist
from django.utils.safestring import SafeString, mark_safe

from common.text import replace_unencodable


class _TextSafeTemplate(Template):
    def render(self, context: Any = None, request: Any = None) -> SafeString:
        # The page is already escaped; replacing lone surrogates cannot make it unsafe.
        return mark_safe(replace_unencodable(super().render(context, request)))  # noqa: S308


class TextSafeTemplates(DjangoTemplates):
    """DjangoTemplates whose rendered pages have any lone surrogate replaced by U+FFFD."""

    def from_string(self, template_code: str) -> Template:
        return _TextSafeTemplate(self.engine.from_string(template_code), self)

    def get_template(self, template_name: str) -> Template:
        try:
            return _TextSafeTemplate(self.engine.get_template(template_name), self)
        except TemplateDoesNotExist as exc:
            reraise(exc, self)
            raise  # reraise always raises; this tells mypy so
