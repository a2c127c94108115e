from django.urls import path

from . import views

app_name = "edge"
PORT = "slices/<int:pk>/ports/<int:port>/"

urlpatterns = [
    path(f"{PORT}open/", views.port_open, name="port_open"),
    path(f"{PORT}public/", views.port_public, name="port_public"),
    path(
        f"{PORT}public/rotate/",
        views.port_public_change,
        {"action": "rotate"},
        name="port_public_rotate",
    ),
    path(
        f"{PORT}public/revoke/",
        views.port_public_change,
        {"action": "revoke"},
        name="port_public_revoke",
    ),
]
