"""Django admin of the inventory app; writes go through inventory.services (validated and audited)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.forms import ModelForm
from django.http import HttpRequest

from inventory import services
from inventory.models import NodePool
from tenants.admin import OperatorAdmin, actor_of


@admin.register(NodePool)
class NodePoolAdmin(OperatorAdmin):
    list_display = [
        "name",
        "dedicated_tenant",
        "placement_policy",
        "usage_half_life_seconds",
        "description",
        "created_at",
    ]
    search_fields = ["name"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["name", "created_at", "updated_at"] if obj else ["created_at", "updated_at"]

    def save_model(self, request: HttpRequest, obj: NodePool, form: ModelForm[NodePool], change: bool) -> None:
        actor = actor_of(request)
        if change:
            updated = services.update_node_pool(
                actor=actor,
                pool=obj,
                description=obj.description,
                dedicated_tenant=obj.dedicated_tenant,
                placement_policy=obj.placement_policy,
                usage_half_life_seconds=obj.usage_half_life_seconds,
            )
        else:
            updated = services.create_node_pool(
                actor=actor,
                name=obj.name,
                description=obj.description,
                dedicated_tenant=obj.dedicated_tenant,
                placement_policy=obj.placement_policy,
                usage_half_life_seconds=obj.usage_half_life_seconds,
            )
        obj.pk = updated.pk

    def delete_model(self, request: HttpRequest, obj: NodePool) -> None:
        services.delete_node_pool(actor=actor_of(request), pool=obj)
