"""REST API of the incident ledger: incidents, watchdog thresholds and webhooks."""
