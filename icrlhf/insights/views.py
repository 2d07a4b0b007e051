from django.conf import settings
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.safestring import SafeString, mark_safe

from icrlhf.insights.charts import Series, line_chart, nice_ceiling
from icrlhf.insights.selectors import (
    RELEVANT_SIMILARITY,
    Holdout,
    Rewards,
    ServingDay,
    Window,
    call_log_journal,
    queue_calls,
    queue_dashboard,
    queue_model_pace,
)
from icrlhf.queues.access import is_admin, queue_for_member, review_check
from icrlhf.review import guard


def _outcomes(windows: list[Window], x_title: str) -> str:
    return line_chart(
        title=f"Outcomes by {x_title}",
        x_title=x_title,
        x_labels=[w.label for w in windows],
        series=[
            Series("accepted as is", "#1d7a3a", [w.rate(w.chosen) for w in windows]),
            Series("…from memory", "#6bbf7f", [w.rate(w.chosen_from_memory) for w in windows]),
            Series("edited", "#0b5cad", [w.rate(w.edited) for w in windows]),
            Series("none acceptable", "#b3261e", [w.rate(w.none_acceptable) for w in windows]),
        ],
    )


def _seconds(windows: list[Window], x_title: str) -> str:
    values = [w.median_seconds for w in windows]
    return line_chart(
        title=f"Median time per decision by {x_title}",
        x_title=x_title,
        x_labels=[w.label for w in windows],
        series=[Series("seconds", "#8a5a00", values)],
        y_max=nice_ceiling(max([v for v in values if v is not None] or [1.0])),
        y_label=lambda v: f"{v:g} s",
    )


def _serving_charts(days: list[ServingDay], labels: list[str]) -> dict[str, str]:
    calls = [float(day.calls) for day in days]
    # Seconds: an LLM answer takes seconds, and "12.5 s" fits the axis where "12500 ms" does not.
    latencies = [None if day.latency_p95_ms is None else day.latency_p95_ms / 1000 for day in days]
    return {
        "calls": line_chart(
            title="Gateway calls per day",
            x_title="day",
            x_labels=labels,
            series=[
                Series("calls", "#0b5cad", calls),
                Series("failed", "#b3261e", [float(day.failed) for day in days]),
            ],
            y_max=nice_ceiling(max(calls)),
            y_label=lambda v: f"{v:g}",
        ),
        "memory_share": line_chart(
            title="What memory did for gateway calls",
            x_title="day",
            x_labels=labels,
            series=[
                Series("examples retrieved", "#0f766e", [d.rate(d.memory_used) for d in days]),
                Series("answered from memory", "#6bbf7f", [d.rate(d.from_memory) for d in days]),
            ],
        ),
        "latency": line_chart(
            title="Gateway latency, 95th percentile",
            x_title="day",
            x_labels=labels,
            series=[Series("p95", "#8a5a00", latencies)],
            y_max=nice_ceiling(max([v for v in latencies if v is not None] or [1.0])),
            y_label=lambda v: f"{v:g} s",
        ),
    }


def _holdout_chart(holdout: Holdout, labels: list[str]) -> str:
    arms = [
        ("with memory", "#1d7a3a", [day[0] for day in holdout.by_day]),
        ("held out", "#b3261e", [day[1] for day in holdout.by_day]),
    ]
    return line_chart(
        title="Served answers reviewers accepted as they were (95% intervals)",
        x_title="day",
        x_labels=labels,
        series=[
            Series(name, colour, [a.rate for a in days], [a.interval for a in days])
            for name, colour, days in arms
        ],
    )


def _rewards_chart(rewards: Rewards, labels: list[str]) -> str:
    arms = [
        ("with memory", "#1d7a3a", [day[0].mean for day in rewards.by_day]),
        ("held out", "#b3261e", [day[1].mean for day in rewards.by_day]),
    ]
    highest = max((v for _, _, values in arms for v in values if v is not None), default=1.0)
    return line_chart(
        title="Mean reward of agent runs",
        x_title="day",
        x_labels=labels,
        series=[Series(name, colour, values) for name, colour, values in arms],
        y_max=nice_ceiling(highest),
        y_label=lambda v: f"{v:g}",
    )


def queue_dashboard_page(request: HttpRequest, slug: str) -> HttpResponse:
    queue = queue_for_member(request.user, slug=slug)
    board = queue_dashboard(queue=queue)
    day_labels = [day.strftime("%b %d") for day in board.days]
    stored = board.memory.preferred_by_day
    charts = {
        "outcomes_by_count": _outcomes(board.by_count, "decision count"),
        "outcomes_by_day": _outcomes(board.by_day, "day"),
        "time_by_count": _seconds(board.by_count, "decision count"),
        "time_by_day": _seconds(board.by_day, "day"),
        "memory": line_chart(
            title="Preferred examples stored",
            x_title="day",
            x_labels=day_labels,
            series=[Series("stored", "#5b3cc4", [float(n) for n in stored])],
            y_max=nice_ceiling(stored[-1]),
            y_label=lambda v: f"{v:g}",
        ),
        **_serving_charts(board.serving.by_day, day_labels),
        "holdout": _holdout_chart(board.holdout, day_labels),
        "rewards": _rewards_chart(board.rewards, day_labels),
        "automation": line_chart(
            title="Applied without review, and audited precision (95% intervals)",
            x_title="day",
            x_labels=day_labels,
            series=[
                Series("share automated", "#0b5cad", [d.share for d in board.automation.by_day]),
                Series(
                    "audited precision",
                    "#1d7a3a",
                    [d.audit.rate for d in board.automation.by_day],
                    [d.audit.interval for d in board.automation.by_day],
                ),
            ],
        ),
        "retrieval": line_chart(
            title="Generations whose retrieval found a relevant example",
            x_title="day",
            x_labels=day_labels,
            series=[Series("relevant", "#0f766e", board.retrieval.relevant_by_day)],
        ),
    }
    # Every label in these SVGs is escaped by line_chart, the rest are numbers: safe to insert.
    safe: dict[str, SafeString] = {name: mark_safe(svg) for name, svg in charts.items()}  # noqa: S308
    context = {
        "queue": queue,
        "board": board,
        "charts": safe,
        "relevant_similarity": RELEVANT_SIMILARITY,
        "automation_pause": guard.pause_active(queue),
    }
    return render(request, "insights/dashboard.html", context)


CALLS_PER_PAGE = 50


def queue_calls_page(request: HttpRequest, slug: str) -> HttpResponse:
    """The gateway's log for one queue: each call, what shaped it and how long it took."""
    queue = queue_for_member(request.user, slug=slug)
    # Calls hold what end users wrote: reviewers and curators of the queue only.
    review_check(request.user, queue)
    page = Paginator(queue_calls(queue=queue), CALLS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "queue": queue,
        "page": page,
        "upstream_detail": is_admin(request.user),
        "journal": call_log_journal(user=request.user),
        "pace": queue_model_pace(queue=queue),
        "deadline_s": settings.GATEWAY_CALL_DEADLINE_S,
    }
    return render(request, "insights/calls.html", context)
