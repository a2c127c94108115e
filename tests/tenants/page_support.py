"""What the page tests share (the lifecycle pages', the renter's day's and their browser
twins'): the launch form's data for a small job, and a slice launched onto a GPU with its
provisioning captured, never run (the container is the lab's business, the page is what
these tests look at)."""

from django.utils import timezone

from emulator import keys
from nodes.models import Gpu, Node
from tenants import services
from tenants.models import Slice
from tests.tenants import ssh_material

SMALL_MODEL = {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048}
SMALL_JOB = {
    "model": "Qwen/Qwen2.5-0.5B",
    "workload": "inference",
    "weights_dtype": "bf16",
    "kv_cache_dtype": "bf16",
    "engine": "transformers",
    "batch": "1",
    "context_tokens": "2048",
}
SSH_KEY = keys.public_line(keys.generate_ed25519(), "me@laptop")


def launch_data(purchase, image, **overrides) -> dict:
    """The launch form as a renter fills it in for the small job, with `overrides`."""
    return {
        "purchase": purchase.pk,
        "image": image.pk,
        "ssh_public_key": SSH_KEY,
        "guaranteed": "on",
        "idempotency_token": overrides.pop("idempotency_token", "form-token-1"),
        **SMALL_JOB,
        **overrides,
    }


def launch_held(capture, *, membership, purchase, image, ssh_public_key: str) -> Slice:
    """The small job launched; `capture` (django_capture_on_commit_callbacks) keeps the
    provisioning its commit would start from running."""
    with capture(execute=False):
        slice, _ = services.slice_launch(
            membership=membership,
            purchase=purchase,
            image=image,
            model_request=SMALL_MODEL,
            ssh_public_key=ssh_public_key,
        )
    return slice


def placed_slice(
    capture, *, membership, purchase, image, state: str, gpu_uuid: str = "GPU-1111"
) -> Slice:
    """A slice placed on a new node's L4 (no node behind it) and then put in `state` with a
    container and a start time. The object returned is as the launch left it: only the row
    has the new state."""
    node = Node.objects.create(
        gate_status="passed", name="gpu-host-1", address="10.0.0.9", status="active"
    )
    Gpu.objects.create(node=node, uuid=gpu_uuid, index=0, model="NVIDIA L4", vram_total_mb=24576)
    slice = launch_held(
        capture,
        membership=membership,
        purchase=purchase,
        image=image,
        ssh_public_key=ssh_material.public_line(),
    )
    Slice.objects.filter(pk=slice.pk).update(
        state=state, container_id="c0ffee", started_at=timezone.now()
    )
    return slice
