"""What the world looks like: GPU and model catalogs, cluster specs, jobs, traces,
importers, generators, the truth oracle and the named built-in instances."""
