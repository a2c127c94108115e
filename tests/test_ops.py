"""Who counts as ops, asked one way (gpuplatform/ops.py)."""

import pytest
from django.contrib.auth.models import AnonymousUser

from gpuplatform.errors import NotAllowed
from gpuplatform.ops import is_ops, require_ops
from tests.factories import UserFactory


@pytest.mark.django_db
def test_only_a_signed_in_staff_account_is_ops():
    staff, tenant_user = UserFactory(is_staff=True), UserFactory()
    assert is_ops(staff)
    assert not is_ops(tenant_user) and not is_ops(AnonymousUser()) and not is_ops(None)
    require_ops(staff, what="grant credit")
    with pytest.raises(NotAllowed) as refused:
        require_ops(tenant_user, what="grant credit")
    assert refused.value.message == "Only ops grant credit."
    assert refused.value.status_code == 403
