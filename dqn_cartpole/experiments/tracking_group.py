"""How a sweep's runs and a study's trials are grouped where they are tracked (`--track`): the same
`tracking.group` (the sweep's or the study's name, unless the config names one), and tags (a trial's number and
sampled values); the seed is every tracked run's own tag. Nothing when the runs are not tracked."""

from __future__ import annotations

import json
from typing import Sequence


def group_overrides(tracking: dict, group: str, tags: Sequence[str] = ()) -> list[str]:
    """`--set` items that put a run in `group` with `tags` added to the config's own (none if not tracked)."""
    if not tracking.get("backend"):
        return []
    items = [] if tracking.get("group") else [f"tracking.group={json.dumps(group)}"]
    if tags:
        items.append(f"tracking.tags={json.dumps([*(tracking.get('tags') or ()), *tags])}")
    return items


def trial_tags(number: int, sampled: Sequence[str]) -> list[str]:
    """A trial's tags: trial=NNNN and sampled.KEY=VALUE for each sampled `--set` item."""
    return [f"trial={number:04d}", *(f"sampled.{item.strip()}" for item in sampled)]
