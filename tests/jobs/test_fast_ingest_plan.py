"""The submission ingest cannot accept what the API would refuse: it is derived from the API
(`jobs.api.fast_ingest_plan`).

- Generated equivalence: for every writable field of the item serializer, as
  the field itself describes it (type, bounds, lengths, choices, null), values
  at and past each limit and of every wrong JSON type go once through the
  ingest and once straight to Django: the same status, body and headers. The
  list grows by itself with the serializer; nothing here is written case by
  case.
- A rule added to the serializer tomorrow holds on the fast path at once:
  a field validator is run by the ingest itself (a refused value goes to
  Django, which refuses it); a `validate_<field>` method, a serializer-level
  validator or an unknown middleware is found at start-up and the ingest
  defers (the field's items, or everything) to Django.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework import serializers

from common.api.fields import Integer
from gpucloud.asgi import django_asgi_app
from jobs.api.fast_ingest import SubmissionIngest
from jobs.api.fast_ingest_plan import build_plan
from jobs.api.serializers import BulkInputSerializer, CommandField, WorkloadInputSerializer, WorkloadItemSerializer
from tests.conftest import World
from tests.jobs.test_fast_ingest import (
    BULK,
    Call,
    Headers,
    assert_same_answers,
    both_ways,
    bulk,
    counts,
    credentials,
    ingest_on,
    item,
    job,
    one_by_one,
    ready,
)

__all__ = ["credentials", "ingest_on", "ready"]  # fixtures, used by name (ingest_on: autouse)

pytestmark = pytest.mark.django_db(transaction=True)

_MISSING = object()


def _values(field: serializers.Field) -> Iterator[tuple[str, Any]]:
    """Yield (label, value) probing `field` at its limits and with every wrong JSON type, read from the field."""
    yield "null", None
    if isinstance(field, serializers.ChoiceField):
        first = next(iter(field.choices))
        yield from (("a choice", str(first)), ("no choice", "no-such-choice"), ("a number", 1), ("a list", [first]))
    elif isinstance(field, serializers.CharField):
        longest = field.max_length or 80
        yield from (("empty", ""), ("spaced", " ab "), ("at max_length", "a" * longest))
        yield from (("past max_length", "a" * (longest + 1)), ("a number", 0), ("a NUL", "a\x00b"), ("a list", ["a"]))
    elif isinstance(field, serializers.IntegerField):  # noqa: TID251 -- any integer field, bounded or not
        lowest, highest = int(field.min_value or 0), int(field.max_value or 2**31 - 1)
        yield from (("at min_value", lowest), ("below min_value", lowest - 1), ("at max_value", highest))
        yield from (("past max_value", highest + 1), ("a string", "1"), ("a whole float", 1.0), ("a boolean", True))
    elif isinstance(field, serializers.ListField):
        yield from (("empty", []), ("one", ["a"]), ("a string", "a"), ("a number inside", [1]), ("an object", {}))
    elif isinstance(field, serializers.DictField):
        yield from (("empty", {}), ("one", {"K": "v"}), ("a number inside", {"K": 1}), ("a list", ["K"]))
    elif isinstance(field, CommandField):  # a list of strings, or one line the service splits
        yield from (("empty", []), ("one", ["a"]), ("a line", "run --note 'two words'"), ("unclosed", "a 'b"))
        yield from (("an empty line", ""), ("a number inside", [1]), ("an object", {}), ("a number", 1))
    else:  # a field type this generator does not know yet: fail, so that it learns it
        pytest.fail(f"no probes for {type(field).__name__}: teach _values this field type")


def _cases() -> Iterator[Any]:
    for name, field in WorkloadItemSerializer().fields.items():
        if field.read_only:
            continue
        for label, value in _values(field):
            yield pytest.param(name, value, id=f"{name}: {label}")


@pytest.mark.parametrize(("name", "value"), list(_cases()))
def test_every_field_at_its_limits_gets_djangos_answer_through_the_ingest(
    ready: World, credentials: dict[str, Headers], name: str, value: Any
) -> None:
    ingest = SubmissionIngest(django_asgi_app)
    single = {**job(), name: value}
    calls = [Call(single), Call(bulk(item("first"), {**item("second"), name: value}), path=BULK)]
    via_ingest, via_django = both_ways(ingest, calls, credentials)
    served, passed_on = counts(ingest)
    assert served + passed_on == 2
    assert_same_answers(via_ingest, via_django)


# --- a rule added tomorrow --------------------------------------------------------------------------------


def _no_latest(value: str) -> None:
    if value.endswith(":latest"):
        raise ValidationError("Pin a version: ':latest' moves.", code="unpinned")


@pytest.fixture
def pinned_images(monkeypatch: pytest.MonkeyPatch) -> None:
    """Add a validator to the serializers' `image` field, as a change to jobs/api/serializers.py would."""
    for serializer in (WorkloadItemSerializer, WorkloadInputSerializer):
        declared: Any = serializer._declared_fields["image"]
        # A serializer instance copies its fields from their arguments: the validator goes in as one.
        kwargs = {**declared._kwargs, "validators": [*declared._kwargs.get("validators", []), _no_latest]}
        monkeypatch.setitem(serializer._declared_fields, "image", type(declared)(*declared._args, **kwargs))


