"""The learner: logprob recomputation, losses, optimizer, weight publishing."""
