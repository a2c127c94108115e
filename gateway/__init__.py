"""The platform's SSH gateway: renters reach their own running slices' declared ports
through it (`ssh -J`, `ssh -L`), with no port open on any node (see docs/gateway.md)."""
