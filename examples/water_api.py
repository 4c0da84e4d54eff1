"""DF-MP2 on water from Python: all-electron and frozen-core, each summary printed."""

from pathlib import Path

import dfmp2

water = Path(__file__).resolve().parent.parent / "inputs" / "water.xyz"
for frozen_core in (False, True):
    result = dfmp2.run(water, basis="cc-pvdz", frozen_core=frozen_core)
    print(result.summary())
    print()
