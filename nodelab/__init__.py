"""The node lab: GPU nodes made of real software (OpenSSH, Docker Engine, the kernel's
cgroups and processes) except the GPU, which `nodelab.gpud` emulates. Test equipment and
the demo's far end; no production module imports it. See `nodelab.lab`."""

from .build import (
    HTTP_IMAGE,
    HTTP_PORT,
    IMAGE,
    SSH_IMAGE,
    SSH_PORT,
    SSH_USER_IN_IMAGE,
)
from .jupyter_image import JUPYTER_IMAGE, JUPYTER_PORT, JUPYTER_USER_IN_IMAGE
from .lab import CONTAINER_NETWORK, Lab
from .labnode import SSH_USER, LabContainer, LabNode, LabNodeSpec
from .prereqs import LabUnavailable, problems
from .probes import PROBING_NEIGHBOUR, longest_refusal, probe_readings

__all__ = [
    "CONTAINER_NETWORK",
    "HTTP_IMAGE",
    "HTTP_PORT",
    "IMAGE",
    "JUPYTER_IMAGE",
    "JUPYTER_PORT",
    "JUPYTER_USER_IN_IMAGE",
    "PROBING_NEIGHBOUR",
    "SSH_IMAGE",
    "SSH_PORT",
    "SSH_USER_IN_IMAGE",
    "SSH_USER",
    "Lab",
    "LabContainer",
    "LabNode",
    "LabNodeSpec",
    "LabUnavailable",
    "longest_refusal",
    "probe_readings",
    "problems",
]
