"""The tenants API's views, by sub-domain: accounts, billing, slices and estimates (`base`:
what they share)."""
