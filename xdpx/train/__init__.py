"""Training: the loop (``trainer``), what a task computes (``objectives``), the side effects
(``callbacks``), and the parts the loop calls."""
