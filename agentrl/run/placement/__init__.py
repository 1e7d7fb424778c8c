"""Placement of a run's parts: ``orchestrator.backend: ray`` puts the same classes in Ray
actors (sampler replicas, rollout workers that own their sandboxes, the learner).

- :mod:`~agentrl.run.placement.assemble`: :func:`assemble_on_ray`, what ``runtime.assemble``
  returns for ray.
- :mod:`~agentrl.run.placement.learner_process`: the learner in its own local process.
- :mod:`~agentrl.run.placement.cluster`: connecting, resource checks, placement groups.
- :mod:`~agentrl.run.placement.actors`: the thin actor shells.
- :mod:`~agentrl.run.placement.driver`: the driver's handles (learner, weight bus, engine).
- :mod:`~agentrl.run.placement.router`: least-outstanding-work routing with episode stickiness
  (knows nothing of Ray).

Ray is imported only when a Ray run starts.
"""
