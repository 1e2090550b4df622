"""A refused submission body answered with every failing field at once: the input shape's errors and the rules'.

The input serializer refuses what it cannot parse (a string for a number, a
name longer than its field, an unknown pool) before the submission service
sees anything, so its errors alone would hide those of every other field.
`with_rule_errors` hands the fields that did parse to the service's own
checks (`jobs.services.submission.submission_errors`), which name every
rule they break, those that read the database included (the pool, the
image allow-list, the quota), writing nothing; it answers both together,
each under its field path (`name`, `items[2].image`). The rules stay the
service's; nothing here restates one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail

from jobs.api.serializers import (
    BulkInputSerializer,
    WorkloadInputSerializer,
    WorkloadItemSerializer,
    resolve_references,
)
from jobs.services.spec import WorkloadSpec
from jobs.services.submission import dry_run, submission_errors
from tenants.context import Actor
from tenants.models import Project

Flat = dict[str, list[ErrorDetail]]
_ITEM = re.compile(r"items\[(\d+)\]\.?(.*)")
# A part of a field (`env.HOME`, `command[2]`) is that field's error.
_FIELD_PART = re.compile(r"[.\[]")


def with_rule_errors(
    refused: serializers.ValidationError, body: Any, context: dict[str, Any], *, actor: Actor, bulk: bool
) -> serializers.ValidationError:
    """Return the input serializer's refusal of `body` joined with the rules its parsed fields break.

    `refused` is what `validated_input` raised; the answer names each field
    path once with every rule it breaks. A body that is not an object (or a
    bulk whose `items` is not a list) gets `refused` back as it is. Raises
    PermissionDenied or Http404 where a submission by `actor` would.
    """
    flat = _flatten(refused.detail)
    raw = _raw_items(body, bulk=bulk)
    if raw is None:
        return refused
    if bulk:
        # A bulk body's own keys are the serializer's; any other (a container option) is named, never dropped.
        for key in sorted(set(body) - set(BulkInputSerializer().fields), key=str):
            flat.setdefault(str(key), [_unknown(str(key))])
    prefix = "items[{index}]." if bulk else ""
    items: list[dict[str, Any]] = []
    failed: list[set[str]] = []
    for index, item in enumerate(raw):
        where = prefix.format(index=index)
        failed_here = _failed_fields(flat, where)
        parsed, unparsed = _item_fields(_item_keys(item, bulk=bulk), failed_here, context, flat, where)
        items.append(parsed)
        failed.append(unparsed)
    project = None if "project" in flat else _project(body, context)
    found = submission_errors(actor=actor, project=project, items=items, refused=failed, bulk=bulk)
    for path, errors in found.items():
        if path not in flat:
            flat[path] = [_detail(error) for error in errors]
    return serializers.ValidationError(flat)


def unknown_keys(body: Any, *, bulk: bool) -> list[str]:
    """Return the paths of the keys in a submission body that no input field reads (`privileged`, `items[2].pid`).

    DRF's serializers drop such keys silently; a submission naming one must be
    refused instead (`unknown_field`), so the view checks for them first.
    """
    raw = _raw_items(body, bulk=bulk)
    if raw is None:
        return []
    known = set(WorkloadItemSerializer().fields)
    found = sorted(set(body) - set(BulkInputSerializer().fields), key=str) if bulk else []
    for index, item in enumerate(raw):
        where = f"items[{index}]." if bulk else ""
        if isinstance(item, Mapping):
            found.extend(f"{where}{key}" for key in _item_keys(item, bulk=bulk) if key not in known)
    return [str(path) for path in found]


def _item_keys(item: Any, *, bulk: bool) -> Any:
    """Return a submission item without the single body's `project` (the body is its one item)."""
    if bulk or not isinstance(item, Mapping):
        return item
    return {key: value for key, value in item.items() if key != "project"}


def _unknown(key: str) -> ErrorDetail:
    fields = ", ".join(sorted(BulkInputSerializer().fields))
    return ErrorDetail(f"Unknown field; allowed: {fields}.", code="unknown_field")


