"""`lambdactl`: the one CLI, and the composition root that wires the layers together."""
