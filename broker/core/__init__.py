"""The transport-neutral broker: services that both front ends (Remoting, gRPC) call with
neutral requests and results. No wire format and no front end is imported here
(import-linter checks it); errors are :class:`protocol.errors.BrokerError` with wire codes."""
