"""The synchronous storage engine: commit log, consume queues, offsets (no trio).

Not built yet: it is the subject of the storage-engine issue.
"""
