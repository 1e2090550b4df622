"""The empty cluster page's button: add the simulated demo fleet, as `gpucloud demo` does (jobs.services.demo)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from common.errors import Conflict
from frontend.access import actor_of, operator_view
from frontend.views import message_of
from jobs.services.demo import add_demo_fleet


@operator_view
@require_POST
def demo_fleet(request: HttpRequest) -> HttpResponse:
    """Add whatever of the demo fleet is missing (operators only, others 404) and go back to the cluster page."""
    try:
        fleet = add_demo_fleet(actor=actor_of(request))
    except (ValidationError, Conflict) as error:
        messages.error(request, f"The demo fleet could not be added: {message_of(error)}")
    else:
        messages.success(request, fleet.summary())
    return redirect("frontend:ops_cluster")