def test_a_validator_added_to_a_field_holds_on_the_fast_path(
    ready: World, credentials: dict[str, Headers], pinned_images: None
) -> None:
    ingest = SubmissionIngest(django_asgi_app)
    calls = [Call(job(image="busybox:latest")), Call(bulk(item("a"), item("b", image="busybox:latest")), path=BULK)]
    via_ingest, via_django = both_ways(ingest, calls, credentials)
    assert counts(ingest) == (0, 2), "the ingest ran the new validator and left the refusal to Django"
    assert [answer.status for answer in via_ingest] == [400, 400]
    assert_same_answers(via_ingest, via_django)
    ingest = SubmissionIngest(django_asgi_app)
    both_ways(ingest, [Call(job(image="busybox:1.36"))], credentials)
    assert counts(ingest) == (1, 0), "a value the validator takes is still served"


def test_a_validate_method_added_for_a_field_defers_items_naming_it(
    ready: World, credentials: dict[str, Headers], monkeypatch: pytest.MonkeyPatch
) -> None:
    def validate_image(self: Any, value: str) -> str:
        if value.startswith("docker.io/"):
            raise serializers.ValidationError("Use the mirror.")
        return value

    monkeypatch.setattr(WorkloadItemSerializer, "validate_image", validate_image, raising=False)
    plan = build_plan()
    assert (
        plan.serving
        and [dict(route.items.deferred) for route in plan.routes.values()]
        == [{"image": "a validate_<field> method"}] * 2
    )
    assert all("`image` go to Django (a validate_<field> method)" in note for note in plan.notes)
    ingest = SubmissionIngest(django_asgi_app)
    without_image = {key: val for key, val in job(name="plain").items() if key != "image"}
    calls = [Call(job(image="docker.io/library/busybox:1")), Call(without_image)]
    via_ingest, via_django = both_ways(ingest, calls, credentials)
    assert counts(ingest) == (1, 1), "the item naming `image` went to Django, the other was served"
    assert via_ingest[0].status == 400
    assert_same_answers(via_ingest, via_django)


def test_a_serializer_rule_or_an_unknown_middleware_turns_the_ingest_off(
    ready: World, credentials: dict[str, Headers], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # A cross-field rule on every item: the ingest does not run an item serializer's validate.
    monkeypatch.setattr(WorkloadItemSerializer, "validate", lambda self, attrs: attrs, raising=False)
    plan = build_plan()
    assert not plan.serving and any("own validate" in problem for problem in plan.problems), plan.problems
    ingest = SubmissionIngest(django_asgi_app, plan)
    both_ways(ingest, [Call(job()), Call(bulk(item("a")), path=BULK)], credentials)
    assert counts(ingest) == (0, 0), "every request went to Django, past the ingest"
    monkeypatch.undo()

    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.gzip.GZipMiddleware"]
    plan = build_plan()
    assert not plan.serving and "GZipMiddleware" in " ".join(plan.problems)


def test_integer_fields_are_bounded_so_the_probes_reach_past_them() -> None:
    """The generated probes rely on every integer field having bounds (common.api.fields.Integer)."""
    fields = WorkloadItemSerializer().fields.values()
    integers = [f for f in fields if isinstance(f, serializers.IntegerField)]  # noqa: TID251 -- any, to check them
    assert integers and all(isinstance(f, Integer) and f.max_value is not None for f in integers)
    items: Any = BulkInputSerializer().fields["items"]
    assert items.child.fields.keys() == WorkloadItemSerializer().fields.keys()


def test_the_ingest_counts_its_submissions_with_the_views_throttles(
    ready: World, credentials: dict[str, Headers], settings: Any
) -> None:
    """A token's submissions served by the ingest and its requests to DRF views share one count."""
    rates = {"token": "3/min", "user": None, "anon": None}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}
    ingest = SubmissionIngest(django_asgi_app)
    calls = [Call(job(name="one")), Call(job(name="two")), Call(None, method="GET"), Call(job(name="three"))]
    answers = [response.status_code for response in one_by_one(ingest, calls, credentials)]
    assert answers == [201, 201, 200, 429], "two served, one read by DRF: the third submission is over the rate"
    assert counts(ingest) == (3, 0), "the refusal is the ingest's own, with the envelope of exception_handler"
    [refused] = one_by_one(ingest, [Call(job(name="four"))], credentials)
    assert refused.json()["error"]["code"] == "throttled" and 0 < int(refused.headers["Retry-After"]) <= 60
