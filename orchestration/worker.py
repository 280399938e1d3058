"""Entry point of launches that re-plan at rendezvous (`hetplan compile --min-nodes`):

    torchrun ... -m hetplan.orchestration.worker --spec launch_spec.json --replan-file replan.json ...

the runtime's executor (`hetplan.runtime.execute`, same arguments) with the re-planner of
orchestration/regroup.py plugged in; the runtime does not import the planner itself.
"""
from __future__ import annotations

import sys

from hetplan.orchestration import regroup
from hetplan.runtime import execute


def main(argv: list[str] | None = None) -> int:
    execute.use_arranger(regroup.arrange)
    return execute.main(argv)


if __name__ == "__main__":
    sys.exit(main())
