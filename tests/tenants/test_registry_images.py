"""Images renters bring (docs/images.md): the registry policy's patterns and which rule
decides, the refusals that name it (API, page, service), registry logins sealed and never
shown again (page, API, audit), the pull's own Docker configuration and docker's words
turned into a renter's, placement of "any image" only on nodes whose agent runs, and a
brought image's whole launch on the node emulator (pulled, run by digest). The same on
real Docker Engine, with a registry on loopback: test_lab_registry_images.py."""

from __future__ import annotations

import base64
import json
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.test import override_settings

from gpuplatform.errors import NotAllowed, ServiceError
from nodes import registry_pull, runtime
from nodes.docker_messages import image_size_refusal, pull_refusal, pull_refusal_kind
from nodes.image_refs import exposed_tcp_ports, reference_parts
from nodes.models import AgentState, Node, NodeAgent
from tenants import image_policy, sealing, selectors, services
from tenants.models import (
    AuditEvent,
    Image,
    RegistryCredential,
    RegistryRule,
    RegistryRuleChange,
    Role,
    Slice,
)
from tests.api_contract import ApiResourceContract, OpsResourceContract
from tests.conftest import SMALL_MODEL, SSH_KEY
from tests.factories import MembershipFactory, UserFactory
from tests.tenants.page_support import launch_data

REGISTRY = "registry.acme.test:5000"
BROUGHT = f"{REGISTRY}/team/tool:1"
PASSWORD = "s3cret-Token-9f2c"  # what must never come back
USERNAME = "robot$acme+reader"

# --- the policy's grammar and which rule decides (pure) -------------------------------------


@pytest.mark.parametrize(
    ("reference", "registry", "repository", "tag", "digest"),
    [
        ("busybox", "docker.io", "library/busybox", "", ""),
        ("busybox:1.36", "docker.io", "library/busybox", "1.36", ""),
        ("acme/train:2", "docker.io", "acme/train", "2", ""),
        ("index.docker.io/acme/train", "docker.io", "acme/train", "", ""),
        ("GHCR.io/acme/train:2", "ghcr.io", "acme/train", "2", ""),
        ("127.0.0.1:5000/renter/web:1", "127.0.0.1:5000", "renter/web", "1", ""),
        ("localhost/x", "localhost", "x", "", ""),
        (f"ghcr.io/a/b:1@sha256:{'a' * 64}", "ghcr.io", "a/b", "1", f"sha256:{'a' * 64}"),
    ],
)
def test_a_reference_splits_as_docker_reads_it(reference, registry, repository, tag, digest):
    parts = reference_parts(reference)
    assert (parts.registry, parts.repository, parts.tag, parts.digest) == (
        registry,
        repository,
        tag,
        digest,
    )


@pytest.mark.parametrize(
    ("typed", "kept"),
    [
        ("*", "*"),
        ("GHCR.io", "ghcr.io"),
        ("ghcr.io/*", "ghcr.io"),
        ("ghcr.io/acme/*", "ghcr.io/acme/*"),
        ("docker.io/python", "docker.io/library/python"),
        ("index.docker.io/acme/*", "docker.io/acme/*"),
        ("127.0.0.1:5000", "127.0.0.1:5000"),
    ],
)
def test_patterns_are_kept_normalised(typed, kept):
    assert image_policy.clean_pattern(typed) == kept


@pytest.mark.parametrize(
    "typed", ["", "python", "acme/*", "ghcr.io/a*b", "ghcr.io//x", "ghcr.io/Acme/*", "x y"]
)
def test_a_pattern_that_names_no_registry_is_refused_with_the_grammar(typed):
    with pytest.raises(ValueError, match="registry|pattern"):
        image_policy.clean_pattern(typed)


RULES = [
    ("*", "any"),
    ("ghcr.io", "registry"),
    ("ghcr.io/acme/*", "allowlist"),
    ("ghcr.io/acme/public/*", "registry"),
    ("docker.io/library/python", "registry"),
]


