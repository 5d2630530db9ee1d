"""Training: the loop (trainer), what a task computes (objectives), side effects (callbacks), and the parts the loop calls."""
