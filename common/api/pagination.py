"""Pagination shared by every list endpoint."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

# Far beyond any real list, and within what every database and paginator computes with.
MAX_PAGE = 10**9


class Pagination(PageNumberPagination):
    """Page-number pagination: `?page=N&page_size=M`, at most 500 items a page.

    Both parameters are validated, not ignored: a page or page size that is
    not a whole number in range is a 400 naming it (a page past the last
    one is a 404, as there is nothing there).
    """

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        _bounded(request, self.page_query_param, 1, MAX_PAGE)
        return super().paginate_queryset(queryset, request, view)

    def get_page_size(self, request: Request) -> int:
        chosen = _bounded(request, self.page_size_query_param, 1, self.max_page_size)
        return self.page_size if chosen is None else chosen

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        bounds = {self.page_query_param: MAX_PAGE, self.page_size_query_param: self.max_page_size}
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] in bounds:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": bounds[parameter["name"]]}
        return parameters


def _bounded(request: Request, name: str, lowest: int, highest: int) -> int | None:
    """Return query parameter `name` as an int in [lowest, highest]; None when absent; 400 otherwise."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or not lowest <= int(raw) <= highest:
        raise ValidationError({name: [f"Must be a whole number from {lowest} to {highest}."]}, code="out_of_range")
    return int(raw)
