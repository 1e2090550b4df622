"""Operator pages of the inventory: node pools with their capacity, nodes and their lifecycle, GPUs.

Node actions are offered from the lifecycle's transition table; the
services decide, so a stale page that asks for a forbidden change gets the
service's 409 with the node's current state. A node's Agent panel issues
join tokens and revokes the agent's credential (`inventory.services.agents`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.forms import Form
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from common.errors import Conflict
from frontend import forms, heatmap, live_paths
from frontend import selectors as ui_selectors
from frontend.access import actor_of, operator_view
from frontend.views import again, attempt, message_of
from inventory import selectors, services
from inventory.choices import NODE_TRANSITIONS, NodeState, PlacementPolicy
from inventory.models import Node, NodeCredential, NodePool
from inventory.services import agents
from tenants.context import Actor
from tenants.models import Tenant

ROWS_PER_PAGE = 100


def _pool_names(request: HttpRequest) -> list[tuple[str, str]]:
    return [(p.name, p.name) for p in selectors.pools_visible_to(actor_of(request))]


def _tenant_choices() -> list[tuple[str, str]]:
    return [(t.slug, t.name) for t in Tenant.objects.order_by("slug")]


def _pool_form_tenant(form: Form) -> Tenant | None:
    slug = form.cleaned_data.pop("dedicated_tenant", "")
    return Tenant.objects.filter(slug=slug).first() if slug else None


@operator_view
def ops_pools(request: HttpRequest) -> HttpResponse:
    tenants = _tenant_choices()
    form = forms.PoolForm(request.POST if request.method == "POST" else None, tenant_choices=tenants)
    if form.is_valid():
        tenant = _pool_form_tenant(form)
        if attempt(
            form,
            lambda: services.create_node_pool(actor=actor_of(request), dedicated_tenant=tenant, **form.cleaned_data),
        ):
            messages.success(request, "Pool created.")
            return again(request)
    pools = ui_selectors.pools_with_capacity(selectors.pools_visible_to(actor_of(request)))
    return render(
        request,
        "frontend/ops_pools.html",
        {"pools": pools, "form": form, "tenant_choices": tenants, "placement_choices": PlacementPolicy.choices},
    )


@require_POST
@operator_view
def ops_pool_edit(request: HttpRequest, name: str) -> HttpResponse:
    pool = get_object_or_404(NodePool, name=name)
    actor = actor_of(request)
    try:
        if "delete" in request.POST:
            services.delete_node_pool(actor=actor, pool=pool)
            messages.success(request, f"Pool {name} deleted.")
            return redirect(reverse("frontend:ops_pools"))
        slug = request.POST.get("dedicated_tenant", "")
        tenant = Tenant.objects.filter(slug=slug).first() if slug else None
        services.update_node_pool(
            actor=actor,
            pool=pool,
            description=request.POST.get("description", ""),
            dedicated_tenant=tenant,
            placement_policy=request.POST.get("placement_policy") or None,
            usage_half_life_seconds=_half_life(request.POST.get("usage_half_life_seconds", "")),
        )
        messages.success(request, f"Pool {name} saved.")
    except (ValidationError, Conflict) as error:
        messages.error(request, message_of(error))
    return redirect(reverse("frontend:ops_pools"))


def _half_life(text: str) -> int | None:
    """Return the half-life typed in a pool's row (None: left empty, unchanged); ValidationError if not a number."""
    if not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise ValidationError("Give the usage half-life as a whole number of seconds.") from None


@operator_view
def ops_nodes(request: HttpRequest) -> HttpResponse:
    """The node list with filters, and the registration form (suggesting agents nobody registered yet)."""
    pools = _pool_names(request)
    agents = ui_selectors.unregistered_agents()
    data = request.POST if request.method == "POST" else None
    form = forms.NodeForm(data, prefix="new", pool_choices=pools, agent_names=bool(agents))
    if form.is_valid() and attempt(form, lambda: _register_node(actor_of(request), form)):
        messages.success(
            request, f"Node {form.cleaned_data['name']} registered. Provision it to bring it into service."
        )
        return again(request)
    filters = forms.NodeFilterForm(request.GET, pool_choices=pools)
    nodes = Paginator(ui_selectors.nodes_matching(**filters.filters()), ROWS_PER_PAGE)
    context = {"nodes": nodes.get_page(request.GET.get("page")), "filters": filters, "form": form, "agents": agents}
    return render(request, "frontend/ops_nodes.html", context)


