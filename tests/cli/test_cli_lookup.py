"""How gpp finds a tier, a slice or a volume from what was typed, without the server."""

import pytest

from cli.client import CliError
from cli.common import find_by_name_or_id, find_tier

ROWS = [{"id": 7, "name": "ckpt"}, {"id": 8, "name": "1984"}]
TIERS = [{"id": 3, "name": "Small", "vram_mb": 4096, "is_active": True}]


def test_an_id_a_name_and_a_name_made_of_digits_are_found():
    assert find_by_name_or_id(ROWS, "7", kind="volume")["id"] == 7
    assert find_by_name_or_id(ROWS, "CKPT", kind="volume")["id"] == 7
    assert find_by_name_or_id(ROWS, "1984", kind="volume")["id"] == 8
    assert find_tier(TIERS, "id:3")["id"] == 3


@pytest.mark.parametrize("typed", ["²", "id:²"])
def test_a_digit_int_cannot_read_is_refused_by_name_not_a_crash(typed):
    with pytest.raises(CliError) as refused:
        if typed.startswith("id:"):
            find_tier(TIERS, typed)
        else:
            find_by_name_or_id(ROWS, typed, kind="volume")
    assert refused.value.code in ("unknown_volume", "unknown_tier")
