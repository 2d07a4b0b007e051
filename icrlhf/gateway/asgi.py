"""The gateway process: `uvicorn icrlhf.gateway.asgi:application` (make run starts it).

It serves the OpenAI-compatible API only (its own URLs), and loads litellm before the first
call, as the worker does. Only uvicorn imports this module: it marks the whole process as the
gateway's."""

import atexit
import os

os.environ["ICRLHF_PROCESS"] = "gateway"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "icrlhf.settings")

import django  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core import signals  # noqa: E402
from django.db import close_old_connections, reset_queries  # noqa: E402

from icrlhf.integrations import embeddings, llm  # noqa: E402

django.setup(set_prefix=False)  # as get_asgi_application does

from icrlhf.gateway.body_limit import body_limited  # noqa: E402
from icrlhf.gateway.handler import GatewayHandler  # noqa: E402

application = body_limited(GatewayHandler())

# Django closes stale database connections when a request starts and ends: under ASGI, on a
# thread of the request's own (sync_to_async), a hand-over for the start alone. They close
# nothing here: the event loop never touches the database, and the pool's threads check their
# connections before each piece of work (`in_flight.blocking`).
signals.request_started.disconnect(close_old_connections)
signals.request_started.disconnect(reset_queries)
signals.request_finished.disconnect(close_old_connections)

from icrlhf.gateway import call_log, views  # noqa: E402  (their models need the apps set up)

# What the first calls would otherwise pay, paid before the port opens: litellm's imports,
# the threads and their database connections, and (with a server) the embedder.
llm.warm_up()
views.warm_up()
if settings.QDRANT_URL:  # with a server, retrieval runs here (else in the worker)
    embeddings.warm_up()

# The call log's writer, when it is this process's (CALL_LOG_WRITER=gateway): the rows left
# waiting are written before the process ends (uvicorn stops gracefully on SIGTERM; after a
# kill, the next writer or the worker's sweep writes them).
if settings.CALL_LOG_WRITER == "gateway":
    _writer = call_log.writer()
    _writer.start()
    atexit.register(_writer.stop)
