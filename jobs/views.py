"""The console's side of the notebook hand-off: `/notebooks/<id>/open` sends a signed-in browser to the notebook.

The console never serves a notebook: its `/notebooks/<id>/open` issues a
one-time ticket (the proxy's own access rule, `notebook_proxy_target`) and
redirects to the notebook origin's entry URL (`jobs.services.notebook_entry`);
any other `/notebooks/<id>/<path>` on the console (an old link) redirects
to `open` for that path.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from jobs.services.notebook_entry import entry_url, issue_ticket


@never_cache
@require_safe
def open_notebook(request: HttpRequest, workload_id: int) -> HttpResponse:
    """Redirect to notebook `workload_id`'s entry on its own origin; 404 for whoever may not open it.

    `?next=` names the path inside the notebook to open (default `lab`).
    Anonymous visitors are sent to sign in first.
    """
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    ticket = issue_ticket(
        user=request.user,
        console_session=request.session.session_key,
        workload_id=workload_id,
        next_path=request.GET.get("next"),
    )
    if ticket is None:
        raise Http404("No such notebook.")
    return HttpResponseRedirect(entry_url(workload_id, ticket))


@require_safe
def notebook_path(request: HttpRequest, workload_id: int, rest: str) -> HttpResponse:
    """Redirect an old link to a notebook's path on the console to that notebook's hand-off."""
    return HttpResponseRedirect(f"/notebooks/{workload_id}/open?{urlencode({'next': rest})}")
