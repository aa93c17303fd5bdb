"""`/login`: with EVOLVER_API_TOKEN set, the form takes the token once and sets a cookie, since a browser
following links sends no bearer header."""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from studio.context import StudioDep

COOKIE = "evolver_studio_token"

router = APIRouter()


@router.get("/login", response_class=HTMLResponse)
async def login_form(studio: StudioDep, next: str = "/") -> Response:
    return studio.page("login.jinja", next=_safe_next(next), error=None, needed=bool(studio.token))


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, studio: StudioDep) -> Response:
    token = studio.token
    form = parse_qs((await request.body()).decode(errors="replace")[:10_000])
    given = (form.get("token") or [""])[0]
    target = _safe_next((form.get("next") or ["/"])[0])
    if not token:
        return RedirectResponse(target, status_code=303)
    if not hmac.compare_digest(given, token):
        return studio.page("login.jinja", status=401, next=target, error="that token is not the services' token",
                           needed=True)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
    return response


def _safe_next(target: str) -> str:
    """Only a path on this site: `//host` or a scheme would make the login form an open redirect."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/"
