from typing import ClassVar

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from icrlhf.integrations.database import StampedModel, StampedQuerySet

MAX_CANDIDATES = 8
# Chosen on the learning benchmark (`manage.py bench_learning`, its minimum-similarity sweep,
# docs/benchmarks.md): the highest minimum whose first-candidate accuracy and acceptance stayed
# within two held-out messages of the best; it keeps every off-topic request away from memory
# (0.2 let all of them reach it, 0.3 one in twelve).
DEFAULT_MIN_SIMILARITY = 0.4


class Queue(StampedModel):
    rows_stamp: ClassVar[str] = "queue-rows"  # the gateway keeps the rows of the queues it serves
    objects = StampedQuerySet["Queue"].as_manager()

    class Kind(models.TextChoices):
        GENERAL = "general", "General"
        TRIAGE = "triage", "Support triage"

    class ExampleFraming(models.TextChoices):
        REFERENCE = "reference", "quoted reference material (no one can ask for them back)"
        TURNS = "turns", "earlier turns of the conversation (a user can ask for them back)"

    class FormatExamples(models.TextChoices):
        OFF = "off", "off"
        TOKEN = "token", "from the calls of the calling token only"
        QUEUE = (
            "queue",
            (
                "from the calls of every token of the queue (shares only the form of tool calls: "
                "tool and argument names, never words or values)"
            ),
        )

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.GENERAL)
    system_prompt = models.TextField(default="You are a helpful assistant. Answer concisely.")
    model = models.CharField(
        max_length=200, blank=True, help_text="A litellm model name; empty uses LLM_MODEL."
    )
    api_base = models.URLField(
        "API base URL",
        blank=True,
        help_text="The model's endpoint, for OpenAI-compatible servers; empty uses LLM_API_BASE.",
    )
    temperature = models.FloatField(
        default=0.7, validators=[MinValueValidator(0.0), MaxValueValidator(2.0)]
    )
    max_tokens = models.PositiveIntegerField(
        default=256, validators=[MinValueValidator(1), MaxValueValidator(8192)]
    )
    n_candidates = models.PositiveSmallIntegerField(
        "candidates per item",
        default=4,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_CANDIDATES)],
    )
    k_examples = models.PositiveSmallIntegerField(
        "examples retrieved", default=5, validators=[MaxValueValidator(50)]
    )
    example_framing = models.CharField(
        "examples are sent as",
        max_length=10,
        choices=ExampleFraming.choices,
        default=ExampleFraming.REFERENCE,
        help_text="Examples are other customers' requests and answers. As turns, a user who "
        "asks the model to repeat the conversation may receive them.",
    )
    example_rewards = models.BooleanField(
        "rewards beside examples",
        default=False,
        help_text="Each retrieved example is sent with its reward (0 rejected … 1 preferred; a "
        "reviewer's rating or the application's reward where there is one), together with "
        "the answers its reviewer rejected for the same request and theirs, so that the model "
        "sees what scored low as well as what scored high (in-context RL, 'Reward is "
        "Enough'). The learning benchmark measures it (docs/benchmarks.md).",
    )
    format_examples_from = models.CharField(
        "format examples",
        max_length=10,
        choices=FormatExamples.choices,
        # Off: the default model calls tools on its own, and other tool sets' calls made it
        # call less often (docs/benchmarks.md, the local models: BFCL).
        default=FormatExamples.OFF,
        help_text="When fewer than k stored steps were made with the tools a request offers, "
        "the places left may go to stored tool calls of other tool sets, to show how a call "
        "is written (it helps a model that answers in prose where it should call a tool; a "
        "model that calls tools on its own does better without: docs/benchmarks.md, BFCL). "
        "Only the form of each call is sent: the tool's name and "
        "the names of its arguments, each value replaced by a placeholder of its type; "
        "never the request, the words beside the call, the argument values or the tools' "
        "results. Their tools are not offered, and a call naming a tool the request did not "
        "offer is never returned. They are chosen by the tools they call, not by how similar "
        "their requests are, and carry nothing of those requests: the minimum similarity "
        "does not apply to them.",
    )
    min_similarity = models.FloatField(
        "minimum similarity",
        default=DEFAULT_MIN_SIMILARITY,
        validators=[MinValueValidator(-1.0), MaxValueValidator(1.0)],
        help_text="Stored examples less similar than this (cosine) to a request are left out "
        "of its prompt and never offered or served as its answer; the item page lists them. "
        "Pinned examples stay in every prompt. -1: no minimum.",
    )
    memory_candidates = models.PositiveSmallIntegerField(
        default=1,
        validators=[MaxValueValidator(MAX_CANDIDATES)],
        help_text="Up to this many candidates are the preferred answers of the most similar "
        "stored examples (distinct ones), instead of LLM calls.",
    )
    memory_min_similarity = models.FloatField(
        default=0.8,
        validators=[MinValueValidator(-1.0), MaxValueValidator(1.0)],
        help_text="A stored answer is offered as a candidate only from this similarity up.",
    )
    memory_answer_threshold = models.FloatField(
        "answer from memory at",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Gateway calls whose nearest preferred example is at least this similar "
        "(cosine) get its answer, with no LLM call. Empty: always ask the model.",
    )
    memory_answer_confidence = models.FloatField(
        "answer from memory at confidence",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.5), MaxValueValidator(1.0)],
        help_text="Gateway calls whose best answer from memory is at least this likely to be "
        "what a reviewer keeps (the memory-only confidence, calibrated on this queue's "
        "decisions) get it, with no LLM call. Empty: off. Either rule answers from memory.",
    )
    reward_threshold = models.FloatField(
        "store rewarded runs as memory at reward",
        null=True,
        blank=True,
        validators=[MinValueValidator(-1e6), MaxValueValidator(1e6)],
        help_text="When the application posts a reward (or success: 1, failure: 0) on a run "
        "or a call, its steps are stored as preferred examples at or above this reward and as "
        "rejected ones below it. Empty: feedback is kept but never reaches memory.",
    )
    rewards_need_approval = models.BooleanField(
        "rewarded runs need a reviewer's approval",
        default=False,
        help_text="Rewarded runs wait on their page until a reviewer or curator approves "
        "them into memory (or declines); nothing reaches memory before.",
    )
    capture_low_reward = models.BooleanField(
        "review the steps of runs rewarded below the bar",
        default=False,
        help_text="A run (or a call) the application rewards below the reward rule's "
        "threshold, or reports as failed, sends its steps to review: reviewers see the state "
        "and N candidate next actions made with the same tools. Calls more than a day old "
        "are not captured.",
    )
    # When "review the steps of runs rewarded below the bar" was last turned on (queue_save,
    # routing_update): only runs rewarded from then on are captured, never those rewarded
    # before the rule existed. Empty where it was turned on before this was recorded.
    capture_low_reward_since = models.DateTimeField(null=True, blank=True, editable=False)
    low_reward_captures_per_run = models.PositiveSmallIntegerField(
        "steps of one run sent to review at most",
        default=3,
        validators=[MinValueValidator(1), MaxValueValidator(50)],
        help_text="A run rewarded below the bar sends at most this many of its steps to "
        "review (its earliest), each costing N−1 generations; they count against the "
        "token's item limit. The run's page says when the cap left steps out.",
    )
    memory_answers_need_approval = models.BooleanField(
        "answers from memory need a curator's approval",
        default=False,
        help_text="Serve a stored answer as is only once a curator approved that example "
        "(the examples list's action); others still reach prompts.",
    )
    # Routing of gateway calls (curators edit them on the queue's routing page; each change is
    # audited in RoutingChange).
    capture_percent = models.PositiveSmallIntegerField(
        "capture share (%)",
        default=0,
        validators=[MaxValueValidator(100)],
        help_text="This share of gateway calls becomes review items, chosen at random.",
    )
    capture_below_similarity = models.FloatField(
        "coverage threshold",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Gateway calls whose nearest preferred example is less similar than this "
        "(cosine), which memory does not cover, always become review items. Empty: off.",
    )
    holdout_percent = models.PositiveSmallIntegerField(
        "holdout share (%)",
        default=0,
        validators=[MaxValueValidator(100)],
        help_text="This share of gateway calls is answered without memory, at random, to "
        "measure what memory is worth; the caller cannot tell.",
    )
    auto_apply_threshold = models.FloatField(
        "apply automatically at",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.5), MaxValueValidator(1.0)],
        help_text="Items whose first candidate is at least this likely to be accepted (the "
        "calibrated confidence) are applied without review. Empty: off.",
    )
    audit_percent = models.PositiveSmallIntegerField(
        "audit share (%)",
        default=10,
        validators=[MaxValueValidator(100)],
        help_text="This share of automatically applied items still goes to review, chosen at "
        "random, to measure the automation's precision.",
    )
    blind_percent = models.PositiveSmallIntegerField(
        "blind share (%)",
        default=10,
        validators=[MaxValueValidator(100)],
        help_text="This share of items, drawn at random, is shown to reviewers in random order "
        "and without the confidence, to measure how much the order sways them (the dashboard "
        "compares the first candidate's acceptance blind and not).",
    )
    example_token_budget = models.PositiveIntegerField(
        default=1500, help_text="Retrieved examples are added whole until this budget is reached."
    )
    reviewers_per_item = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(5)],
        help_text="Above 1, each reviewer decides independently and agreement is recorded.",
    )
    reflect_after = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Reflect on the playbook by itself once this many new decisions lost the first "
        "candidate (the proposal still waits for a curator). Empty: only on demand.",
    )
    reason_tags = models.JSONField(
        default=list,
        blank=True,
        help_text='Reasons a reviewer can tick, e.g. ["wrong facts", "too long", "rude"].',
    )
    categories = models.JSONField(
        default=list,
        blank=True,
        help_text="The labels an answer is one of: a triage queue files tickets under them; "
        "in a general queue whose answers are labels (intents), memory's votes count the label "
        "an answer names, not its exact words.",
    )
    webhook_url = models.URLField(
        blank=True,
        help_text="Each decision (and each undo) is POSTed here as JSON, retried until the "
        "receiver answers 2xx.",
    )
    webhook_secret = models.CharField(
        max_length=200,
        blank=True,
        help_text="Signs each webhook body (HMAC-SHA256, header X-Icrlhf-Signature).",
    )
    prune_min_retrievals = models.PositiveIntegerField(
        default=5, help_text="Automatic pruning looks at examples retrieved at least this often…"
    )
    prune_max_utility = models.FloatField(
        default=0.3,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="…and retires those whose utility is below this (pinned ones never).",
    )
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        through="Membership",
        blank=True,
        related_name="queues",
        help_text="Who may see this queue, each with a role in it (superusers see every queue).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(n_candidates__gte=1, n_candidates__lte=MAX_CANDIDATES),
                name="queue_n_candidates_1_to_8",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def llm_model(self) -> str:
        """The litellm model the queue's calls go to: its own, or the install's LLM_MODEL."""
        return self.model or settings.LLM_MODEL


