"""The cluster heatmap's nodes and cells, rendered in Python: a template loop over 8,000 GPUs takes
seconds, this tens of milliseconds. cluster.js builds the same markup for nodes that appear later."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from django import template
from django.utils.safestring import SafeString, mark_safe

from frontend.heatmap import HeatmapGpu, HeatmapNode

register = template.Library()


def cell_title(gpu: HeatmapGpu) -> str:
    """Return a cell's tooltip: GPU, model, reading, holder; cluster.js rewrites it as values change."""
    percent = None if gpu.utilization is None else round(gpu.utilization)
    parts = [f"GPU {gpu.index}", gpu.model, "no recent sample" if percent is None else f"{percent}% utilization"]
    if gpu.holder is not None:
        parts.append(f"{gpu.holder.label} ({gpu.holder.state})")
    if gpu.idle:
        parts.append("allocated but idle")
    return " · ".join(parts)


def _cell(gpu: HeatmapGpu) -> str:
    # The markup is kept short on purpose: 8,000 of these make most of the page.
    classes = "hm-cell"
    attributes = f'data-gpu="{escape(gpu.uuid)}"'
    if gpu.utilization is None:
        classes += " hm-none"
        attributes += ' data-util=""'
    else:
        percent = round(gpu.utilization)
        attributes += f' data-util="{percent}" style="--u:{percent}"'
    if gpu.holder is not None:
        classes += " hm-held"
        attributes += f' data-w="{gpu.holder.workload_id}"'
    if gpu.idle:
        classes += " hm-idle"
    return f'<i class="{classes}" {attributes} title="{escape(cell_title(gpu))}"></i>'


def _cells(node: HeatmapNode) -> str:
    return "".join(_cell(gpu) for gpu in node.gpus) or '<small class="muted">no GPUs</small>'


@register.simple_tag
def heatmap_node(node: HeatmapNode, node_base: str) -> SafeString:
    """Return a node's block: its name (a link under `node_base`), state, a simulated node's badge and
    its GPU cells in index order, the order of the live `utilization` and `holders` messages."""
    name = escape(node.name)
    simulated = (
        ' <span class="badge badge-sim" data-node-sim title="A simulated node: no agent, no real GPUs">sim</span>'
        if node.simulated
        else ""
    )
    state = escape(node.state)
    # Every interpolated text is escaped above or here; the rest is this module's own markup.
    return mark_safe(  # noqa: S308
        f'<div class="hm-node" data-node="{name}" data-state="{state}"{" data-sim" if node.simulated else ""}>'
        f'<div class="hm-node-name"><a href="{escape(node_base + quote(node.name, safe=""))}/">{name}</a> '
        f'<span class="state state-{state}" data-node-state>{escape(node.state_label)}</span>{simulated}</div>'
        f'<div class="hm-gpus">{_cells(node)}</div></div>'
    )
