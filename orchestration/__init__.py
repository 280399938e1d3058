"""Orchestration: what drives the layers below it and is driven by the user.

  planner/           the joint planner's search: outer choices -> bound -> heuristic incumbent ->
                     MILP with a cutoff -> stop at the gap (formulations/joint/, solvers/, simulator/)
  replan.py          re-planning after a cluster change: repair the running plan or plan again
  replay.py          replays an availability trace through the re-planner and the migration costs
  elastic.py         the elastic run: watches a local run, re-plans, migrates, resumes
  regroup.py         re-planning at rendezvous for launches compiled with --min-nodes
  worker.py          the executor entry point of such launches (the runtime with the re-planner)
  drivers/           the research formulations' build -> solve -> decode loops
  cli.py, *_cli.py   the `hetplan` command

Nothing below this package imports it: the data model (hetplan.instance, .plan, ...), estimators/,
formulations/, solvers/, simulator/ and runtime/ are used from here.
"""
