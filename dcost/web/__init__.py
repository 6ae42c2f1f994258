"""``dcost serve``: a local page to explore the model.

``dcost.web.queries`` answers the page's questions from dcost's public API (plain dicts, SI
units); ``dcost.web.app`` serves them as JSON beside the static page (``static/``: the page, its
script and the vendored uPlot plotting library, so that it works offline). The app needs the
``serve`` extra (Starlette, uvicorn): ``pip install "dcost[serve]"``.
"""

__all__: list[str] = []
