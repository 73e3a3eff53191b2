"""The pages the daemon hands the web server (agent/web/server.py `pages=`), one entry each.

Each entry is a function of the built WebApp (agent/web/app.py) that adds its routes with
`add_page`; it gets what it reads from the daemon through a `Site` (no page imports the daemon).
The web extra's modules (Starlette) are imported inside the entries, so the daemon imports this
module whether or not the extra is installed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.event_index import EventIndex
    from agent.supervisor import Supervisor

AddPages = Callable[[Any], None]  # called with the WebApp


@dataclass(frozen=True)
class Site:
    """What the pages read of the daemon."""

    supervisor: Supervisor
    state_dir: Path
    config_file: Path | None  # the config the daemon runs (None: built in code, nothing to edit)
    # Reload the config file as SIGHUP does (on the daemon's main loop) and return its outcome:
    # {"result": "applied" | "unchanged" | "refused" | "pending", "problems": [...], "changes": ...}.
    reload: Callable[[], dict[str, Any]]
    explain: Callable[[], dict[str, Any]]  # what `edge-agent explain` reads: {"pipelines": [...]}
    # The fleet document layer a pipeline comes from (its desired state: not the file's to edit);
    # None for a pipeline of the config file, or one the box does not run.
    layer_of: Callable[[str], str | None]
    events: EventIndex | None = None  # the recent events (agent/event_index.py), for the events page


def pages_of(site: Site) -> Sequence[AddPages]:
    """Every page beside the box page, in the order of the header's links."""
    from agent.web.editor import editor_pages
    from agent.web.events import events_pages
    from agent.web.live import live_pages
    from agent.web.models_page import models_page

    return [
        live_pages(site.supervisor),
        events_pages(site.events, site.state_dir),
        editor_pages(site),
        models_page(site.supervisor.store, site.explain),
    ]
