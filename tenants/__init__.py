"""Tenants: accounts, members, API tokens, tiers, purchases and credit, slices."""
