"""The tenants app's pages, by sub-domain: accounts, billing, slices and the estimate."""
