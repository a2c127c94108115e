"""Launch templates: what ops prepare on an allowlisted image (the command, ports come from
the image, the job the estimate reads, and the engine) so a tenant picks one and adjusts."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class LaunchTemplate(models.Model):
    class Engine(models.TextChoices):
        NONE = "", "none (the program sizes itself)"
        VLLM = "vllm", "vLLM"
        SGLANG = "sglang", "SGLang"
        OLLAMA = "ollama", "Ollama"
        PYTORCH = "pytorch", "PyTorch (Jupyter, scripts)"

    name = models.CharField("name", max_length=64, unique=True)
    description = models.CharField("description", max_length=300, blank=True)
    image = models.ForeignKey(
        "tenants.Image",
        on_delete=models.PROTECT,
        related_name="templates",
        verbose_name="image",
    )
    engine = models.CharField(
        "engine",
        max_length=16,
        choices=Engine.choices,
        blank=True,
        default=Engine.NONE,
        help_text="vLLM and SGLang get a memory fraction sized to the slice at start.",
    )
    command = models.JSONField("command (argv)", default=list, blank=True)
    environment = models.JSONField("environment", default=dict, blank=True)
    model_request = models.JSONField(
        "the job, for the estimate",
        default=dict,
        blank=True,
        help_text='As a launch takes it, e.g. {"model": {"catalog": "Qwen/Qwen2.5-1.5B"}, '
        '"engine": "vllm", "context_tokens": 4096}.',
    )
    is_active = models.BooleanField("offered", default=True)
    created_at = models.DateTimeField("added", auto_now_add=True)
    updated_at = models.DateTimeField("changed", auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "launch template"
        constraints = [
            models.CheckConstraint(
                condition=Q(engine__in=["", "vllm", "sglang", "ollama", "pytorch"]),
                name="%(app_label)s_%(class)s_known_engine",
                violation_error_message="The engine is one of vllm, sglang, ollama, pytorch.",
            ),
        ]

    def __str__(self) -> str:
        return self.name
