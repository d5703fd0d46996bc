"""The master epoch a broker holds (``<data-dir>/config/haEpoch``).

A master streams under its epoch; a replica remembers the newest epoch it has accepted and
refuses a stream from an older one (a deposed master that still streams). Nothing bumps the
epoch yet — promotion (manual or through etcd) will — so today every master streams under
epoch 1. The file is replaced atomically (temp file, fsync, rename), like the offsets file.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The epoch of a master that has never been promoted.
FIRST_EPOCH = 1


class EpochFile:
    """One integer, durable."""

    def __init__(self, path: Path, default: int) -> None:
        self.path = path
        try:
            self.current = int(path.read_text().strip())
        except FileNotFoundError:
            self.current = default
        except ValueError:
            raise ValueError(f"{path}: not an epoch number") from None

    def raise_to(self, epoch: int) -> None:
        """Remember ``epoch`` if it is newer (a small blocking write: epochs change rarely)."""
        if epoch <= self.current:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(f"{epoch}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.current = epoch
