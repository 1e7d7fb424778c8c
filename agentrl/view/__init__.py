"""`agentrl view`: a local web page for runs, groups, branch trees and tokens.

:func:`create_app` builds the FastAPI app over a run folder (or a folder of runs);
:func:`serve_in_thread` runs it beside a training run (``agentrl train --view``).
"""

from agentrl.extras import require

for _module in ("fastapi", "uvicorn", "jinja2"):
    require(_module, "view", "agentrl view")

from agentrl.view.app import create_app  # noqa: E402 - after the extra's check
from agentrl.view.server import ViewServer, serve_in_thread  # noqa: E402

__all__ = ["ViewServer", "create_app", "serve_in_thread"]
