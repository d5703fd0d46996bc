"""The RocketMQ 5 gRPC front end (``apache.rocketmq.v2.MessagingService``) on trio.

See docs/design.md §11.
"""
