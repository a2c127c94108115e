"""Shared fixtures: two tenants with owners, API clients for each, an ops user."""

import importlib
import os
from types import SimpleNamespace

import django_otp.oath
import pytest
from django.apps import apps
from django.test.client import ClientMixin
from django_otp.plugins.otp_totp import models as otp_totp_models
from rest_framework.test import APIClient

from emulator import EmulatedFleet
from emulator.catalog import GpuSpec, NodeSpec
from gpuplatform.celery import app
from nodelab import (
    CONTAINER_NETWORK,
    IMAGE,
    SSH_IMAGE,
    SSH_PORT,
    SSH_USER,
    SSH_USER_IN_IMAGE,
    LabNodeSpec,
)
from nodes import services as node_services
from nodes import ssh
from nodes.models import NodePolicy
from tenants import form_limits, services
from tenants.models import Image, Tier, Volume
from tests import factories
from tests.estimator.hub_standin import hub, hub_server  # noqa: F401 (fixtures: the Hub stand-in)
from tests.factories import (
    MembershipFactory,
    OtpClock,
    UserFactory,
    make_token,
    mark_two_factor_passed,
)
from tests.lab_support import LabPool


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """One test database per pytest process (test_<name>_<pid>): two runs side by side on
    one machine never create, flush or drop each other's. The workers and gateways a test
    starts are handed the name (tests/worker_harness.py)."""
    from django.conf import settings as django_settings  # noqa: PLC0415 - session scope: the `settings` fixture is per test

    db = django_settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.sqlite3":
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # PBKDF2 is slow by design; the suite makes many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_form_limits():
    """The page forms' per-address counts (tenants/form_limits.py) live in the cache,
    Redis under CI, which outlives a test: each test starts the test client's and the
    live server's address (127.0.0.1) from zero, at the production rates."""
    form_limits.reset(address="127.0.0.1")


@pytest.fixture(autouse=True)
def _gateway_host_key(settings, tmp_path_factory):
    # Pages and slices show the gateway's host key, made on first use: one for the
    # session, never the checkout's own var/.
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path_factory.getbasetemp() / "gateway" / "host_key")


@pytest.fixture(autouse=True)
def _force_login_passes_two_factor(monkeypatch):
    """`client.force_login(staff)` skips the login form, so it skips the code step too: it
    marks the session verified with the user's device, as the code step does. Staff with
    no device stay unverified, so ops pages still turn them away (tests/tenants/
    test_two_factor.py); production code has no such shortcut."""
    original = ClientMixin.force_login

    def force_login(self, user, backend=None):
        original(self, user, backend)
        mark_two_factor_passed(self, user)

    monkeypatch.setattr(ClientMixin, "force_login", force_login)


@pytest.fixture(autouse=True)
def _otp_clock(monkeypatch):
    """Two-factor codes on the suite's clock (tests.factories.OtpClock), a fresh one per
    test: django-otp's TOTP reads `time()` from django_otp.oath, its device
    `time.time()` from its models module."""
    clock = OtpClock()
    monkeypatch.setattr(factories, "OTP_CLOCK", clock)
    monkeypatch.setattr(django_otp.oath, "time", clock.time)
    monkeypatch.setattr(otp_totp_models, "time", SimpleNamespace(time=clock.time))
    return clock


@pytest.fixture
def owner_a(db):
    return MembershipFactory(tenant__name="Alpha Labs", user__email="alice@alpha.test")


@pytest.fixture
def owner_b(db):
    return MembershipFactory(tenant__name="Beta Research", user__email="bob@beta.test")


@pytest.fixture
def ops_user(db):
    return UserFactory(email="ops@platform.test", is_staff=True)


@pytest.fixture
def anon_api() -> APIClient:
    return APIClient()


