"""The tenants app's forms, by sub-domain: accounts, billing, slices and the estimate
(`fields`: what they share)."""
