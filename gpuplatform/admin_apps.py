"""The admin app, with the platform's site (gpuplatform.admin_site) as `admin.site`. Apart
from the site's module: an app config is imported before models may be."""

from django.contrib.admin.apps import AdminConfig


class PlatformAdminConfig(AdminConfig):
    default_site = "gpuplatform.admin_site.PlatformAdminSite"
