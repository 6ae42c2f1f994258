"""Training economics: scaling-law fits, training runs, and the lifetime optimum.

``scaling`` (loss fits and the compute optimum), ``runs`` (the time, chips and memory of one
training run), ``lifetime`` (pretraining + RL + inference, in FLOPs or dollars). The public names
are re-exported by ``dcost``.
"""