def _register_node(actor: Actor, form: forms.NodeForm) -> Node:
    data = dict(form.cleaned_data)
    pool = get_object_or_404(NodePool, name=data.pop("pool"))
    return services.register_node(actor=actor, pool=pool, **data)


# States the system moves nodes out of (the probe's verdict, heartbeats resuming):
# an operator may only retire a node in them.
SYSTEM_DRIVEN = frozenset({NodeState.PROVISIONING, NodeState.UNREACHABLE})


@dataclass(frozen=True)
class NodeAction:
    """A button on a node's page: the service it calls and the state that service asks for."""

    name: str
    label: str
    target: NodeState
    service: Callable[..., Node]
    help: str
    form_class: type[forms.ReasonForm] | None = forms.ReasonForm
    # A state the service passes through on the way to `target` (maintenance drains first).
    via: NodeState | None = None
    danger: bool = False

    def offered_from(self, state: str) -> bool:
        """Return whether the lifecycle lets an operator take this action from `state`."""
        if state in SYSTEM_DRIVEN and self.target != NodeState.RETIRED:
            return False
        if NODE_TRANSITIONS.allows(state, self.target):
            return True
        via = self.via
        return via is not None and NODE_TRANSITIONS.allows(state, via) and NODE_TRANSITIONS.allows(via, self.target)

    def form(self, data: Any = None) -> Form:
        return (self.form_class or Form)(data, prefix=self.name)

    def perform(self, actor: Actor, node: Node, form: Form) -> Node:
        reason = {"reason": form.cleaned_data["reason"]} if self.form_class else {}
        return self.service(actor=actor, node=node, **reason)


NODE_ACTIONS = {
    action.name: action
    for action in (
        NodeAction(
            "provision",
            "Provision",
            NodeState.PROVISIONING,
            services.provision_node,
            "Probe the runtime and GPUs through the node's agent and run the health check; ready if all pass.",
            form_class=None,
        ),
        NodeAction(
            "cordon", "Cordon", NodeState.CORDONED, services.cordon_node, "Stop new placements; running work goes on."
        ),
        NodeAction(
            "uncordon",
            "Uncordon",
            NodeState.READY,
            services.uncordon_node,
            "Return the node to service (a drain in progress is cancelled).",
            form_class=None,
        ),
        NodeAction(
            "drain",
            "Drain",
            NodeState.DRAINING,
            services.drain_node,
            "Stop new placements; the node enters maintenance once nothing holds its GPUs.",
        ),
        NodeAction(
            "maintenance",
            "Maintenance",
            NodeState.MAINTENANCE,
            services.enter_maintenance,
            "Drain the node and hold it for repairs; refused while its GPUs are held.",
            via=NodeState.DRAINING,
        ),
        NodeAction(
            "retire",
            "Retire",
            NodeState.RETIRED,
            services.retire_node,
            "Take the node out of the cloud for good; its history stays.",
            form_class=forms.RetireForm,
            danger=True,
        ),
    )
}


@dataclass(frozen=True)
class AgentAction:
    """A button of a node's Agent panel; its label names it where the page reports a refusal."""

    name: str
    label: str


JOIN_TOKEN = AgentAction("join-token", "Create join token")
REVOKE_AGENT = AgentAction("revoke-agent", "Revoke agent")


@dataclass(frozen=True)
class JoinInstructions:
    """A join token just issued, shown in the response that issued it and nowhere else."""

    secret: str
    command: str
    expires_at: datetime


@dataclass(frozen=True)
class AgentPanel:
    """What a node's Agent panel shows: the agent's live credential, if any, and what the operator may do."""

    credential: NodeCredential | None
    can_join: bool
    revoke_form: Form
    issued: JoinInstructions | None = None


def _agent_panel(node: Node, *, revoke_form: Form | None = None, issued: JoinInstructions | None = None) -> AgentPanel:
    # Simulated nodes have no agent: no credential to read (and no query for it).
    return AgentPanel(
        credential=None if node.is_simulated else agents.live_credential(node),
        can_join=not node.is_simulated and node.state != NodeState.RETIRED,
        revoke_form=revoke_form or forms.ReasonForm(prefix=REVOKE_AGENT.name),
        issued=issued,
    )