def _token_client(user) -> APIClient:
    _, value = make_token(user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    return client


@pytest.fixture
def api_a(owner_a) -> APIClient:
    return _token_client(owner_a.user)


@pytest.fixture
def api_b(owner_b) -> APIClient:
    return _token_client(owner_b.user)


@pytest.fixture
def api_ops(ops_user) -> APIClient:
    return _token_client(ops_user)


@pytest.fixture
def token_client():
    return _token_client


# --- the slice lifecycle: an emulated GPU fleet the worker's own pool can reach ---------------


def use_probe_image(reference: str = IMAGE) -> None:
    """The node policy's probe image as ops would choose it (production sets none): the
    lab's workload image, which emulated and lab nodes both have. Written directly: the
    test's allowlist need not hold it."""
    NodePolicy.objects.update_or_create(pk=1, defaults={"probe_image": reference})


@pytest.fixture
def eager():
    """Celery tasks run in this process (after commit, as dispatched), errors raised."""
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager = False
    app.conf.task_eager_propagates = False


@pytest.fixture
def worker_fleet(settings, tmp_path, django_capture_on_commit_callbacks):
    """Start emulated nodes authorised for the platform key from settings (the key the
    worker's pool uses), register them with pinned host keys and discover their GPUs.

    Call it with NodeSpecs (default: one node with one RTX 4090, 24 GB, with the quota
    library: without one a card is sold whole only). Returns the EmulatedFleet;
    registered Node rows are `fleet.registered`."""
    settings.NODES_SSH_KEY_PATH = str(tmp_path / "ssh" / "id_ed25519")
    settings.NODES_CONTAINER_SETTLE_S = 0.05
    ssh.reset_pool()
    use_probe_image()
    started = []

    def start(specs=None, **kwargs):
        specs = specs or [NodeSpec("gpu-a", (GpuSpec("NVIDIA GeForce RTX 4090"),))]
        public = ssh.public_key_line(ssh.get_pool().private_key)
        fleet = EmulatedFleet.start(
            nodes=specs,
            authorized_keys=[public],
            state_dir=tmp_path / f"emu{len(started)}",
            **kwargs,
        )
        started.append(fleet)
        fleet.registered = []
        for emu in fleet.nodes:
            with django_capture_on_commit_callbacks(execute=False):
                node = node_services.node_register(
                    name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
                )
            fleet.registered.append(node_services.node_discover(node_id=node.pk))
        return fleet

    yield start
    for fleet in started:
        fleet.stop()
    ssh.reset_pool()


@pytest.fixture
def image_ssh(db):
    return Image.objects.create(
        name="CUDA base", reference="nvidia/cuda:12.4.1-base-ubuntu22.04", ports=[22], connect="ssh"
    )


@pytest.fixture
def funded(db, ops_user):
    """Grant a tenant credit and buy `hours` of the tier of `vram_gb`: returns the purchase."""
    if not Tier.objects.exists():  # a transactional test's flush emptied the seeded tiers
        importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)

    def buy(membership, vram_gb: int = 8, hours: int = 2, credit: str = "100.00"):
        services.credit_grant(
            tenant=membership.tenant, amount=credit, actor=ops_user, memo="test credit"
        )
        membership.tenant.refresh_from_db()
        tier = Tier.objects.get(vram_mb=vram_gb * 1024)
        purchase, _ = services.purchase_create(membership=membership, tier=tier, hours=hours)
        return purchase

    return buy


SSH_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNhcmVmdWxseWZha2VidXRyZWFsbHlzaGFwZWRrZXkx tenant@laptop"
)
SMALL_MODEL = {"model": {"catalog": "Qwen/Qwen2.5-1.5B"}, "context_tokens": 2048}


def launch(membership, purchase, image, **kw):
    """A launch as a tenant makes it (the small catalog model, an SSH key), re-read."""
    slice, _ = services.slice_launch(
        membership=membership,
        purchase=purchase,
        image=image,
        model_request=kw.pop("model_request", SMALL_MODEL),
        ssh_public_key=kw.pop("ssh_public_key", SSH_KEY),
        **kw,
    )
    slice.refresh_from_db()
    return slice


