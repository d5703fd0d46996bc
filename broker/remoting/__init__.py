"""The Remoting front end: server, connections, dispatch and the processors that translate
Remoting headers and bodies to the transport-neutral core (``broker.core``) and back."""