@pytest.mark.parametrize(
    ("reference", "mode", "pattern"),
    [
        ("quay.io/x/y:1", "any", "*"),  # only the widest matches
        ("ghcr.io/other/y:1", "registry", "ghcr.io"),
        ("ghcr.io/acme/secret:1", "allowlist", "ghcr.io/acme/*"),  # narrower closes it
        ("ghcr.io/acme/public/y:1", "registry", "ghcr.io/acme/public/*"),  # deeper opens it
        ("python:3.12", "registry", "docker.io/library/python"),  # one repository
        ("python-extra:1", "any", "*"),  # a prefix of a name is not the repository
    ],
)
def test_the_narrowest_matching_rule_decides(reference, mode, pattern):
    assert image_policy.decide(RULES, reference) == image_policy.Decision(mode, pattern)


def test_no_rule_means_the_allowlist_only_and_the_refusal_says_so():
    decision = image_policy.decide([("ghcr.io", "registry")], "quay.io/x/y:1")
    assert decision == image_policy.Decision("allowlist") and not decision.allows
    words = image_policy.refusal("quay.io/x/y:1", decision)
    assert "no registry rule" in words and "quay.io" in words
    closed = image_policy.decide(RULES, "ghcr.io/acme/secret:1")
    assert "'ghcr.io/acme/*'" in image_policy.refusal("ghcr.io/acme/secret:1", closed)
    assert image_policy.decide(RULES, "quay.io/x/y:1").needs_agent


# --- the pull's own configuration, and docker's words in a renter's (pure) ------------------


def test_a_pull_has_its_own_config_holding_the_tenants_login_or_none():
    anonymous = json.loads(registry_pull.config_json())
    assert anonymous == {"auths": {}}  # never the node's own logins
    login = json.loads(registry_pull.config_json(REGISTRY, USERNAME, PASSWORD))
    token = login["auths"][REGISTRY]["auth"]
    assert base64.b64decode(token).decode() == f"{USERNAME}:{PASSWORD}"
    hub = json.loads(registry_pull.config_json("docker.io", "u", "p"))
    assert list(hub["auths"]) == ["https://index.docker.io/v1/"]


def test_the_pull_argv_carries_no_secret_and_only_its_own_directory():
    directory = registry_pull.config_dir_for("slice-7")
    argv = registry_pull.pull_argv(directory, BROUGHT)
    assert argv == ["docker", "--config", directory, "pull", "--", BROUGHT]
    assert registry_pull.config_write_argv(directory)[-2:] == [
        "/dev/stdin",
        f"{directory}/config.json",
    ]
    for wrong in ("/var/lib/gpuplatform/pull-auth/../../etc", "/tmp/x", directory + "/.."):
        with pytest.raises(ValueError):
            registry_pull.remove_argv(wrong)
    with pytest.raises(ValueError):
        registry_pull.pull_argv(directory, "--privileged")
    assert repr(registry_pull.RegistryLogin(REGISTRY, USERNAME, PASSWORD)).count(PASSWORD) == 0


def test_the_digest_a_pull_resolved_is_read_from_its_output():
    digest = "sha256:" + "d" * 64
    out = f"1: Pulling from team/tool\nDigest: {digest}\nStatus: Image is up to date\n"
    assert registry_pull.pulled_digest(out) == digest
    assert registry_pull.pulled_digest("Status: nothing\n") == ""


@pytest.mark.parametrize(
    ("detail", "kind"),
    [
        ('Head "http://127.0.0.1:4/v2/x/manifests/1": no basic auth credentials', "login"),
        (
            "pull access denied for x, repository does not exist or may require 'docker login'",
            "login",
        ),  # fmt: skip
        ("unauthorized: authentication required", "login"),
        ("manifest unknown", "missing"),
        ("manifest for ghcr.io/x:9 not found: manifest unknown: manifest unknown", "missing"),
        (
            'Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
            "unreachable",
        ),  # fmt: skip
        ("dial tcp: lookup nowhere.invalid on 10.0.0.53:53: no such host", "unreachable"),
        ("toomanyrequests: You have reached your pull rate limit", "rate"),
        ("no matching manifest for linux/amd64 in the manifest list entries", "platform"),
        ("something else entirely", ""),
    ],
)
def test_docker_refusals_are_read_by_kind(detail, kind):
    assert pull_refusal_kind(detail) == kind


