"""Engine entry point: `python -m distnb.rank.engine [ipengine arguments]`.

It imports torch before ipyparallel's engine starts, so the import (the slowest part of a rank's
start) runs while the controller is still coming up instead of after registration.
"""

from __future__ import annotations

import torch
import torch.distributed
from ipyparallel.engine.app import main

__all__ = ["main", "torch"]

if __name__ == "__main__":
    _ = torch.distributed.is_available()
    main()
