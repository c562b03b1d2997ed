"""The training front end: loop, checkpoints and outputs of ``mpisparse train``."""