def test_a_pull_refusal_is_a_renters_sentence_never_dockers_text():
    node = Node(name="gpu-a")
    raw = 'Head "http://10.1.2.3:5000/v2/team/tool/manifests/1": no basic auth credentials'
    words = pull_refusal(node=node, reference=BROUGHT, registry=REGISTRY, detail=raw, login=False)
    assert "wants a login" in words and "Registries page" in words and "10.1.2.3" not in words
    saved = pull_refusal(node=node, reference=BROUGHT, registry=REGISTRY, detail=raw, login=True)
    assert "refused your tenant's saved login" in saved
    missing = pull_refusal(
        node=node, reference=BROUGHT, registry=REGISTRY, detail="manifest unknown", login=False
    )
    assert missing == f"{BROUGHT} is not in its registry: no such repository, tag or digest"
    down = pull_refusal(
        node=node, reference=BROUGHT, registry=REGISTRY, login=False,
        detail='Get "http://10.1.2.3:5000/v2/": dial tcp 10.1.2.3:5000: connection refused',
    )  # fmt: skip
    assert down == f"the node could not reach the registry {REGISTRY}"


def test_an_image_too_large_for_the_node_is_refused_in_gb():
    gb = 1000**3
    assert image_size_refusal(size=2 * gb, avail=50 * gb, max_gb=80, reserve_gb=5) == ""
    assert "90.0 GB unpacked" in image_size_refusal(
        size=90 * gb, avail=500 * gb, max_gb=80, reserve_gb=5
    )
    assert "3.0 GB free" in image_size_refusal(size=2 * gb, avail=3 * gb, max_gb=80, reserve_gb=5)
    # an image the node held already: its disk is not read, the size alone is checked
    assert image_size_refusal(size=2 * gb, avail=None, max_gb=80, reserve_gb=5) == ""


def test_an_images_declared_ports_and_size_are_read_from_its_inspection():
    doc = [
        {
            "Id": "sha256:" + "1" * 64,
            "Size": 19228425,
            "RepoDigests": [],
            "Config": {
                "Env": ["PATH=/bin"],
                "User": "1000:1000",
                "ExposedPorts": {"8888/tcp": {}, "53/udp": {}, "22": {}},
            },
        }
    ]
    config = runtime.parse_image_inspect(json.dumps(doc))
    assert config.exposed_ports == (22, 8888) and config.size == 19228425
    assert exposed_tcp_ports(None) == () and exposed_tcp_ports([]) == ()


# --- logins sealed, written only, never shown ----------------------------------------------


@pytest.mark.django_db
def test_a_login_is_sealed_and_only_the_platform_reads_it_back(owner_a, settings):
    row = services.registry_credential_set(
        membership=owner_a, registry=REGISTRY, username=USERNAME, password=PASSWORD
    )
    stored = RegistryCredential.objects.get(pk=row.pk).sealed
    assert PASSWORD not in stored and USERNAME not in stored
    assert base64.b64encode(PASSWORD.encode()).decode() not in stored
    login = selectors.registry_login_for(tenant_id=owner_a.tenant_id, reference=BROUGHT)
    assert (login.registry, login.username, login.password) == (REGISTRY, USERNAME, PASSWORD)
    # another tenant has no login there; another registry is anonymous
    other = MembershipFactory()
    assert selectors.registry_login_for(tenant_id=other.tenant_id, reference=BROUGHT) is None
    assert selectors.registry_login_for(tenant_id=owner_a.tenant_id, reference="x/y:1") is None


@pytest.mark.django_db
def test_a_new_key_seals_while_the_old_one_still_unseals(settings):
    settings.CREDENTIALS_KEYS = ["first key"]
    sealed = sealing.seal({"password": PASSWORD})
    settings.CREDENTIALS_KEYS = ["second key", "first key"]
    assert sealing.unseal(sealed) == {"password": PASSWORD}
    resealed = sealing.reseal(sealed)
    settings.CREDENTIALS_KEYS = ["second key"]
    assert sealing.unseal(resealed) == {"password": PASSWORD}
    with pytest.raises(sealing.Unreadable):
        sealing.unseal(sealed)
    # a key that is only SECRET_KEY's: changing SECRET_KEY loses what it sealed
    settings.CREDENTIALS_KEYS = []
    with override_settings(SECRET_KEY="one secret"):
        by_secret = sealing.seal({"password": PASSWORD})
    with override_settings(SECRET_KEY="another secret"), pytest.raises(sealing.Unreadable):
        sealing.unseal(by_secret)
    assert Fernet  # (cryptography's Fernet is what seals: tenants/sealing.py)


