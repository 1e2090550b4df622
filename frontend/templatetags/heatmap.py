"""The cluster heatmap's nodes and cells, rendered in Python: a template loop over 8,000 GPUs takes
seconds, this tens of milliseconds. cluster.js builds the same markup for nodes that appear later."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from django import template
from django.utils.safestring import SafeString, mark_safe

from frontend.selectors import HeatmapGpu, HeatmapNode

register = template.Library()


def cell_title(index: int, model: str, percent: int | None) -> str:
    """Return a cell's tooltip; cluster.js rewrites its last part (the reading) as values change."""
    return f"GPU {index} · {model} · {'no recent sample' if percent is None else f'{percent}% utilization'}"


def _cell(gpu: HeatmapGpu) -> str:
    percent = None if gpu.utilization is None else round(gpu.utilization)
    title = escape(cell_title(gpu.index, gpu.model, percent))
    uuid = escape(gpu.uuid)
    if percent is None:
        return f'<i class="hm-cell hm-none" data-gpu="{uuid}" data-util="" title="{title}"></i>'
    return f'<i class="hm-cell" data-gpu="{uuid}" data-util="{percent}" style="--u:{percent}" title="{title}"></i>'


def _cells(node: HeatmapNode) -> str:
    return "".join(_cell(gpu) for gpu in node.gpus) or '<small class="muted">no GPUs</small>'


@register.simple_tag
def heatmap_node(node: HeatmapNode, node_base: str) -> SafeString:
    """Return a node's block: its name (a link under `node_base`), state and GPU cells in index order,
    the order of the live `utilization` messages."""
    name = escape(node.name)
    # Every interpolated text is escaped above or here; the rest is this module's own markup.
    return mark_safe(  # noqa: S308
        f'<div class="hm-node" data-node="{name}" data-state="{escape(node.state)}">'
        f'<div class="hm-node-name"><a href="{escape(node_base + quote(node.name, safe=""))}/">{name}</a> '
        f'<span class="state state-{escape(node.state)}" data-node-state>{escape(node.state_label)}</span></div>'
        f'<div class="hm-gpus">{_cells(node)}</div></div>'
    )
