"""What the submission ingest may serve, derived at start-up from the API's own routes, views and serializers.

The ingest (`jobs.api.fast_ingest`) answers workload submissions in front of
Django. It restates no rule of the API; it runs the API's own parts:

- routes: Django's URL resolver; the answer's Allow and Vary headers: the
  view's `default_response_headers`; the role a submission needs: the
  view's `required_role()` for `create`; its throttles: the view's
  `check_throttles`;
- the body: the view's parser; its JSON types: `common.api.types` over
  the view's input serializer; each item field: that field's own
  `run_validation` (choices, bounds, lengths, validators), and an item is
  served only when every field gives back exactly what was sent (a value
  the API would coerce goes to Django, which says what it made of it);
- the project: the input serializer's own field (`objects_named`); pools and
  presets: `jobs.api.serializers.resolve_references`, through the input
  serializer's own `validate`.

What the ingest cannot vouch for is found here, once, when the plan is built
(fail closed): an item field with a `validate_<field>` method, a default, a
source of its own, a relation or nested serializer, or a validator that needs
its context is *deferred* (an item naming it goes to Django); a serializer
with a `validate`, validators or a validation step of its own where the
ingest expects DRF's, a view authenticating, parsing or rendering otherwise,
or a middleware the ingest does not know turns the ingest off (every request
goes to Django) and says why in `problems`.

Part of the fast path `submission_ingest` (docs/fastpaths.md): with it off
the plan is still built at start, and serves no request. Its benchmark and
the framework internals it depends on are the ingest's (`jobs.api.fast_ingest`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string
from rest_framework import relations
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.fields import Field, empty
from rest_framework.parsers import BaseParser
from rest_framework.renderers import JSONRenderer
from rest_framework.serializers import BaseSerializer, DictField, ListField, ListSerializer, Serializer

from common.api.types import type_errors
from tenants.api.fields import ScopedSlugField
from tenants.authentication import ApiTokenAuthentication
from tenants.choices import Role

PROBE_TENANT = "t"
"""A tenant slug to resolve the two submission routes with at start-up."""

APPLIED_MIDDLEWARE = (
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "common.csp.ConsoleCSPMiddleware",
)
"""Middleware whose response step the ingest runs on its own answers (their request step, where they have one,
decides whether the ingest may answer at all)."""

INERT_MIDDLEWARE = {
    "whitenoise.middleware.WhiteNoiseMiddleware": "serves static files only",
    "tenants.middleware.RequestContextMiddleware": "the ingest sets the same request context (request_info_for)",
    "django.contrib.sessions.middleware.SessionMiddleware": "a token request never touches the session",
    "django.middleware.csrf.CsrfViewMiddleware": "DRF exempts token requests; no CSRF cookie is set",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "a lazy user; the token decides",
    "axes.middleware.AxesMiddleware": "answers only a login that django-axes locked out; a token never logs in",
    "django.contrib.messages.middleware.MessageMiddleware": "no message is stored",
    "common.api.middleware.ApiExceptionMiddleware": "the ingest answers its own errors with the same envelope",
}
"""Middleware that changes nothing in a token-authenticated submission's answer, and why."""

_RESOLVED_PATHS = 4096
"""Paths whose route the plan keeps (POST paths: one or two per tenant); past this it starts over."""
_DRF_STEPS = ("to_internal_value", "run_validation", "run_validators", "validate_empty_values")


@dataclass(frozen=True)
class Items:
    """How one route's items are checked: the item fields the ingest runs, and those it leaves to Django."""

    fields: Mapping[str, Field]
    deferred: Mapping[str, str]
    """Item fields the ingest leaves to Django, and why."""
    required: frozenset[str]

    def accepted(self, data: Any) -> dict[str, Any] | None:
        """Return the item as the serializer would validate it, or None when it would refuse or change any of it,
        when the item names a deferred field, or a key no field reads (the API refuses those: `unknown_field`)."""
        if not isinstance(data, dict) or not data.keys() >= self.required or data.keys() & self.deferred.keys():
            return None
        item: dict[str, Any] = {}
        for name, value in data.items():
            check = self.fields.get(name)
            if check is None:
                return None
            try:
                validated = check.run_validation(value)
            except (ValidationError, DjangoValidationError):
                return None
            if not same_json(validated, value):
                return None
            item[name] = value
        return item


