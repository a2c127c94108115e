"""Objects made the way the platform makes them (through its services), for the API
contracts of every app: an ops user, a paid purchase, a queued slice, a volume, a launch
template."""

from django.contrib.auth.models import User

from nodes.models import Gpu, Node
from tenants import services
from tenants.models import Image, LaunchTemplate, Membership, Purchase, Slice, Tier, Volume
from tests.factories import UserFactory

CONTRACT_IMAGE = "contract"


def ops_actor() -> User:
    """The ops user who grants credit and keeps the allowlist in these objects' history."""
    return UserFactory(email="contract-ops@platform.test", is_staff=True)


def paid_purchase(membership: Membership) -> Purchase:
    """One hour of the 4 GB tier, paid from credit ops granted."""
    services.credit_grant(tenant=membership.tenant, amount="10.00", actor=ops_actor(), memo="test")
    tier = Tier.objects.get(vram_mb=4096)
    purchase, _ = services.purchase_create(membership=membership, tier=tier, hours=1)
    return purchase


def contract_image() -> Image:
    """An allowlisted image, added by ops (once)."""
    return Image.objects.filter(name=CONTRACT_IMAGE).first() or services.image_create(
        actor=ops_actor(),
        name=CONTRACT_IMAGE,
        reference="vllm/vllm-openai:v0.6.3",
        ports=[8000],
        connect="service",
    )


def notebook_image() -> Image:
    """Another allowlisted Jupyter image each call (the images lists' filters find them)."""
    n = Image.objects.count()
    return services.image_create(
        actor=ops_actor(),
        name=f"notebook-{n}",
        reference=f"quay.io/jupyter/base-notebook:v{n}",
        connect="jupyter",
        ports=[8888],
    )


def queued_slice(membership: Membership) -> Slice:
    """A launch on a new purchase; it waits in the queue: no GPU takes placements here."""
    slice, _ = services.slice_launch(
        membership=membership,
        purchase=paid_purchase(membership),
        image=contract_image(),
        model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048},
    )
    return slice


def volume_node() -> Node:
    """A node that passed the gate with a GPU taking placements, as discovery leaves it:
    volumes are made on one. No host key, so nothing tries to reach it over SSH."""
    node, created = Node.objects.get_or_create(
        name="contract-volumes",
        defaults={"address": "10.7.0.1", "status": "active", "gate_status": "passed"},
    )
    if created:
        Gpu.objects.create(
            node=node, uuid="GPU-contract-volumes", index=0, model="NVIDIA A30", vram_total_mb=24576
        )
    return node


def volume(membership: Membership) -> Volume:
    """A volume the tenant created (state `creating`: its node makes it after commit)."""
    volume_node()
    n = Volume.objects.count()
    return services.volume_create(membership=membership, name=f"ckpt-{n}", size_gb=10)[0]


def launch_template() -> LaunchTemplate:
    """A vLLM template ops wrote on an allowlisted image."""
    n = LaunchTemplate.objects.count()
    return services.template_create(
        actor=ops_actor(),
        name=f"vllm-qwen-{n}",
        description="Qwen 0.5B served by vLLM",
        image=contract_image(),
        engine="vllm",
        command=["vllm", "serve", "Qwen/Qwen2.5-0.5B", "--port", "8000"],
        model_request={
            "model": {"catalog": "Qwen/Qwen2.5-0.5B"},
            "engine": "vllm",
            "context_tokens": 2048,
        },
    )