class Membership(models.Model):
    """A user's place in one queue, and their role there: a role never reaches another queue.
    (Admins, the install's superusers and its `admin` group, are above queues.)"""

    class Role(models.TextChoices):
        VIEWER = "viewer", "Viewer (sees the queue, cannot decide)"
        REVIEWER = "reviewer", "Reviewer (creates items, decides)"
        CURATOR = "curator", "Curator (also curates memory, routing, import and export)"

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.REVIEWER)

    class Meta:
        # The table Django made for the plain many-to-many before roles were per queue.
        db_table = "queues_queue_members"
        unique_together = [("queue", "user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.queue}: {self.role}"


class Item(models.Model):
    class Status(models.TextChoices):
        NEW = "new", "New"
        GENERATING = "generating", "Generating"
        READY = "ready", "Ready for review"
        DECIDED = "decided", "Decided"
        AUTOMATED = "automated", "Applied automatically"
        FAILED = "failed", "Failed"

    class Source(models.TextChoices):
        UI = "ui", "Web"
        API = "api", "API"
        IMPORT = "import", "Import"
        GATEWAY = "gateway", "Gateway"

    class Priority(models.TextChoices):
        LOW = "low", "Low"
        NORMAL = "normal", "Normal"
        HIGH = "high", "High"
        URGENT = "urgent", "Urgent"

    class TicketStatus(models.TextChoices):
        NEW = "new", "New"
        OPEN = "open", "Open"
        PENDING = "pending", "Pending"
        SOLVED = "solved", "Solved"

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="items")
    input_text = models.TextField()
    subject = models.CharField(max_length=500, blank=True)
    body = models.TextField(blank=True)
    customer = models.CharField(max_length=200, blank=True)
    channel = models.CharField(max_length=50, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.NEW)
    priority = models.CharField(max_length=10, choices=Priority.choices, default=Priority.NORMAL)
    sla_due_at = models.DateTimeField(null=True, blank=True)
    ticket_status = models.CharField(
        max_length=10, choices=TicketStatus.choices, default=TicketStatus.NEW
    )
    category = models.CharField(max_length=200, blank=True)
    triaged_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.UI)
    external_id = models.CharField(max_length=200, blank=True)
    metadata = models.JSONField(
        default=dict, blank=True, help_text="The sender's own fields, returned as sent."
    )
    # A captured gateway call: the caller's messages (the last one included) and its tool
    # and output fields. The candidates are generated as the next step of that conversation.
    conversation = models.JSONField(default=list, blank=True)
    call_options = models.JSONField(default=dict, blank=True)
    agreement = models.FloatField(
        null=True,
        blank=True,
        help_text="With several reviewers: the share of reviewer pairs that gave the same verdict.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["queue", "status", "created_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "external_id"],
                condition=~models.Q(external_id=""),
                name="item_unique_external_id_per_queue",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.input_text[:60]}"


class RoutingChange(models.Model):
    """An audited change to a queue's routing rules: who, when, each field's old and new."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, related_name="routing_changes")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now_add=True)
    # {"field": [old, new]}
    changes = models.JSONField()

    class Meta:
        ordering = ["-changed_at", "-pk"]

    def __str__(self) -> str:
        return f"Routing of {self.queue} changed by {self.changed_by} at {self.changed_at}"
