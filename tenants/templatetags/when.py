"""`{{ moment|when }}`: the one way every page writes a moment, "2025-05-01 20:33:47 UTC":
date, 24-hour time with seconds, and the zone it is written in, named. The zone is the
page's (Django's active time zone: TIME_ZONE unless something activates another), the
one `<html data-time-zone>` states for static/js/when.js, which writes the charts'
times the same way. Only a day (an expiry date, "member since") stays a bare date."""

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

DATE = "%Y-%m-%d"
TIME = "%H:%M:%S"


def _zone_name(local: datetime) -> str:
    return local.tzname() or timezone.get_current_timezone_name()


@register.filter(is_safe=True)
def when(moment: object) -> str:
    """A <time> element with the moment written as `when_text` writes it; the date and
    the time wrap apart, never inside either. "" for no moment (so `|default:` works)."""
    if not isinstance(moment, datetime):
        return ""
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return format_html(
        '<time datetime="{}"><span class="nowrap">{}</span> '
        '<span class="nowrap">{} {}</span></time>',
        moment.isoformat(),
        local.strftime(DATE),
        local.strftime(TIME),
        _zone_name(local),
    )


@register.simple_tag
def page_time_zone() -> str:
    """The active time zone's IANA name ("UTC", "Europe/Berlin")."""
    return timezone.get_current_timezone_name()


@register.simple_tag
def page_time_zone_name() -> str:
    """The active time zone as `when` names it now ("UTC", "CEST")."""
    return _zone_name(timezone.localtime(timezone.now()))
