"""The node agent as the platform knows it: its health on each node, and what its journal
reported (nodes/agent.py runs on the node; nodes/services/agent.py installs and pulls it).
Imported by nodes.models, where Django finds the app's models."""

from django.db import models
from django.db.models import Q


class AgentState(models.TextChoices):
    UNKNOWN = "unknown", "not checked yet"
    OK = "ok", "running"
    ABSENT = "absent", "not installed"
    OLD = "old", "an older version"
    SILENT = "silent", "not answering"


class NodeAgent(models.Model):
    node = models.OneToOneField(
        "nodes.Node",
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="agent",
        verbose_name="node",
    )
    state = models.CharField(
        "agent", max_length=16, choices=AgentState.choices, default=AgentState.UNKNOWN
    )
    reason = models.CharField("why", max_length=500, blank=True)
    version = models.CharField("version running", max_length=32, blank=True)
    checked_at = models.DateTimeField("last checked", null=True, blank=True)
    healthy_at = models.DateTimeField("last seen running", null=True, blank=True)
    installed_at = models.DateTimeField("last installed", null=True, blank=True)
    journal_id = models.CharField("journal", max_length=64, blank=True)
    cursor = models.PositiveBigIntegerField("journal read up to", default=0)
    kill_strays = models.BooleanField(
        "end stray processes",
        default=False,
        help_text="Processes on a card in no platform container are ended, not only "
        "reported. Off where ops run their own maintenance on the node.",
    )

    class Meta:
        verbose_name = "node agent"

    def __str__(self) -> str:
        return f"agent on node {self.node_id}: {self.state}"


class AgentEntry(models.Model):
    """One journal entry as the agent wrote it on the node (kill, harm, stray, start,
    exit, error): the evidence, kept as reported."""

    class Kind(models.TextChoices):
        KILL = "kill", "stopped a container over its quota"
        HARM = "harm", "a neighbour short of its quota"
        STRAY = "stray", "a process in no platform container"
        START = "start", "started"
        EXIT = "exit", "died and was restarted"
        ERROR = "error", "could not read the GPUs"

    node = models.ForeignKey(
        "nodes.Node", on_delete=models.CASCADE, related_name="agent_entries", verbose_name="node"
    )
    journal_id = models.CharField("journal", max_length=64)
    seq = models.PositiveBigIntegerField("sequence")
    kind = models.CharField("kind", max_length=16)
    at = models.DateTimeField("written at")
    container_id = models.CharField("container ID", max_length=128, blank=True)
    payload = models.JSONField("entry", default=dict)
    received_at = models.DateTimeField("received", auto_now_add=True)
    filed_at = models.DateTimeField(
        "filed",
        null=True,
        blank=True,
        help_text="When the hooks (incidents) took it; an entry they failed on is offered "
        "again at the next check.",
    )

    class Meta:
        ordering = ["node", "seq"]
        verbose_name = "node agent entry"
        verbose_name_plural = "node agent entries"
        constraints = [
            models.UniqueConstraint(
                fields=["node", "journal_id", "seq"],
                name="%(app_label)s_%(class)s_once",
                violation_error_message="A journal entry is stored once.",
            ),
            models.CheckConstraint(
                condition=~Q(journal_id=""),
                name="%(app_label)s_%(class)s_journal_named",
                violation_error_message="An entry belongs to a journal.",
            ),
        ]
        indexes = [models.Index(fields=["container_id"], name="nodes_agententry_container")]

    def __str__(self) -> str:
        return f"{self.kind} #{self.seq} on node {self.node_id}"
