"""A webhook receiver on loopback, for the tests that check what icrlhf sends."""

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread


class Receiver:
    """A helpdesk's webhook endpoint on loopback, answering with the given statuses."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.requests = statuses, []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
