"""The edge: an asyncio process beside the SSH gateway that carries what a browser needs
to reach a slice: the web terminal's WebSocket (an interactive exec into the container
over the node's SSH) and each declared port's own HTTPS address on the proxy domain,
relayed into the container's network namespace the way the gateway relays a stream (see
docs/edge.md)."""