@pytest.mark.django_db
def test_a_rotation_seals_every_login_again_under_the_new_key(owner_a, settings):
    settings.CREDENTIALS_KEYS = ["old key"]
    services.registry_credential_set(
        membership=owner_a, registry=REGISTRY, username=USERNAME, password=PASSWORD
    )
    settings.CREDENTIALS_KEYS = ["new key", "old key"]
    out = StringIO()
    call_command("credentials_reseal", stdout=out)
    assert "1 registry login(s) sealed again" in out.getvalue()
    settings.CREDENTIALS_KEYS = ["new key"]  # the old one dropped: still readable
    login = selectors.registry_login_for(tenant_id=owner_a.tenant_id, reference=BROUGHT)
    assert login.password == PASSWORD
    settings.CREDENTIALS_KEYS = ["another key"]
    with pytest.raises(selectors.LoginUnreadable):
        selectors.registry_login_for(tenant_id=owner_a.tenant_id, reference=BROUGHT)


@pytest.mark.django_db
def test_the_api_takes_a_login_and_never_returns_it(api_a, owner_a):
    made = api_a.post(
        "/api/v1/registry-credentials/",
        {"registry": REGISTRY, "username": USERNAME, "password": PASSWORD},
        format="json",
    )
    assert made.status_code == 201, made.content
    body = made.json()
    assert set(body) == {"id", "registry", "created_by", "created_at", "updated_at", "last_used_at"}
    for response in (
        made,
        api_a.get("/api/v1/registry-credentials/"),
        api_a.get(f"/api/v1/registry-credentials/{body['id']}/"),
        api_a.get("/api/v1/schema/", {"format": "json"}),
    ):
        assert PASSWORD not in response.content.decode()
        assert USERNAME not in response.content.decode()
    # saving the registry again replaces its login: still one row
    again = api_a.post(
        "/api/v1/registry-credentials/",
        {"registry": REGISTRY, "username": "other", "password": "x" * 20},
        format="json",
    )
    assert again.status_code == 201 and again.json()["id"] == body["id"]
    events = AuditEvent.objects.filter(tenant=owner_a.tenant, action__startswith="registry_login")
    assert [e.action for e in events.order_by("at", "pk")] == [
        "registry_login.added",
        "registry_login.replaced",
    ]
    assert all(PASSWORD not in json.dumps(e.data) + e.summary for e in events)
    assert api_a.delete(f"/api/v1/registry-credentials/{body['id']}/").status_code == 204
    assert not RegistryCredential.objects.exists()


@pytest.mark.django_db
def test_only_owners_save_logins(owner_a, token_client):
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    refused = token_client(member.user).post(
        "/api/v1/registry-credentials/",
        {"registry": REGISTRY, "username": USERNAME, "password": PASSWORD},
        format="json",
    )
    assert refused.status_code == 403 and refused.json()["code"] == "permission_denied"
    with pytest.raises(NotAllowed):
        services.registry_credential_set(
            membership=member, registry=REGISTRY, username=USERNAME, password=PASSWORD
        )
    with pytest.raises(ServiceError) as bad:
        services.registry_credential_set(
            membership=owner_a, registry="ghcr.io/acme", username=USERNAME, password=PASSWORD
        )
    assert bad.value.field == "registry"


@pytest.mark.django_db
def test_the_page_saves_a_login_and_never_shows_it_again(client, owner_a):
    client.force_login(owner_a.user)
    saved = client.post(
        "/registries/",
        {"registry": REGISTRY, "username": USERNAME, "password": PASSWORD},
        follow=True,
    )
    assert saved.status_code == 200
    page = saved.content.decode()
    assert REGISTRY in page and "will not be shown again" in page
    assert PASSWORD not in page and USERNAME not in page
    # a refused form does not send the password back either
    refused = client.post("/registries/", {"registry": "not a registry", "username": "u",
                                           "password": PASSWORD})  # fmt: skip
    assert refused.status_code == 400 and PASSWORD not in refused.content.decode()
    login = RegistryCredential.objects.get()
    removed = client.post(f"/registries/{login.pk}/remove/", follow=True)
    assert removed.status_code == 200 and not RegistryCredential.objects.exists()


# --- ops' policy: page, API, history ----------------------------------------------------------


