"""torchrun for `launch --local --method torchrun`, killed with the launcher.

The launcher stops torchrun's agent by SIGKILL when it is itself stopped (subprocess.run on
SIGTERM / SIGINT), and a SIGKILL of the launcher stops nothing: the agent and its ranks trained on
(helper-11: 6 ranks still training 30 s after the launcher's exit 143). Here the agent dies with
the launcher (`die_with_parent`, PR_SET_PDEATHSIG), and each rank with the agent
(`execute.main` reads DIE_WITH_PARENT_ENV, which `local._run_torchrun` sets).
"""
import sys

from hetplan.runtime._forkserver import die_with_parent

if __name__ == "__main__":
    die_with_parent()
    from torch.distributed.run import main

    main(sys.argv[1:])
