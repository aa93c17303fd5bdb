"""What every studio page needs: the runs root, the record readers, the templates, and the token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from common.service import from_app_state
from studio.rollouts import Rollouts
from studio.runs import JsonLines, RunsRoot
from studio.settings import StudioSettings

HERE = Path(__file__).resolve().parent


class Studio:
    def __init__(self, settings: StudioSettings, token: str | None) -> None:
        self.settings, self.token = settings, token
        self.root = RunsRoot(settings.runs)
        self.lines = JsonLines()
        self.rollouts = Rollouts(self.lines)
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                                     autoescape=select_autoescape(["html", "jinja"]),
                                     trim_blocks=True, lstrip_blocks=True)
        self.templates.filters["pretty"] = lambda v: json.dumps(v, indent=2, default=str)
        self.templates.filters["num"] = lambda v: "-" if v is None else (f"{v:.4g}" if isinstance(v, float)
                                                                          else str(v))
        self.templates.filters["q"] = lambda v: quote(str(v), safe="")

    def page(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(template).render(refresh_s=self.settings.refresh_s, **context)
        return HTMLResponse(html, status_code=status)

    def error_page(self, status: int, title: str, message: str) -> HTMLResponse:
        return self.page("error.jinja", status=status, title=title, message=message, code=status)


StudioDep = Annotated[Studio, Depends(from_app_state("studio"))]
