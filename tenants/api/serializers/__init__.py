"""The tenants API's serializers, by sub-domain: accounts, billing and slices."""
