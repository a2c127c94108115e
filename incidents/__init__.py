"""Incidents: detection rules, the incident ledger, dispositions and notifications."""