@dataclass(frozen=True)
class Route:
    """One submission route as its view serves it."""

    bulk: bool
    view: type[Any]
    input: Serializer
    """The view's input serializer, bound once: for `type_errors`, the project field and `validate`."""
    items: Items
    headers: Mapping[str, str]
    role: Role
    parser: BaseParser
    min_items: int = 1
    max_items: int | None = None

    def accepted(self, body: bytes) -> tuple[str, list[dict[str, Any]]] | None:
        """Return (project slug, items) of a body the API would take exactly as sent, else None (Django decides)."""
        try:
            data = self.parser.parse(io.BytesIO(body), "application/json", {"encoding": "utf-8"})
        except APIException:
            return None
        if not isinstance(data, dict) or type_errors(self.input, data) or data.keys() - self.input.fields.keys():
            return None
        project = data.get("project")
        raw = data.get("items") if self.bulk else [{k: v for k, v in data.items() if k != "project"}]
        if not isinstance(project, str) or not isinstance(raw, list):
            return None
        if len(raw) < self.min_items or (self.max_items is not None and len(raw) > self.max_items):
            return None
        items = [self.items.accepted(one) for one in raw]
        return None if any(item is None for item in items) else (project, [item for item in items if item is not None])

    def new_input(self, context: dict[str, Any]) -> Serializer:
        """Return an input serializer with `context`, to run its `validate` (fields are not bound, so cheap)."""
        serializer: Serializer = type(self.input)(context=context)
        return serializer

    def project_field(self) -> ScopedSlugField:
        found = self.input.fields["project"]
        assert isinstance(found, ScopedSlugField)  # build_plan checked it
        return found


