"""gRPC over HTTP/2, sans-IO: the v2 message schema, gRPC message framing and statuses (docs/design.md §11)."""
