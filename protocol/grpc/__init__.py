"""gRPC over HTTP/2, sans-IO: the v2 message schema, message framing and statuses.

See docs/design.md §11.
"""
