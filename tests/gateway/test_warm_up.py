"""The gateway's start-up pays what its first burst of calls would: every thread of its pool
started, each with its database connection open."""

import threading

import pytest
from django.conf import settings
from django.db import connection

from icrlhf.gateway import in_flight, views


@pytest.mark.django_db(transaction=True)
def test_every_pool_thread_is_started_with_its_connection_open() -> None:
    views.warm_up()

    threads = list(in_flight.threads._threads)
    assert len(threads) == settings.GATEWAY_THREADS
    connected = threading.Barrier(settings.GATEWAY_THREADS)

    def already_connected() -> bool:
        is_open = connection.connection is not None
        connected.wait(timeout=10)  # holds each thread, so that every one answers once
        return is_open

    answers = [in_flight.threads.submit(already_connected) for _ in threads]
    assert all(answer.result() for answer in answers)
