"""Reading values out of query strings the same way on every page."""


def is_id(text: str) -> bool:
    """A database id: ASCII digits that fit a bigint (str.isdigit also accepts digits
    int() refuses, such as '²', and int() refuses a 5,000-digit string)."""
    return text.isascii() and text.isdigit() and len(text) < 19
