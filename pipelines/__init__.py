"""The deployable Prefect flows: the whole recipe run (recipe_flow), and the example's
retrain step (digits_retrain)."""