@operator_view
def ops_node(request: HttpRequest, name: str) -> HttpResponse:
    """A node's summary, agent, GPUs and history, and the actions its state allows (POST `action`)."""
    node = get_object_or_404(selectors.nodes_for_operators(), name=name)
    verb = request.POST.get("action", "") if request.method == "POST" else ""
    if verb == JOIN_TOKEN.name:
        return _issue_join_token(request, node)
    if verb == REVOKE_AGENT.name:
        return _revoke_agent(request, node)
    action = NODE_ACTIONS.get(verb)
    if action is None:
        return _node_page(request, node)
    form = action.form(request.POST)
    try:
        if form.is_valid():
            changed = action.perform(actor_of(request), node, form)
            messages.success(request, f"Node {node.name}: {node.state} → {changed.state}.")
            return again(request)
    except ValidationError as error:
        forms.apply_service_errors(form, error)
    except Conflict as error:
        return _refused(request, node, action, error)
    return _node_page(request, node, bound=(action, form))


def _issue_join_token(request: HttpRequest, node: Node) -> HttpResponse:
    """Issue a join token and render it in this response only: never in the session, a URL or a cache."""
    try:
        issued = agents.issue_join_token(actor=actor_of(request), node=node)
    except Conflict as error:
        return _refused(request, node, JOIN_TOKEN, error)
    console_url = request.build_absolute_uri("/").rstrip("/")
    shown = JoinInstructions(issued.secret, agents.join_command(console_url, issued.secret), issued.row.expires_at)
    response = _node_page(request, node, agent=_agent_panel(node, issued=shown))
    add_never_cache_headers(response)
    return response


def _revoke_agent(request: HttpRequest, node: Node) -> HttpResponse:
    form = forms.ReasonForm(request.POST, prefix=REVOKE_AGENT.name)
    if not form.is_valid():
        return _node_page(request, node, agent=_agent_panel(node, revoke_form=form))
    agents.revoke_node_credentials(actor=actor_of(request), node=node, reason=form.cleaned_data["reason"])
    messages.success(request, f"Node {node.name}: agent revoked; it is cut off until the host joins again.")
    return again(request)


def _refused(request: HttpRequest, node: Node, action: NodeAction | AgentAction, error: Conflict) -> HttpResponse:
    """Answer 409 with the node as it is now and why the service refused `action`."""
    current = get_object_or_404(selectors.nodes_for_operators(), pk=node.pk)
    return _node_page(request, current, conflict=(action, error), status=409)


def _node_page(
    request: HttpRequest,
    node: Node,
    *,
    bound: tuple[NodeAction, Form] | None = None,
    conflict: tuple[NodeAction | AgentAction, Conflict] | None = None,
    agent: AgentPanel | None = None,
    status: int = 200,
) -> HttpResponse:
    offered = [a for a in NODE_ACTIONS.values() if a.offered_from(node.state) or (bound and bound[0] is a)]
    actions = [(a, bound[1] if bound and bound[0] is a else a.form()) for a in offered]
    context = {
        "node": node,
        "gpu_rows": heatmap.node_gpu_rows(node),
        "idle_below": heatmap.IDLE_BELOW,
        "metrics_path": live_paths.node_metrics(node.name),
        "events": ui_selectors.recent_node_events(node),
        "actions": actions,
        "agent": agent or _agent_panel(node),
        "conflict": conflict,
    }
    return render(request, "frontend/ops_node.html", context, status=status)


@operator_view
def ops_gpus(request: HttpRequest) -> HttpResponse:
    """Every GPU in the cloud, failed ones first, then degraded; filtered by health and pool."""
    filters = forms.GpuFilterForm(request.GET, pool_choices=_pool_names(request))
    gpus = Paginator(ui_selectors.gpus_worst_first(**filters.filters()), ROWS_PER_PAGE)
    return render(
        request, "frontend/ops_gpus.html", {"gpus": gpus.get_page(request.GET.get("page")), "filters": filters}
    )


# The tenant slug in the workload URL the heatmap page hands cluster.js to fill in.
WORKLOAD_URL_TENANT = "__tenant__"


@operator_view
def ops_cluster(request: HttpRequest) -> HttpResponse:
    """Every GPU as a heatmap cell by pool and node, coloured by utilization and marked with the workload
    holding it (idle holders stand out); kept current over `/ws/cluster/`."""
    cluster = heatmap.cluster_heatmap()
    context = {
        "pools": cluster.pools,
        "totals": cluster.totals(),
        "holders": cluster.holders_json(),
        "idle_below": heatmap.IDLE_BELOW,
        "node_states": dict(NodeState.choices),
        "cluster_path": live_paths.CLUSTER,
        # cluster.js fills in the tenant and the id: one reverse() instead of one per workload.
        "workload_url": reverse("frontend:workload", args=[WORKLOAD_URL_TENANT, 0]),
    }
    return render(request, "frontend/ops_cluster.html", context)