@pytest.mark.django_db
def test_only_ops_set_the_policy_and_every_change_is_kept_with_its_reason(ops_user, owner_a):
    with pytest.raises(NotAllowed):
        services.registry_rule_set(actor=owner_a.user, pattern="*", mode="any", reason="let me in")
    with pytest.raises(ServiceError) as why:
        services.registry_rule_set(actor=ops_user, pattern="ghcr.io", mode="registry", reason="")
    assert why.value.field == "reason"
    rule = services.registry_rule_set(
        actor=ops_user, pattern="GHCR.io", mode="registry", reason="our team's"
    )
    assert rule.pattern == "ghcr.io"
    services.registry_rule_set(actor=ops_user, pattern="ghcr.io", mode="any", reason="wider")
    services.registry_rule_remove(actor=ops_user, rule=rule, reason="done")
    changes = list(RegistryRuleChange.objects.order_by("changed_at", "pk"))
    assert [(c.old_mode, c.new_mode, c.reason) for c in changes] == [
        ("", "registry", "our team's"),
        ("registry", "any", "wider"),
        ("any", "", "done"),
    ]
    assert all(c.changed_by == ops_user for c in changes)


@pytest.mark.django_db
def test_the_ops_page_adds_a_rule_and_shows_its_history(client, ops_user):
    client.force_login(ops_user)
    page = client.get("/ops/registries/")
    assert page.status_code == 200 and "No rules" in page.content.decode()
    added = client.post(
        "/ops/registries/",
        {"pattern": "127.0.0.1:5000", "mode": "registry", "reason": "the lab registry"},
        follow=True,
    )
    body = added.content.decode()
    assert "127.0.0.1:5000" in body and "the lab registry" in body
    rule = RegistryRule.objects.get()
    client.post(f"/ops/registries/{rule.pk}/remove/", {"reason": "lab closed"})
    assert not RegistryRule.objects.exists()
    assert "lab closed" in client.get("/ops/registries/").content.decode()


@pytest.mark.django_db
def test_the_ops_api_sets_changes_and_removes_rules(api_ops, api_a):
    assert api_a.get("/api/v1/ops/registry-rules/").status_code == 403
    made = api_ops.post(
        "/api/v1/ops/registry-rules/",
        {"pattern": "ghcr.io/acme/*", "mode": "registry", "reason": "ours"},
        format="json",
    )
    assert made.status_code == 201, made.content
    rule_id = made.json()["id"]
    changed = api_ops.patch(
        f"/api/v1/ops/registry-rules/{rule_id}/", {"mode": "any", "reason": "wider"}, format="json"
    )
    assert changed.status_code == 200 and changed.json()["mode"] == "any"
    no_reason = api_ops.post(f"/api/v1/ops/registry-rules/{rule_id}/remove/", {}, format="json")
    assert no_reason.status_code == 400
    gone = api_ops.post(
        f"/api/v1/ops/registry-rules/{rule_id}/remove/", {"reason": "closed"}, format="json"
    )
    assert gone.status_code == 204 and not RegistryRule.objects.exists()


class TestRegistryCredentialsApi(ApiResourceContract):
    list_url = "/api/v1/registry-credentials/"

    def make(self, membership):
        n = RegistryCredential.objects.count()
        return services.registry_credential_set(
            membership=membership, registry=f"r{n}.acme.test", username="u", password="p"
        )


class TestOpsRegistryRulesApi(OpsResourceContract):
    list_url = "/api/v1/ops/registry-rules/"

    def make(self, membership):
        ops = UserFactory(is_staff=True)
        n = RegistryRule.objects.count()
        return services.registry_rule_set(
            actor=ops, pattern=f"r{n}.acme.test", mode="registry", reason="contract"
        )


# --- launching a brought image: refused naming the policy, or run by digest -----------------


def allow(ops_user, pattern: str = REGISTRY, mode: str = "registry") -> RegistryRule:
    return services.registry_rule_set(actor=ops_user, pattern=pattern, mode=mode, reason="test")


def bring(membership, purchase, reference: str = BROUGHT, **kw) -> Slice:
    slice, _ = services.slice_launch(
        membership=membership,
        purchase=purchase,
        image_reference=reference,
        model_request=kw.pop("model_request", SMALL_MODEL),
        **kw,
    )
    slice.refresh_from_db()
    return slice


