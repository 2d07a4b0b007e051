"""A kind written the way a new kind is: this package, and one line that installs it
(tests/kinds/test_adding_a_kind.py adds the line the tests' way). Its queues ask the model to
repeat each request word for word; everything else it takes from the general kind, its item
page templates included."""

from icrlhf.kinds.base import QueueKind
from icrlhf.queues.models import Queue

ECHO_INSTRUCTIONS = "Repeat the request word for word."


class EchoKind(QueueKind):
    name = "echo"

    def instructions(self, queue: Queue) -> str:
        return ECHO_INSTRUCTIONS
