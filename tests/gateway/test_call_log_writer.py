"""`manage.py call_log_writer`, the call log's writer as a process of its own: what it says
where there is nothing to write. Its writing, as make run runs it beside two gateway
processes, is tested with the real processes (tests/integration/test_gateway_processes.py)."""

import pytest
from django.core.management import CommandError, call_command


def test_without_redis_the_writer_says_there_is_no_journal_and_where_rows_go() -> None:
    # The tests' cache is in the process's memory: each gateway writes its rows in place.
    with pytest.raises(CommandError, match="no journal.*in place.*CACHE_URL"):
        call_command("call_log_writer")
