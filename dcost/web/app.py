"""The explorer's ASGI app (Starlette): the page, its static files, and JSON from dcost.

Routes (every answer JSON, SI units; ``dcost.web.queries`` computes them):

    GET /                    the page (static/index.html)
    GET /static/...          its script, style and the vendored uPlot
    GET /api/choices         hardware, model and engine choices, and the controls' defaults
    GET /api/curve?...       time and cost per token against batch, with the roofline's terms
    GET /api/optimum?...     the cheapest batch at the chips given, and what binds it
    GET /api/elasticities?...  d log(optimal cost) / d log(input), ranked
    GET /api/fleet?...       the cheapest fleet for the traffic (dcost.plan)

The query fields are ``hardware``, ``model``, ``engine``, ``context`` and ``output`` (tokens),
``batch``, ``chips``, ``tpot_slo`` (s) and ``rate`` (requests/s); a missing one takes its default.
A bad value is answered with HTTP 400 and ``{"error": <the API's message>, "field": <name>}``.
The handlers are plain functions, which Starlette runs in its thread pool, so that a slow first
compilation of one answer does not hold up the others.
"""

from __future__ import annotations

import pathlib

from dcost.web import queries

__all__ = ["create_app", "STATIC", "ANSWERS"]

STATIC = pathlib.Path(__file__).parent / "static"
"""The page's files, shipped as package data."""
ANSWERS = queries.ANSWERS
"""The JSON answers by route name (``dcost.web.queries.ANSWERS``)."""


def create_app():
    """The Starlette app serving the page and its JSON answers (needs the ``serve`` extra, so
    the example is not a doctest: the quick tests run without it; ``tests/test_web.py`` runs it)::

        from starlette.testclient import TestClient
        with TestClient(create_app()) as client:
            r = client.get("/api/curve", params={"batch": "-3"})
        r.status_code, r.json()["field"]        # (400, 'batch')

    Serve it with any ASGI server: ``uvicorn.run(create_app())``, or ``dcost serve``.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    def index(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    def choices(request: Request) -> JSONResponse:
        return JSONResponse(queries.choices())

    def answer(name: str):
        def endpoint(request: Request) -> JSONResponse:
            try:
                q = queries.parse_cached(request.query_params)
            except queries.QueryError as err:
                return JSONResponse({"error": str(err), "field": err.field}, status_code=400)
            return JSONResponse(queries.answer(name, q))

        return endpoint

    routes = [
        Route("/", index),
        Route("/api/choices", choices),
        *(Route(f"/api/{name}", answer(name)) for name in ANSWERS),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes)