@pytest.mark.django_db
def test_the_api_refuses_an_image_on_no_allowlist_naming_the_policy(
    api_a, owner_a, funded, ops_user
):
    purchase = funded(owner_a)
    body = {"purchase": purchase.pk, "image_reference": BROUGHT, "model": SMALL_MODEL}
    refused = api_a.post("/api/v1/slices/", body, format="json")
    assert refused.status_code == 403, refused.content
    error = refused.json()
    assert error["code"] == "image_not_allowed"
    assert "no registry rule" in error["message"] and REGISTRY in error["message"]
    assert error["fields"]["image_reference"][0]["code"] == "image_not_allowed"
    services.registry_rule_set(
        actor=ops_user, pattern=f"{REGISTRY}/team/*", mode="allowlist", reason="closed"
    )
    named = api_a.post("/api/v1/slices/", body, format="json").json()
    assert f"'{REGISTRY}/team/*'" in named["message"]
    tagless = {**body, "image_reference": f"{REGISTRY}/team/tool@sha256:{'a' * 64}"}
    digest_only = api_a.post("/api/v1/slices/", tagless, format="json")
    assert digest_only.status_code == 400
    assert digest_only.json()["fields"]["image_reference"][0]["code"] == (
        "image_reference_needs_tag"
    )
    assert not Slice.objects.exists()


@pytest.mark.django_db
def test_an_allowlisted_image_named_by_reference_launches_as_its_entry(owner_a, funded, image_ssh):
    slice = bring(owner_a, funded(owner_a), reference=image_ssh.reference, ssh_public_key=SSH_KEY)
    assert slice.image_entry == image_ssh and slice.image_policy == "" and not slice.brought
    assert slice.image == image_ssh.pinned_reference
    with pytest.raises(ServiceError, match="not both"):
        services.slice_launch(
            membership=owner_a, purchase=funded(owner_a), image=image_ssh,
            image_reference=BROUGHT, model_request=SMALL_MODEL,
        )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_brought_image_is_pulled_with_its_own_config_and_runs_by_digest(
    eager, worker_fleet, owner_a, funded, ops_user
):
    fleet = worker_fleet()
    allow(ops_user)
    services.registry_credential_set(
        membership=owner_a, registry=REGISTRY, username=USERNAME, password=PASSWORD
    )
    slice = bring(owner_a, funded(owner_a))
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    assert slice.image_entry is None and slice.image_policy == "registry"
    assert slice.image == BROUGHT and slice.image_digest.startswith("sha256:")
    container = fleet.nodes[0].container(slice.container_id)
    assert container.image == f"{REGISTRY}/team/tool@{slice.image_digest}"
    # the login went to the node on stdin, into the start's own directory, gone after
    state = fleet.nodes[0].state
    assert not [p for p in state.files if p.startswith(registry_pull.DIRECTORY + "/")]
    assert RegistryCredential.objects.get().last_used_at is not None


@pytest.mark.django_db(transaction=True)
def test_any_image_lands_only_on_nodes_whose_agent_runs(
    eager, worker_fleet, owner_a, funded, ops_user
):
    fleet = worker_fleet()
    node = fleet.registered[0]
    allow(ops_user, pattern="*", mode="any")
    NodeAgent.objects.update_or_create(node=node, defaults={"state": AgentState.UNKNOWN})
    waiting = bring(owner_a, funded(owner_a))
    assert waiting.state == Slice.State.QUEUED and waiting.image_policy == "any"
    assert "node agent runs" in waiting.state_reason
    assert waiting.allocation is None
    NodeAgent.objects.filter(node=node).update(state=AgentState.OK)
    services.slices_dispatch_queue()
    waiting.refresh_from_db()
    assert waiting.state == Slice.State.RUNNING, waiting.state_reason
    # the same rule as a trusted registry places anywhere that takes slices
    services.registry_rule_set(actor=ops_user, pattern="*", mode="registry", reason="trusted")
    NodeAgent.objects.filter(node=node).update(state=AgentState.UNKNOWN)
    anywhere = bring(owner_a, funded(owner_a), reference=f"{REGISTRY}/team/other:2")
    assert anywhere.state == Slice.State.RUNNING, anywhere.state_reason