def raise_rule_errors(actor: Actor, project: Project, items: list[dict[str, Any]], *, bulk: bool) -> list[WorkloadSpec]:
    """Raise a ValidationError naming every rule a parsed submission breaks, as `submit` would; write nothing.
    Return the specs a submission would write (the quota's runtime filled in).

    For a dry run: what `validated_input` accepted still meets the service's
    rules (the pool, the allow-list, the quota) only when submitted.
    """
    found, specs = dry_run(actor=actor, project=project, items=items, bulk=bulk)
    if found:
        refusal = {path: [_detail(error) for error in errors] for path, errors in found.items()}
        raise serializers.ValidationError(refusal)
    return specs


def _project(body: Mapping[str, Any], context: dict[str, Any]) -> Project | None:
    """Return the body's project as the serializer reads it, or None (it was refused, or it is missing)."""
    field = WorkloadInputSerializer(context=context).fields["project"]
    try:
        project = field.run_validation(body.get("project"))
    except (serializers.ValidationError, DjangoValidationError):
        return None
    return project if isinstance(project, Project) else None


def _raw_items(body: Any, *, bulk: bool) -> list[Any] | None:
    if not isinstance(body, Mapping):
        return None
    items = body.get("items") if bulk else [body]
    return items if isinstance(items, list) else None


def _failed_fields(flat: Flat, where: str) -> set[str]:
    """Return the fields of the item at `where` (`items[2].` or ``) that the serializer refused."""
    return {_FIELD_PART.split(path[len(where) :], maxsplit=1)[0] for path in flat if path.startswith(where)}


def _item_fields(
    item: Any, failed: set[str], context: dict[str, Any], flat: Flat, where: str
) -> tuple[dict[str, Any], set[str]]:
    """Return one item's fields as the serializer parsed them (pool and preset resolved), and those it could not.

    A pool or preset that does not resolve is added to `flat` under `where`,
    as the serializer would name it, and counts as not parsed.
    """
    if not isinstance(item, Mapping):
        return {}, set(WorkloadItemSerializer().fields)
    parsed = _parsed(item, failed)
    try:
        resolve_references([parsed], context, "")
    except serializers.ValidationError as error:
        for name, messages in _flatten(error.detail).items():
            flat.setdefault(f"{where}{name}", messages)
            parsed.pop(name, None)
            failed.add(name)
    return parsed, failed


def _parsed(item: Mapping[str, Any], failed: set[str]) -> dict[str, Any]:
    """Return the item's fields the serializer took, as it took them (those it refused left out).

    A key no field reads is kept as sent: the service's own rule names it (`unknown_field`).
    """
    fields = WorkloadItemSerializer().fields
    parsed: dict[str, Any] = {}
    for name, value in item.items():
        field = fields.get(name)
        if field is None:
            parsed[name] = value
            continue
        if name in failed:
            continue
        try:
            parsed[name] = field.run_validation(value)
        except (serializers.ValidationError, DjangoValidationError):
            failed.add(name)  # refused alone though it was not reported: leave it to the serializer's word
    return parsed


def _detail(error: DjangoValidationError) -> ErrorDetail:
    return ErrorDetail(error.messages[0], code=error.code or "invalid")


def _flatten(detail: Any, path: str = "") -> Flat:
    """Return DRF's nested error detail as {field path: [errors]}, a list item's index in the path (`items[2].x`)."""
    if isinstance(detail, Mapping):
        flat: Flat = {}
        for name, nested in detail.items():
            # A list's items are reported by index (DRF's ListField keys them by int): `command[1]`.
            key = f"{path}[{name}]" if isinstance(name, int) else (f"{path}.{name}" if path else str(name))
            for sub, errors in _flatten(nested, key).items():
                flat.setdefault(sub, []).extend(errors)
        return flat
    if isinstance(detail, list) and any(isinstance(entry, Mapping | list) for entry in detail):
        flat = {}
        for index, entry in enumerate(detail):
            for sub, errors in _flatten(entry, f"{path}[{index}]").items():
                flat.setdefault(sub, []).extend(errors)
        return flat
    entries = detail if isinstance(detail, list) else [detail]
    return {path or "non_field_errors": [ErrorDetail(str(e), code=getattr(e, "code", "invalid")) for e in entries]}
