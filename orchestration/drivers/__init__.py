"""Drivers of the research formulations: each runs its formulation's build -> solve -> decode loop
through hetplan.solvers (the formulations themselves do not import the solver layer).

  cluster_partition.py  SPLIT and the exact min-cut MILP for every k (Zorse sec. 4.3.2)
  device_grouping.py    the exact device grouping over k (AutoHet eq. 3)
  opsched.py            operator scheduling, and re-scheduling after a bandwidth change (seed 004)
"""