@pytest.mark.django_db(transaction=True)
def test_any_image_placed_on_an_agent_node_does_not_start_once_the_agent_stopped(
    worker_fleet, owner_a, funded, ops_user, django_capture_on_commit_callbacks
):
    fleet = worker_fleet()
    allow(ops_user, pattern="*", mode="any")
    NodeAgent.objects.filter(node=fleet.registered[0]).update(state=AgentState.OK)
    with django_capture_on_commit_callbacks(execute=False):  # placed, not started yet
        placed = bring(owner_a, funded(owner_a))
    assert placed.state == Slice.State.PROVISIONING
    NodeAgent.objects.filter(node=fleet.registered[0]).update(state=AgentState.SILENT)
    assert services.slice_provision(slice_id=placed.pk) == Slice.State.FAILED
    placed.refresh_from_db()
    assert "agent is not running" in placed.state_reason
    owners = [c.labels.get("gpuplatform.owner") for c in fleet.nodes[0].containers]
    assert placed.owner_key not in owners  # nothing was pulled or started for it


@pytest.mark.django_db(transaction=True)
def test_the_policy_is_asked_again_at_resume_and_in_the_queue(
    eager, worker_fleet, owner_a, funded, ops_user
):
    worker_fleet()
    rule = allow(ops_user)
    slice = bring(owner_a, funded(owner_a))
    services.slice_stop(slice=slice, actor=owner_a.user)
    services.registry_rule_remove(actor=ops_user, rule=rule, reason="closed")
    with pytest.raises(NotAllowed) as refused:
        services.slice_resume(membership=owner_a, slice=slice, purchase=funded(owner_a))
    assert refused.value.code == "image_not_allowed" and "no registry rule" in refused.value.message
    # a queued one is cancelled, saying why
    rule = allow(ops_user, mode="any")
    NodeAgent.objects.update(state=AgentState.UNKNOWN)
    queued = bring(owner_a, funded(owner_a), reference=f"{REGISTRY}/team/other:2")
    assert queued.state == Slice.State.QUEUED
    services.registry_rule_remove(actor=ops_user, rule=rule, reason="closed again")
    services.slices_dispatch_queue()
    queued.refresh_from_db()
    assert queued.state == Slice.State.STOPPED and "no registry rule" in queued.state_reason


@pytest.mark.django_db
def test_the_launch_page_offers_an_image_of_ones_own_only_where_a_rule_allows(
    client, owner_a, funded, ops_user, image_ssh
):
    funded(owner_a)
    client.force_login(owner_a.user)
    assert 'name="image_reference"' not in client.get("/launch/").content.decode()
    allow(ops_user)
    page = client.get("/launch/").content.decode()
    assert 'name="image_reference"' in page and "an image of your own" in page


@pytest.mark.django_db
def test_the_launch_page_names_the_policy_when_it_refuses(client, owner_a, funded, ops_user):
    purchase = funded(owner_a)
    allow(ops_user, pattern="ghcr.io")
    client.force_login(owner_a.user)
    data = {**launch_data(purchase, Image(pk=0)), "image": "", "image_reference": BROUGHT}
    refused = client.post("/launch/", data)
    assert refused.status_code == 403
    assert "no registry rule lets renters bring images" in refused.content.decode()
    assert not Slice.objects.exists()


@pytest.mark.django_db
def test_a_brought_image_slice_keeps_what_the_api_shows(api_a, owner_a, funded, ops_user):
    allow(ops_user)
    slice = bring(owner_a, funded(owner_a))  # queued: no node here
    detail = api_a.get(f"/api/v1/slices/{slice.pk}/").json()
    assert detail["image"] is None and detail["image_reference"] == BROUGHT
    assert detail["image_policy"] == "registry" and detail["declared_ports"] == []
    assert Image.objects.count() == 0  # nothing was added to the allowlist


@pytest.mark.django_db(transaction=True)
def test_the_launch_page_launches_a_brought_image(eager, worker_fleet, client, owner_a, funded,
                                                  ops_user):  # fmt: skip
    worker_fleet()
    purchase = funded(owner_a)
    allow(ops_user)
    client.force_login(owner_a.user)
    data = {**launch_data(purchase, Image(pk=0)), "image": "", "image_reference": BROUGHT}
    launched = client.post("/launch/", data)
    assert launched.status_code == 302, launched.content.decode()[:2000]
    slice = Slice.objects.get()
    assert slice.state == Slice.State.RUNNING and slice.image == BROUGHT
