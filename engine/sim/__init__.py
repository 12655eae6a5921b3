"""The simulator: the round loop on a virtual clock (``SimExecutor`` advances jobs at the
oracle's true speed), its metrics and result files, its plots, and statistics over
several seeds. Runs the policy it is given: of the engine it imports ``engine.core`` (it
may import ``engine.decide``), never the live service."""
