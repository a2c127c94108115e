"""Seed the four VRAM tiers (README, "Tiers", explains the defaults; ops edit them in admin)."""

from decimal import Decimal

from django.db import migrations

# name, VRAM GiB, CPU cores, host RAM GiB, process limit, price per hour (credits)
TIERS = [
    ("4 GB", 4, "2", 8, 1024, "0.20", "Notebooks, small-model inference, CI jobs."),
    ("8 GB", 8, "3", 16, 2048, "0.38", "7-8B models in 4-bit, LoRA on small models."),
    ("12 GB", 12, "4", 24, 2048, "0.55", "7-8B inference in 8-bit, QLoRA fine-tuning."),
    ("24 GB", 24, "8", 48, 4096, "1.00", "A whole 24 GB card: 8B in bf16, larger QLoRA."),
]


def seed(apps, schema_editor):
    Tier = apps.get_model("tenants", "Tier")
    for name, vram_gb, cores, ram_gb, pids, price, description in TIERS:
        Tier.objects.update_or_create(
            vram_mb=vram_gb * 1024,
            defaults={
                "name": name,
                "cpu_cores": Decimal(cores),
                "host_ram_mb": ram_gb * 1024,
                "pids_limit": pids,
                "price_per_hour": Decimal(price),
                "description": description,
                "is_active": True,
            },
        )


def unseed(apps, schema_editor):
    Tier = apps.get_model("tenants", "Tier")
    Tier.objects.filter(vram_mb__in=[t[1] * 1024 for t in TIERS], purchases__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
