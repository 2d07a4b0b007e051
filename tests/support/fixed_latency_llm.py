"""A local OpenAI-compatible chat endpoint that answers after a fixed delay.

A test double, for the pipeline benchmark (fan-out against a known latency), the fault suite
(FaultyLLM) and the worker tests, where the real model's speed and wording would blur what is
measured. Each answer is distinct and names the request it answers, so tests can tell
candidates apart. It serves any number of calls in parallel, and `n` answers in one call, as a
hosted API does. `held`, each call is held until released instead (a POST to its `/release`
lets go of every call in progress), its latency the longest it waits: a benchmark so keeps a
call in progress for as long as its set-up takes on a slow machine.
`python -m tests.support.fixed_latency_llm --port 8099` runs it.
"""

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Where its time went, as llama.cpp's server reports it beside its answer.
_TIMINGS = {"prompt_n": 10, "prompt_ms": 3.0, "predicted_n": 12, "predicted_ms": 7.0}


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5: 32 clients connecting at once overflow it,
    # and each connection refused waits a second before trying again (a TCP retransmission),
    # which a benchmark would count as the gateway's time.
    request_queue_size = 128


class FixedLatencyLLM:
    def __init__(
        self,
        *,
        latency_s: float = 1.0,
        held: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.latency_s = latency_s
        self.held = held
        self._releases = 0  # held: how many times calls in progress were let go
        self._released = threading.Condition()
        self.drip_s = 0.0  # streams: the pause before each event (an upstream that drips)
        self.host = host
        self.calls = 0
        self.last_request: dict[str, Any] = {}  # what the latest call asked (its prompt)
        self.last_authorization = ""  # the key the latest call was sent with
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._server = _Server((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def api_base(self) -> str:
        return f"http://{self.host}:{self._server.server_address[1]}/v1"

    def start(self) -> "FixedLatencyLLM":
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait(self) -> None:
        """Before answering: the latency, or, held, until released (the latency at most)."""
        if not self.held:
            time.sleep(self.latency_s)
            return
        with self._released:
            arrived = self._releases
            self._released.wait_for(lambda: self._releases > arrived, timeout=self.latency_s)

    def release(self) -> None:
        """Lets go of every held call in progress; later calls wait for the next release."""
        with self._released:
            self._releases += 1
            self._released.notify_all()

    def respond(self, request: dict[str, Any]) -> tuple[int, bytes]:
        """Status and body of the reply; test doubles override it to misbehave."""
        answer = self.answer(request)
        if request.get("stream"):
            return 200, self._events(answer)
        return 200, json.dumps(answer).encode()

    @staticmethod
    def _events(answer: dict[str, Any]) -> bytes:
        """The answer as server-sent events, a word a chunk (a tool call: its name, then its
        arguments in two pieces), then its usage, as OpenAI streams."""
        message = answer["choices"][0]["message"]
        base = {key: answer[key] for key in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"
        deltas: list[dict[str, Any]] = [
            {"content": (" " if i else "") + word}
            for i, word in enumerate((message["content"] or "").split(" "))
            if message["content"]
        ]
        for index, call in enumerate(message.get("tool_calls") or []):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            deltas.append(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
            for piece in (arguments[:half], arguments[half:]):
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        chunks = [{**base, "choices": [{"index": 0, "delta": delta}]} for delta in deltas]
        finish = answer["choices"][0]["finish_reason"]
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        chunks.append({**base, "choices": [], "usage": answer["usage"]})
        lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
        return "".join(lines).encode()

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """As OpenAI answers: `n` choices (1 by default), each a distinct text. Offered tools,
        it calls the first with the question as `query`; given a tool's result, it answers
        with that result."""
        wanted = max(1, int(request.get("n") or 1))
        with self._lock:
            self.calls += 1
            self.last_request = request
            numbers = [next(self._counter) for _ in range(wanted)]
        messages = request.get("messages") or [{}]
        question = str(messages[-1].get("content", ""))[:200]
        tools = request.get("tools") or []
        if tools and request.get("tool_choice") != "none" and messages[-1].get("role") != "tool":
            return self._tool_call(request, numbers[0], tools[0]["function"]["name"], question)
        if messages[-1].get("role") == "tool":
            question = f"tool result {question}"
        return {
            "id": f"chatcmpl-{numbers[0]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "fixed-latency"),
            "choices": [
                {
                    "index": index,
                    "message": {
                        "role": "assistant",
                        "content": f"Answer {number}: a reply to «{question}».",
                    },
                    "finish_reason": "stop",
                }
                for index, number in enumerate(numbers)
            ],
            "usage": {
                "prompt_tokens": 10,
                "completion_tokens": 12 * wanted,
                "total_tokens": 10 + 12 * wanted,
            },
            "timings": _TIMINGS,
        }

    @staticmethod
    def _tool_call(request: dict[str, Any], number: int, tool: str, query: str) -> dict[str, Any]:
        call = {
            "id": f"call_{number}",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps({"query": query})},
        }
        return {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", "fixed-latency"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22},
            "timings": _TIMINGS,
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; with Nagle's algorithm on, the client's
            # delayed ACK would add ~40 ms to every answer and blur the benchmark.
            disable_nagle_algorithm = True

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                server.last_authorization = self.headers.get("Authorization", "")
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    request = {}
                if self.path.endswith("/release"):
                    server.release()
                    self.send_response(204)
                    self.end_headers()
                    return
                server.wait()
                status, body = server.respond(request)
                try:
                    self.send_response(status)
                    streamed = request.get("stream") and body.startswith(b"data:")
                    kind = "text/event-stream" if streamed else "application/json"
                    self.send_header("Content-Type", kind)
                    if streamed and server.drip_s:
                        self.send_header("Connection", "close")  # the end of the body
                        self.end_headers()
                        for event in body.split(b"\n\n"):
                            time.sleep(server.drip_s)
                            self.wfile.write(event + b"\n\n")
                            self.wfile.flush()
                        self.close_connection = True
                        return
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left, as clients do

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        return Handler


class FaultyLLM(FixedLatencyLLM):
    """The fixed-latency endpoint, with one fault switched on at a time."""

    fault = ""  # "", "rate_limit", "server_error", "bad_request", "garbage"
    failures_left = -1  # with a fault: how many calls fail before it clears (-1: all)

    def respond(self, request: dict[str, Any]) -> tuple[int, bytes]:
        with self._lock:
            failing = bool(self.fault) and self.failures_left != 0
            if failing and self.failures_left > 0:
                self.failures_left -= 1
        if not failing:
            return super().respond(request)
        if self.fault == "rate_limit":
            return 429, b'{"error": {"message": "Rate limit reached", "type": "rate_limit"}}'
        if self.fault == "server_error":
            return 500, b'{"error": {"message": "Internal error", "type": "server_error"}}'
        if self.fault == "bad_request":
            return 400, b'{"error": {"message": "Unknown parameter", "type": "invalid_request"}}'
        return 200, b"<html>Bad gateway</html> this is not JSON"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency", type=float, default=1.0)
    args = parser.parse_args()
    llm = FixedLatencyLLM(latency_s=args.latency, port=args.port).start()
    print(f"Serving {llm.api_base} with {args.latency} s latency", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        llm.stop()


if __name__ == "__main__":
    main()
