"""The whole product on moto (`python -m localrun`), and the moto extensions the tests share.

Lambda runs a function with its asset's root on the import path: the local run puts the asset's source root,
``lambdas/``, there too, for the entry points (``handlers``, which the ``stallwatch`` distribution does not install).
"""

from __future__ import annotations

import sys
from pathlib import Path

LAMBDA_ASSET_ROOT = Path(__file__).resolve().parent.parent / "lambdas"
if str(LAMBDA_ASSET_ROOT) not in sys.path:
    sys.path.append(str(LAMBDA_ASSET_ROOT))
