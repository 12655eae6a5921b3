"""How good the estimates are: accuracy against the Arena measured table
(``accuracy``), against real torch runs on this machine (``local_accuracy``), the
calibration of the efficiency constants (``calibrate``), the truth oracle's
leave-one-out evaluation (``oracle_loo``) and the fit of the online model's prior
(``online_prior``). Nothing outside tests, benches and the
engine's ``estimate`` command imports this package; the estimators themselves do not."""
