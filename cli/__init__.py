"""`gpp`, the platform's command-line client: every command is a call to the REST API
(/api/v1/) with an API token, never a database or Django import."""

__version__ = "0.1.0"
