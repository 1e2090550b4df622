"""The shapes of usage reports and prices in the API."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from accounting.choices import Resource
from accounting.export import measures, report_rows
from accounting.models import Price
from accounting.selectors import Report


class MeasuresSerializer(serializers.Serializer):
    """What a group used: hours to the microhour, utilization in percent (null without a reading), money to the cent."""

    gpu_hours = serializers.DecimalField(max_digits=20, decimal_places=6, coerce_to_string=False)
    cpu_hours = serializers.DecimalField(max_digits=20, decimal_places=6, coerce_to_string=False)
    memory_gib_hours = serializers.DecimalField(max_digits=20, decimal_places=6, coerce_to_string=False)
    utilization_percent = serializers.DecimalField(
        max_digits=5, decimal_places=1, allow_null=True, coerce_to_string=False
    )
    sampled_gpu_hours = serializers.DecimalField(max_digits=20, decimal_places=6, coerce_to_string=False)
    idle_gpu_hours = serializers.DecimalField(max_digits=20, decimal_places=6, coerce_to_string=False)
    cost = serializers.DecimalField(max_digits=20, decimal_places=2)
    idle_cost = serializers.DecimalField(max_digits=20, decimal_places=2)


class ReportRowSerializer(MeasuresSerializer):
    """One group: `key` names it by dimension (`{"project": "alpha", "user": "ana"}`), `period_start` its bucket."""

    key = serializers.DictField(child=serializers.CharField())
    period_start = serializers.DateTimeField(required=False)


class PeriodSerializer(serializers.Serializer):
    name = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(help_text="Exclusive.")


class ReportSerializer(serializers.Serializer):
    """A usage report: the period, the grouping, rows (per bucket when `bucket` is set) and their total."""

    period = PeriodSerializer()
    group_by = serializers.ListField(child=serializers.CharField())
    bucket = serializers.CharField(allow_blank=True)
    currency = serializers.CharField()
    rows = ReportRowSerializer(many=True)
    total = MeasuresSerializer()


def report_data(report: Report) -> dict[str, Any]:
    """Return `report` in the API's shape: each row's dimensions under `key`, its measures beside."""
    rows = []
    for row in report_rows(report):
        item = {name: row.pop(name) for name in [*report.group_by, *(["period_start"] if report.bucket else [])]}
        start = item.pop("period_start", None)
        rows.append({"key": item, **({"period_start": start} if start else {}), **row})
    period = {"name": report.period.name, "start": report.period.start, "end": report.period.end}
    return ReportSerializer(
        {
            "period": period,
            "group_by": list(report.group_by),
            "bucket": report.bucket,
            "currency": report.currency,
            "rows": rows,
            "total": measures(report.total),
        }
    ).data


class PriceSerializer(serializers.ModelSerializer):
    pool: serializers.SlugRelatedField[Price] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True, help_text="Null: the price of every pool."
    )
    in_effect = serializers.SerializerMethodField()

    class Meta:
        model = Price
        fields = ["id", "resource", "pool", "gpu_model", "amount_per_hour", "effective_from", "in_effect", "created_at"]
        read_only_fields = fields

    def get_in_effect(self, price: Price) -> bool:
        """Whether its date has come (it may since have been followed by a newer price of the same key)."""
        return bool(price.effective_from <= self.context["now"])


class PriceCreateSerializer(serializers.Serializer):
    """A new price: `pool` by name (empty for every pool), `gpu_model` for GPU prices only, from now by default."""

    resource = serializers.ChoiceField(choices=Resource.choices)
    amount_per_hour = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0)
    pool = serializers.CharField(required=False, allow_blank=True, default="")
    gpu_model = serializers.CharField(required=False, allow_blank=True, default="", max_length=100)
    effective_from = serializers.DateTimeField(required=False, allow_null=True, default=None)