# --- the node lab: real sshd and dockerd per node, only the GPU emulated ----------------------


@pytest.fixture(scope="session")
def lab_pool():
    pool = LabPool()
    yield pool
    left = pool.stop()
    assert not left, f"the lab left behind: {left}"


class LabFleet:
    def __init__(self, lab, registered):
        self.lab = lab
        self.nodes = lab.nodes
        self.registered = registered


@pytest.fixture
def lab_fleet(settings, tmp_path, lab_pool, django_capture_on_commit_callbacks):
    """Lab nodes authorised for the platform key from settings (the key a worker's pool
    uses), registered with pinned host keys as ops would (SSH user root, container network
    none) and discovered. Call it with LabNodeSpecs (default: one node with one A30, 24 GB,
    with the quota library). Every container is removed at the end, pass or fail."""
    settings.NODES_SSH_KEY_PATH = str(tmp_path / "ssh" / "id_ed25519")
    settings.NODES_CONTAINER_SETTLE_S = 0.3
    ssh.reset_pool()
    use_probe_image()
    used = []

    def start(specs=None):
        specs = tuple(specs or [LabNodeSpec("lab-a", (GpuSpec("NVIDIA A30"),))])
        public = ssh.public_key_line(ssh.get_pool().private_key)
        lab = lab_pool.get(specs, [public])
        used.append(lab)
        registered = []
        for node in lab.nodes:
            with django_capture_on_commit_callbacks(execute=False):
                row = node_services.node_register(
                    name=node.name,
                    address="127.0.0.1",
                    port=node.port,
                    ssh_user=SSH_USER,
                    host_key=node.host_key_line(),
                    container_network=CONTAINER_NETWORK,
                )
            registered.append(node_services.node_discover(node_id=row.pk))
        return LabFleet(lab, registered)

    yield start
    ssh.reset_pool()
    for lab in used:
        for node in lab.nodes:
            node.reset()


@pytest.fixture
def lab_image(db):
    """The lab's workload image on the allowlist (built on every lab node at start)."""
    return Image.objects.create(name="Lab workload", reference=IMAGE, ports=[22], connect="ssh")


@pytest.fixture
def lab_ssh_image(db):
    """The lab's SSH image on the allowlist: OpenSSH's own sshd as the image's user."""
    return Image.objects.create(
        name="SSH (lab)",
        reference=SSH_IMAGE,
        ports=[SSH_PORT],
        connect=Image.Connect.SSH,
        ssh_user=SSH_USER_IN_IMAGE,
    )


def ready_volume(membership, name: str) -> Volume:
    """A 1 GB volume the tenant created, made on its node (asserted ready)."""
    volume, _ = services.volume_create(membership=membership, name=name, size_gb=1)
    volume.refresh_from_db()
    assert volume.state == Volume.State.READY, volume.state_reason
    return volume


# --- the SSH gateway: the real server on a free loopback port, in a thread ---------------


@pytest.fixture
def edge(settings):
    """The edge on a free loopback port; slice port addresses under gpp-proxy.localhost
    point at it over plain HTTP."""
    from tests.edge.support import EdgeThread  # noqa: PLC0415 - aiohttp only here

    settings.GATEWAY_RECHECK_S = 0.5
    settings.PROXY_SCHEME = "http"
    settings.PROXY_DOMAIN = "gpp-proxy.localhost"
    thread = EdgeThread().start()
    settings.PROXY_PUBLIC_PORT = str(thread.port)
    settings.EDGE_PUBLIC_URL = f"http://127.0.0.1:{thread.port}"
    yield thread
    thread.stop()


@pytest.fixture
def gateway(settings, tmp_path):
    from tests.gateway.support import GatewayThread  # noqa: PLC0415 - asyncssh only here

    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "host_key")
    settings.GATEWAY_RECHECK_S = 0.5
    gw = GatewayThread().start()
    settings.GATEWAY_ADDRESS = f"127.0.0.1:{gw.port}"  # what slice pages tell renters
    yield gw
    gw.stop()
