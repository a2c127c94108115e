"""/metrics written by PostgreSQL is the text the Python writer gives (the one SQLite
runs), and both are what the endpoint answered when it walked model objects: byte for
byte, on a fleet with awkward names, missing samples and values, MIG cards, odd floats
and sample ages that sit exactly on a rounding tie."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nodes import selectors
from nodes.models import Gpu, Node

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 5, 1, 20, 33, 47, 123456, tzinfo=UTC)


def reference_metrics(now: datetime) -> str:
    """The endpoint as it was written before it moved into the database: model objects,
    a line at a time. Kept here as the definition of the text."""

    def _label(value: object) -> str:
        return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")

    families = {
        "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
        "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
        "DCGM_FI_DEV_FB_TOTAL": ("gauge", "Framebuffer memory total (in MiB)."),
        "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
        "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
        "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
        "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
        "gpuplatform_gpu_allocated_mib": ("gauge", "VRAM reserved by slices (in MiB)."),
        "gpuplatform_gpu_sample_age_seconds": ("gauge", "Seconds since the last sample."),
        "gpuplatform_gpu_accepting_placements": ("gauge", "1 if new slices may land here."),
    }
    lines: dict[str, list[str]] = {name: [] for name in families}
    node_lines = []
    for node in selectors.node_list():
        for status in Node.Status.values:
            node_lines.append(
                f'gpuplatform_node_status{{Hostname="{_label(node.name)}",status="{status}"}} '
                f"{1 if node.status == status else 0}"
            )
        for gpu in node.gpus.all():
            labels = (
                f'gpu="{gpu.index}",UUID="{_label(gpu.uuid)}",modelName="{_label(gpu.model)}",'
                f'Hostname="{_label(node.name)}"'
            )
            values = {
                "DCGM_FI_DEV_FB_TOTAL": gpu.vram_total_mb,
                "gpuplatform_gpu_allocated_mib": gpu.allocated_mb or 0,
                "gpuplatform_gpu_accepting_placements": int(gpu.accepting_placements),
            }
            if gpu.last_sample_at:
                used = gpu.last_memory_used_mb or 0
                values.update(
                    {
                        "DCGM_FI_DEV_FB_USED": used,
                        "DCGM_FI_DEV_FB_FREE": max(gpu.vram_total_mb - used, 0),
                        "DCGM_FI_DEV_GPU_UTIL": gpu.last_utilization_gpu,
                        "DCGM_FI_DEV_MEM_COPY_UTIL": gpu.last_utilization_memory,
                        "DCGM_FI_DEV_GPU_TEMP": gpu.last_temperature_c,
                        "DCGM_FI_DEV_POWER_USAGE": gpu.last_power_w,
                        "gpuplatform_gpu_sample_age_seconds": round(
                            (now - gpu.last_sample_at).total_seconds(), 1
                        ),
                    }
                )
            for name, value in values.items():
                if value is not None:
                    lines[name].append(f"{name}{{{labels}}} {value}")
    out = []
    for name, (kind, help_text) in families.items():
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines[name]]
    out += [
        "# HELP gpuplatform_node_status 1 for the node's current status.",
        "# TYPE gpuplatform_node_status gauge",
        *node_lines,
    ]
    return "\n".join(out) + "\n"


# Sample ages in microseconds: ties in decimal on both sides of their double (0.15 is
# stored under it, 0.45 over it), exact ties (.25 and .75 go to even), a hair off a tie,
# samples from the future (clock skew: "-0.0" included), a month.
AGES_US = [
    0, 1, 49_999, 50_000, 50_001, 150_000, 250_000, 350_000, 450_000, 550_000, 650_000,
    750_000, 850_000, 950_000, 1_050_000, 12_350_000, 12_349_999, 2_500_000, 1_234_450_000,
    86_400_050_000, -40_000, -50_000, -250_000, -1_350_000, 2_592_000_000_000, 9_999_950_000,
]  # fmt: skip
POWERS = [300.0, 287.54, 1e-05, 0.1 + 0.2, float("nan"), float("inf"), -0.0, 1234567.0, None,
          123456789012345.0, 0.0001, 61.25, 99999.99]  # fmt: skip


def awkward_fleet() -> None:
    names = ['quote"node', "back\\slash", "new\nline", "plain-01", "unicode-ü-☃", "zz-empty"]
    statuses = ["active", "draining", "unreachable", "pending", "active", "active"]
    nodes = Node.objects.bulk_create(
        Node(name=name, address=f"10.77.0.{k + 1}", status=statuses[k], gate_status="passed")
        for k, name in enumerate(names)
    )
    gpus = []
    k = 0
    for node in nodes[:5]:
        for index in range(6):
            age = AGES_US[k % len(AGES_US)]
            mig = index == 5 and node.name == "plain-01"
            gpus.append(
                Gpu(
                    node=node,
                    uuid=f'GPU-{k}-"x"\\y\nz' if k % 4 == 0 else f"GPU-{k:04d}",
                    index=index,
                    model=['NVIDIA "H100"\n80GB', "NVIDIA A100\\SXM4", "NVIDIA L40S"][k % 3],
                    vram_total_mb=[81559, 40960, 46068][k % 3],
                    mig_capable=mig,
                    mig_enabled=mig,
                    mig_devices=[{"profile": "3g.20gb", "memory_total_mb": 19968}] if mig else [],
                    allocated_mb=[0, 4096, 8192][k % 3],
                    accepting_placements=k % 5 != 1,
                    last_memory_used_mb=None if k % 7 == 3 else [0, 100, 39000, 40960][k % 4],
                    last_utilization_gpu=None if k % 3 == 0 else k % 101,
                    last_utilization_memory=None if k % 4 == 1 else k % 37,
                    last_temperature_c=None if k % 6 == 2 else (k % 90) - 5,
                    last_power_w=POWERS[k % len(POWERS)],
                    last_sample_at=None if k % 11 == 10 else NOW - timedelta(microseconds=age),
                )
            )
            k += 1
    # a GPU that rediscovery no longer finds is not exported
    gpus.append(
        Gpu(node=nodes[3], uuid="GPU-gone", index=9, model="gone", vram_total_mb=1, present=False)
    )
    Gpu.objects.bulk_create(gpus)


def test_postgresql_writes_the_metrics_text_python_writes(settings):
    assert connection.vendor == "postgresql"
    awkward_fleet()
    # every sample age above lands on a GPU with a sample somewhere in the fleet
    assert Gpu.objects.filter(last_sample_at__isnull=False).count() >= len(AGES_US)
    expected = reference_metrics(NOW)
    assert selectors._metrics_text_python(now=NOW) == expected
    assert selectors._metrics_text_sql(now=NOW) == expected
    assert selectors.metrics_text(now=NOW) == expected
    # what the escaping and the rounding came to, in a few lines
    for line in (
        'gpuplatform_node_status{Hostname="quote\\"node",status="active"} 1',
        'gpuplatform_node_status{Hostname="back\\\\slash",status="draining"} 1',
        'gpuplatform_node_status{Hostname="new line",status="unreachable"} 1',
        'gpuplatform_node_status{Hostname="zz-empty",status="active"} 1',
        'modelName="NVIDIA \\"H100\\" 80GB"',
        'UUID="GPU-0-\\"x\\"\\\\y z"',
        "} nan",
        "} inf",
        "} -0.0",
        "} 1e-05",
        "} 0.30000000000000004",
        "} 300.0",
    ):
        assert line in expected, line
    ages = [
        line.rsplit(" ", 1)[1]
        for line in expected.splitlines()
        if line.startswith("gpuplatform_gpu_sample_age_seconds{")
    ]
    for age in ("0.1", "0.2", "0.3", "0.5", "0.8", "0.9", "12.3", "1234.5", "-0.0", "-1.4"):
        assert age in ages, age
    # rounding the decimal half up would write 0.4 for 0.35 and 1.0 for 0.95: Python
    # rounds the double, which lies under those ties
    assert "0.4" not in ages and "1.0" not in ages
    assert "GPU-gone" not in expected


def test_metrics_on_postgresql_is_one_query_that_writes_the_text(client, settings):
    settings.METRICS_TOKEN = "metrics-token"
    awkward_fleet()
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    (query,) = ctx.captured_queries
    assert "string_agg" in query["sql"]
    text = response.content.decode()
    assert text.startswith("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n")
    assert text.endswith('gpuplatform_node_status{Hostname="zz-empty",status="unreachable"} 0\n')
    assert text.count("\ngpuplatform_node_status{") == 6 * 4


def test_a_float_postgresql_would_write_differently_falls_back_to_python():
    awkward_fleet()
    # PostgreSQL writes this one as 2.2444778308710312e+16, Python as below: Python writes
    gpu = Gpu.objects.filter(last_sample_at__isnull=False).first()
    Gpu.objects.filter(pk=gpu.pk).update(last_power_w=2.244477830871031e16)
    assert selectors._metrics_text_sql(now=NOW) is None
    expected = reference_metrics(NOW)
    assert "} 2.244477830871031e+16\n" in expected
    assert selectors.metrics_text(now=NOW) == expected