@dataclass(frozen=True)
class IngestPlan:
    """The two submission routes the ingest serves, keyed by the view function Django resolves them to."""

    routes: Mapping[Callable[..., Any], Route]
    middleware: tuple[Any, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    resolved: dict[str, tuple[Route, str] | None] = field(default_factory=dict, compare=False, repr=False)

    @property
    def serving(self) -> bool:
        return not self.problems

    def route(self, path: str) -> tuple[Route, str] | None:
        """Return the route `path` resolves to, with its tenant slug, or None for any other path.

        Answers are kept per path (the URL configuration does not change
        while the console runs): resolving costs more than the rest of a
        submission's checks in front of Django.
        """
        if not self.serving:
            return None
        if path not in self.resolved:
            if len(self.resolved) >= _RESOLVED_PATHS:
                self.resolved.clear()
            self.resolved[path] = self._resolve(path)
        return self.resolved[path]

    def _resolve(self, path: str) -> tuple[Route, str] | None:
        try:
            match = resolve(path)
        except Resolver404:
            return None
        found = self.routes.get(match.func)
        return None if found is None else (found, str(match.kwargs.get("tenant", "")))


def build_plan() -> IngestPlan:
    """Derive the plan from the URL configuration, the views and their serializers; see the module."""
    problems: list[str] = []
    notes: list[str] = []
    routes: dict[Callable[..., Any], Route] = {}
    single, bulk_path = f"/api/v1/tenants/{PROBE_TENANT}/workloads/", f"/api/v1/tenants/{PROBE_TENANT}/workloads/bulk/"
    for bulk, path in ((False, single), (True, bulk_path)):
        try:
            view_function = resolve(path).func
        except Resolver404:
            problems.append(f"{path} resolves to no view")
            continue
        route = _route(view_function, bulk, problems, notes)
        if route is not None:
            routes[view_function] = route
    middleware = _middleware(problems)
    return IngestPlan(routes=routes, middleware=middleware, problems=tuple(problems), notes=tuple(notes))


def _route(view_function: Any, bulk: bool, problems: list[str], notes: list[str]) -> Route | None:
    cls = getattr(view_function, "cls", None)
    actions = getattr(view_function, "actions", None) or {}
    where = f"{getattr(cls, '__name__', view_function)} ({'bulk' if bulk else 'single'})"
    if cls is None or actions.get("post") != "create":
        problems.append(f"{where}: POST is not a viewset's create")
        return None
    view = _instance(view_function)
    if not view.authentication_classes or view.authentication_classes[0] is not ApiTokenAuthentication:
        problems.append(f"{where}: bearer tokens are not what authenticates first")
    if len(view.parser_classes) != 1:
        problems.append(f"{where}: not exactly one parser")
    if not view.renderer_classes or not issubclass(view.renderer_classes[0], JSONRenderer):
        problems.append(f"{where}: JSON is not its first renderer")
    serializer_class = getattr(cls, "input_serializer_class", None)
    if serializer_class is None:
        problems.append(f"{where}: no input_serializer_class")
        return None
    serializer: Serializer = serializer_class()
    _check_serializer(serializer, where, problems, allow_validate=True)
    project = serializer.fields.get("project")
    if type(project) is not ScopedSlugField or project.validators or hasattr(serializer, "validate_project"):
        problems.append(f"{where}: its project field is not a plain ScopedSlugField")
    items, bounds = _items(serializer, bulk, where, problems)
    if items is None:
        return None
    notes.extend(f"{where}: items naming `{name}` go to Django ({why})" for name, why in sorted(items.deferred.items()))
    if problems:
        return None
    parser: BaseParser = view.parser_classes[0]()
    view.action, view.request = "create", SimpleNamespace(method="POST")
    return Route(
        bulk=bulk,
        view=cls,
        input=serializer,
        items=items,
        headers=dict(view.default_response_headers),
        role=view.required_role(),
        parser=parser,
        min_items=bounds[0],
        max_items=bounds[1],
    )


def _instance(view_function: Any) -> Any:
    """Return the view as DRF's as_view would set it up for this route (its actions bound to methods)."""
    view = view_function.cls(**view_function.initkwargs)
    view.action_map = view_function.actions
    for method, action in view_function.actions.items():
        setattr(view, method, getattr(view, action))
    if hasattr(view, "get") and not hasattr(view, "head"):
        view.head = view.get
    return view


def _items(
    serializer: Serializer, bulk: bool, where: str, problems: list[str]
) -> tuple[Items | None, tuple[int, int | None]]:
    """Return how the route's items are checked and the bounds of a bulk's item count."""
    if not bulk:
        fields = {name: f for name, f in serializer.fields.items() if name != "project"}
        return _item_checks(serializer, fields), (1, 1)
    extra = set(serializer.fields) - {"project", "items"}
    listed = serializer.fields.get("items")
    if extra or type(listed) is not ListSerializer or not isinstance(listed.child, Serializer) or listed.validators:
        problems.append(f"{where}: not a project and a plain list of items")
        return None, (1, None)
    child: Serializer = listed.child
    _check_serializer(child, f"{where} item", problems, allow_validate=False)
    # DRF's ListSerializer takes min_length and max_length (its stubs do not say so).
    shortest, longest = getattr(listed, "min_length", None), getattr(listed, "max_length", None)
    lowest = max(1 if not listed.allow_empty else 0, shortest or 0)
    return _item_checks(child, dict(child.fields)), (lowest, longest)


def _item_checks(serializer: Serializer, fields: Mapping[str, Field]) -> Items:
    writable = {name: f for name, f in fields.items() if not f.read_only}
    problems = {name: _field_problem(serializer, name, f) for name, f in writable.items()}
    deferred = {name: why for name, why in problems.items() if why is not None}
    return Items(
        fields={name: f for name, f in writable.items() if name not in deferred},
        deferred=deferred,
        required=frozenset(name for name, f in writable.items() if f.required),
    )


def _check_serializer(serializer: Serializer, where: str, problems: list[str], *, allow_validate: bool) -> None:
    """Note a serializer whose validation is not DRF's own field by field (the ingest runs only that)."""
    cls = type(serializer)
    changed = [step for step in _DRF_STEPS if getattr(cls, step) is not getattr(Serializer, step)]
    if not allow_validate and cls.validate is not Serializer.validate:
        changed.append("validate")
    if changed:
        problems.append(f"{where}: {cls.__name__} has its own {', '.join(changed)}")
    if serializer.get_validators():
        problems.append(f"{where}: {cls.__name__} has validators of its own")


def _field_problem(serializer: Serializer, name: str, item_field: Field) -> str | None:
    """Return why the ingest cannot run `item_field` by itself, or None when its run_validation is the whole rule."""
    if hasattr(serializer, f"validate_{name}"):
        return "a validate_<field> method"
    if item_field.source != name or item_field.default is not empty:
        return "a source or a default"
    return _value_problem(item_field)


def _value_problem(value_field: Field) -> str | None:
    if isinstance(value_field, (relations.RelatedField, relations.ManyRelatedField, BaseSerializer)):
        return "reads the database or nests a serializer"
    if any(getattr(validator, "requires_context", False) for validator in value_field.validators):
        return "a validator that needs its context"
    if isinstance(value_field, (ListField, DictField)):
        return _value_problem(value_field.child)
    return None


def _middleware(problems: list[str]) -> tuple[Any, ...]:
    """Return the response middleware the ingest runs, in the order Django runs them; note unknown ones."""
    unknown = [path for path in settings.MIDDLEWARE if path not in APPLIED_MIDDLEWARE and path not in INERT_MIDDLEWARE]
    if unknown:
        problems.append(f"middleware the ingest does not know: {', '.join(unknown)}")
    applied = [path for path in settings.MIDDLEWARE if path in APPLIED_MIDDLEWARE]
    return tuple(import_string(path)(_no_response) for path in reversed(applied))


def _no_response(request: Any) -> None:
    return None


def same_json(validated: Any, sent: Any) -> bool:
    """Whether a field gave back exactly the JSON value sent: equal, and of the same types all the way down."""
    if type(validated) is not type(sent):
        return False
    if isinstance(sent, list):
        return len(validated) == len(sent) and all(same_json(a, b) for a, b in zip(validated, sent, strict=True))
    if isinstance(sent, dict):
        return validated.keys() == sent.keys() and all(same_json(validated[k], sent[k]) for k in sent)
    return bool(validated == sent)
