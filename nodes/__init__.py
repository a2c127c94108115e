"""GPU nodes: inventory, VRAM allocations, telemetry samples, SSH transport and placement."""
