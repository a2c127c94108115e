"""Create the demo ops user and demo tenant (if absent) and print how to log in.

Passwords are random, made once and kept in var/demo-logins.txt (git-ignored), so a
demo machine never runs with a well-known password.
"""

import json
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from nodes import selectors as node_selectors
from nodes import services as node_services
from nodes.allowlist import allowlisted
from tenants import services
from tenants.models import Image, LaunchTemplate, LedgerEntry, Membership

# The allowlist a fresh demo starts with (ops edit it on /ops/images/): only images the
# demo's nodes hold, since nothing can be pulled there. On the node lab (make run's far end
# where it can start) these are built on each lab node at start: the workload, and small
# stand-ins that do what they say (a real OpenSSH sshd, an HTTP service, JupyterLab on the
# machine's python3), each running the GPU job too. The emulated far end holds any image.
LAB_IMAGE = "gpuplatform-lab/workload:1"
LAB_SSH_IMAGE = "gpuplatform-lab/ssh:1"
LAB_HTTP_IMAGE = "gpuplatform-lab/http:1"
LAB_JUPYTER_IMAGE = "gpuplatform-lab/jupyter:1"
DEMO_IMAGES: list[dict[str, object]] = [
    {
        "name": "GPU workload (lab)",
        "reference": LAB_IMAGE,
        "description": "The node lab's small CUDA job: holds VRAM along WORKLOAD_PROFILE "
        "(steady, ramp, leak, burst, oom, idle, bandwidth) from WORKLOAD_MB, and says "
        "what it does in its log.",
        "ports": [],
        "connect": Image.Connect.SERVICE,
    },
    {
        "name": "SSH (lab)",
        "reference": LAB_SSH_IMAGE,
        "description": "OpenSSH's sshd on port 22 with your key from the launch, as user "
        "renter, beside the lab's CUDA job: log in with ssh -J through the gateway.",
        "ports": [22],
        "connect": Image.Connect.SSH,
        "ssh_user": "renter",
    },
    {
        "name": "HTTP service (lab)",
        "reference": LAB_HTTP_IMAGE,
        "description": "A small web service on port 8000 (a page and an OpenAI-style "
        "/v1/models) beside the lab's CUDA job: open it with ssh -L through the gateway.",
        "ports": [8000],
        "connect": Image.Connect.SERVICE,
    },
    {
        "name": "Jupyter (lab)",
        "reference": LAB_JUPYTER_IMAGE,
        "description": "JupyterLab on port 8888 as user renter (not root), with a token of "
        "the slice's own that the platform gives it, beside the lab's CUDA job.",
        "ports": [8888],
        "connect": Image.Connect.JUPYTER,
    },
]
# Templates on the demo's images (an engine template needs its engine's image, which the
# lab's nodes do not hold: ops add those on real nodes, docs/templates.md).
DEMO_TEMPLATES: list[dict[str, object]] = [
    {
        "name": "SSH workspace",
        "image": "SSH (lab)",
        "description": "Log in with ssh -J through the gateway; a small model for the check. "
        "Mount a volume at /home/renter to keep your home across stops.",
        "model_request": {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048},
    },
    {
        "name": "Model server",
        "image": "HTTP service (lab)",
        "description": "An OpenAI-style endpoint on port 8000, reached with ssh -L.",
        "model_request": {"model": {"catalog": "Qwen/Qwen2.5-1.5B"}, "context_tokens": 4096},
    },
    {
        "name": "Jupyter",
        "image": "Jupyter (lab)",
        "description": "JupyterLab, opened from the slice page (or with ssh -L through the "
        "gateway); the slice's own token, on the page for its tenant's members.",
        "model_request": {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048},
    },
]
DEMO_CREDIT = "50.00"

OPS_EMAIL = "ops@example.com"
TENANT_EMAIL = "demo@example.com"
TENANT_NAME = "Demo Lab"


class Command(BaseCommand):
    help = "Create the demo ops user and demo tenant user if absent; print the logins."

    def handle(self, *args: object, **options: object) -> None:
        path = settings.VAR_DIR / "demo-logins.json"
        logins = json.loads(path.read_text()) if path.exists() else {}
        User = get_user_model()
        with transaction.atomic():
            if not User.objects.filter(username=OPS_EMAIL).exists():
                password = secrets.token_urlsafe(12)
                User.objects.create_user(
                    username=OPS_EMAIL,
                    email=OPS_EMAIL,
                    password=password,
                    is_staff=True,
                    is_superuser=True,
                )
                logins[OPS_EMAIL] = password
            if not User.objects.filter(username=TENANT_EMAIL).exists():
                password = secrets.token_urlsafe(12)
                services.tenant_sign_up(
                    email=TENANT_EMAIL, password=password, tenant_name=TENANT_NAME
                )
                logins[TENANT_EMAIL] = password
            ops = User.objects.get(username=OPS_EMAIL)
            for spec in DEMO_IMAGES:
                if not Image.objects.filter(name=spec["name"]).exists():
                    services.image_create(actor=ops, **spec)
            for spec in DEMO_TEMPLATES:
                image = Image.objects.filter(name=spec["image"], is_active=True).first()
                if image and not LaunchTemplate.objects.filter(name=spec["name"]).exists():
                    services.template_create(actor=ops, **{**spec, "image": image})
            # The production policy has no probe image; the demo's nodes run the lab's
            # (its command and environment defaults are that image's knobs).
            if not node_selectors.preflight_policy().probe_image and allowlisted(LAB_IMAGE):
                node_services.preflight_policy_update(
                    actor=ops,
                    reason="demo: the lab's workload image probes the demo nodes",
                    probe_image=LAB_IMAGE,
                )
            demo = Membership.objects.filter(user__username=TENANT_EMAIL).first()
            if demo and not LedgerEntry.objects.filter(tenant=demo.tenant).exists():
                services.credit_grant(
                    tenant=demo.tenant, amount=DEMO_CREDIT, actor=ops, memo="Demo credit"
                )
        path.write_text(json.dumps(logins, indent=2))
        path.chmod(0o600)
        tenant = Membership.objects.filter(user__username=TENANT_EMAIL).select_related("tenant")
        tenant_name = tenant[0].tenant.name if tenant else "?"
        self.stdout.write(self.style.SUCCESS("gpuplatform demo logins"))
        self.stdout.write(f"  URL:    {settings.SITE_URL}/")
        for email, role in ((OPS_EMAIL, "ops (staff)"), (TENANT_EMAIL, f"owner of {tenant_name}")):
            password = logins.get(email, "(set before this machine kept logins; reset it)")
            self.stdout.write(f"  {role:<22} {email} / {password}")
