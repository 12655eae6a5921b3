# A small cluster in the layout of the Sia artifact's simulator_config.py (our own
# test fixture: two 4-GPU "aws" nodes and one 8-GPU "rtx" node).
cluster_ngpus_per_node = {"aws": 4, "dgx-ext": 8, "rtx": 8}
cluster_nnodes = {"aws": 16}          # overridden below: the last assignment wins
cluster_nnodes = {"aws": 2, "rtx": 1}
cluster_max_physical_nnodes = {"aws": 2, "dgx-ext": 2, "rtx": 1}

SLOWDOWNS = {"toy": 1.5, "big": 1.0}

sia_default_lambda_n = 1.1
sia_default_lambda_a = 0.01
sia_default_p_val = -0.5
sia_goodput_clip_val = 3000.0
sia_solver = "glpk"
