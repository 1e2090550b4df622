"""Pagination shared by every list endpoint."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    """Page-number pagination: `?page=N&page_size=M`, at most 500 items a page."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
