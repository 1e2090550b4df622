"""Budgets and requests for more over the API: thin adapters over accounting.services.budgets and .increases."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from accounting import selectors
from accounting.api import budget_serializers as s
from accounting.models import Budget, IncreaseRequest
from accounting.selectors.budgets import all_budgets, budget_states, budgets_in_scope, tenant_budget_states
from accounting.services import budgets, increases
from tenants.api.base import PlatformViewSet, TenantViewSet
from tenants.choices import Role

_READ = (mixins.ListModelMixin, mixins.RetrieveModelMixin)


class BudgetEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """The tenant's budgets with what is used of them: everyone in the tenant reads; tenant admins set their
    projects' budgets (the tenant's own is the operators', under /api/v1/budgets/)."""

    serializer_class = s.BudgetSerializer

    def scoped_queryset(self) -> QuerySet[Budget]:
        return budgets_in_scope()

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        tenant = getattr(self, "tenant", None)
        found = tenant_budget_states(tenant, now=timezone.now()) if tenant is not None else []
        return {**context, "states": {state.budget.pk: state for state in found}}

    @extend_schema(request=s.BudgetCreateSerializer, responses={201: s.BudgetSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(s.BudgetCreateSerializer)
        budget = budgets.create_budget(actor=self.actor, tenant=self.tenant, **data)
        return self.respond(budget, status.HTTP_201_CREATED)

    @extend_schema(request=s.BudgetUpdateSerializer, responses=s.BudgetSerializer)
    def partial_update(self, request: Request, tenant: str, pk: str) -> Response:
        data = self.validated_input(s.BudgetUpdateSerializer, partial=True)
        return self.respond(budgets.update_budget(actor=self.actor, budget=self.get_object(), changes=data))

    def destroy(self, request: Request, tenant: str, pk: str) -> Response:
        budgets.delete_budget(actor=self.actor, budget=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class PlatformBudgetEndpoint(*_READ, PlatformViewSet):  # type: ignore[misc]
    """Every tenant's own budget, with what is used of it: operators read and set them."""

    serializer_class = s.BudgetSerializer
    read_role = Role.OPERATOR

    def scoped_queryset(self) -> QuerySet[Budget]:
        return all_budgets().filter(project__isnull=True)

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        found = budget_states(now=timezone.now()) if getattr(self, "actor", None) is not None else []
        return {**context, "states": {state.budget.pk: state for state in found}}

    @extend_schema(request=s.PlatformBudgetCreateSerializer, responses={201: s.BudgetSerializer})
    def create(self, request: Request) -> Response:
        data = self.validated_input(s.PlatformBudgetCreateSerializer)
        budget = budgets.create_budget(actor=self.actor, **data)
        return self.respond(budget, status.HTTP_201_CREATED)

    @extend_schema(request=s.BudgetUpdateSerializer, responses=s.BudgetSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        data = self.validated_input(s.BudgetUpdateSerializer, partial=True)
        return self.respond(budgets.update_budget(actor=self.actor, budget=self.get_object(), changes=data))

    def destroy(self, request: Request, pk: str) -> Response:
        budgets.delete_budget(actor=self.actor, budget=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class IncreaseRequestEndpoint(*_READ, TenantViewSet):  # type: ignore[misc]
    """Requests for more quota or budget: everyone in the tenant reads; members ask for their projects (admins
    for the tenant's own); tenant admins approve or refuse a project's, operators the tenant's own; the
    requester (or a decider) cancels a pending one."""

    serializer_class = s.IncreaseRequestSerializer
    write_role = Role.MEMBER
    action_roles = {"approve": Role.ADMIN, "refuse": Role.ADMIN}
    filterset_fields = ["state", "kind"]

    def scoped_queryset(self) -> QuerySet[IncreaseRequest]:
        return selectors.requests_in_scope()

    @extend_schema(request=s.IncreaseRequestCreateSerializer, responses={201: s.IncreaseRequestSerializer})
    def create(self, request: Request, tenant: str) -> Response:
        data = self.validated_input(s.IncreaseRequestCreateSerializer)
        project = data.pop("project")
        asked = increases.ask_for_more(
            actor=self.actor, tenant=self.tenant, project=project, ask=increases.ask_from(data), now=timezone.now()
        )
        return self.respond(asked, status.HTTP_201_CREATED)

    @extend_schema(request=s.DecisionSerializer, responses=s.IncreaseRequestSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, tenant: str, pk: str) -> Response:
        note = self.validated_input(s.DecisionSerializer)["note"]
        decided = increases.approve_request(actor=self.actor, request=self.get_object(), now=timezone.now(), note=note)
        return self.respond(decided)

    @extend_schema(request=s.DecisionSerializer, responses=s.IncreaseRequestSerializer)
    @action(detail=True, methods=["post"])
    def refuse(self, request: Request, tenant: str, pk: str) -> Response:
        note = self.validated_input(s.DecisionSerializer)["note"]
        decided = increases.refuse_request(actor=self.actor, request=self.get_object(), now=timezone.now(), note=note)
        return self.respond(decided)

    @extend_schema(request=None, responses=s.IncreaseRequestSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, tenant: str, pk: str) -> Response:
        cancelled = increases.cancel_request(actor=self.actor, request=self.get_object(), now=timezone.now())
        return self.respond(cancelled)
