"""The RocketMQ 5 gRPC front end (``apache.rocketmq.v2.MessagingService``) on trio: docs/design.md §11."""
