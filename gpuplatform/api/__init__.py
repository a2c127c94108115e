"""The REST API's shared parts: error format, pagination, throttling, strict serializers."""
