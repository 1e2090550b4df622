"""What the persona journey tests share: a step that can leave a screenshot for docs/journeys.md.

A journey test walks one persona from an empty database to their goal and
calls `step` at each point a person would stop and look. With
GPUCLOUD_JOURNEY_SHOTS set to a directory, each step also saves a full-page
screenshot there as `<persona>-<NN>-<slug>.jpg` and appends its caption to
`<persona>.md`, the page docs/journeys.md links to
(`GPUCLOUD_JOURNEY_SHOTS=docs/journeys make test PYTEST_ARGS="tests/browser -k journey"`).
Without it, a step only checks that the page shows no script error or failed request,
which the page fixtures assert anyway.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


class Journey:
    """One persona's walk; `step` numbers its screenshots in order."""

    def __init__(self, persona: str, title: str) -> None:
        self.persona = persona
        self.count = 0
        self.directory = _directory()
        if self.directory is not None:
            (self.directory / f"{persona}.md").write_text(f"## {title}\n\n")

    def step(self, page: Any, caption: str) -> None:
        """Record that the person now sees `page` as `caption` says; a screenshot when asked for."""
        self.count += 1
        if self.directory is None:
            return
        slug = re.sub(r"[^a-z0-9]+", "-", caption.lower()).strip("-")[:40]
        name = f"{self.persona}-{self.count:02d}-{slug}.jpg"
        page.screenshot(path=str(self.directory / name), full_page=True, type="jpeg", quality=80)
        with (self.directory / f"{self.persona}.md").open("a") as section:
            section.write(f"{self.count}. {caption}\n\n   ![{caption}]({name})\n\n")


def _directory() -> Path | None:
    value = os.environ.get("GPUCLOUD_JOURNEY_SHOTS", "")
    if not value:
        return None
    directory = Path(value)
    directory.mkdir(parents=True, exist_ok=True)
    return directory
