"""The accuracy guard: a generic search over the knobs quantizing stages declare.

It names no stage and no param field: a stage's `Stage.knobs` says what may move
(orchestrator/quant/knobs.py) and its `Stage.candidate` how a move changes its params. The
engine runs the trials the guard asks for (`accuracy_guard.GUARD`, handed to `run_plan`).
"""
