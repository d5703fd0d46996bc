"""Pop consumption: the in-flight table of popped messages and its durable journal."""
