"""The simulator: the round loop on a virtual clock (``SimExecutor`` advances jobs at the
oracle's true speed), its metrics and result files, its plots, and statistics over
several seeds. Imports ``engine.decide`` and ``engine.core``, never the live service."""
